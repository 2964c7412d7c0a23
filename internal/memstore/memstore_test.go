package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/internal/pet/pettest"
)

var _ pettest.Store = (*Store)(nil)

// clocked is a store whose clock the conformance suite can advance.
type clocked struct {
	*Store
	*pettest.Clock
}

func newClocked() clocked {
	clock := pettest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	return clocked{Store: New(WithClock(clock.Now)), Clock: clock}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pettest.Run(t, func(t *testing.T) pettest.Store { return newClocked() })
}

func TestConformanceRealClock(t *testing.T) {
	t.Parallel()
	pettest.Run(t, func(t *testing.T) pettest.Store { return New() })
}

func TestExpiredKeysAreForgotten(t *testing.T) {
	t.Parallel()
	s := newClocked()
	ctx := context.Background()
	np := pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusAvailable}
	for i := range 100 {
		ttl := time.Minute
		if i%2 == 1 {
			ttl = time.Hour
		}
		if _, _, err := s.Create(ctx, np, &pet.Idempotency{Key: fmt.Sprint("k", i), Fingerprint: "f", TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		advance  time.Duration
		wantKeys int
	}{
		{30 * time.Second, 100 + 1},
		{time.Minute, 50 + 1},
		{time.Hour, 0 + 1},
	}
	for _, tt := range tests {
		s.Advance(tt.advance)
		// Expired keys go on the next keyed create, which adds its own key.
		if _, _, err := s.Create(ctx, np, &pet.Idempotency{Key: fmt.Sprint("probe", tt.advance), Fingerprint: "f", TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		s.mu.RLock()
		keys, queued := len(s.keys), len(s.expiries)
		s.mu.RUnlock()
		if keys != tt.wantKeys || queued != tt.wantKeys {
			t.Errorf("after advancing %v: %d keys, %d queued expiries; want %d", tt.advance, keys, queued, tt.wantKeys)
		}
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	s := New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Create(ctx, pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusSold}, nil); err == nil {
		t.Error("Create with a canceled context succeeded")
	}
	if _, err := s.List(ctx, pet.ListQuery{Limit: 1}); err == nil {
		t.Error("List with a canceled context succeeded")
	}
	if err := s.Ping(ctx); err == nil {
		t.Error("Ping with a canceled context succeeded")
	}
}

// BenchmarkList shows that a page costs the same whatever the number of
// stored pets, with or without a status filter: compare pets=1000 with
// pets=1000000.
func BenchmarkList(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		s := New()
		ctx := context.Background()
		for i := range n {
			// Uneven shares: half available, a third sold, the rest pending.
			st := pet.StatusAvailable
			switch i % 6 {
			case 3, 4:
				st = pet.StatusSold
			case 5:
				st = pet.StatusPending
			}
			if _, _, err := s.Create(ctx, pet.NewPet{Name: "bench", CategoryID: 1, Status: st}, nil); err != nil {
				b.Fatal(err)
			}
		}
		for _, st := range append([]pet.Status{""}, pet.Statuses...) {
			name := string(st)
			if name == "" {
				name = "all"
			}
			b.Run(fmt.Sprintf("pets=%d/status=%s", n, name), func(b *testing.B) {
				// A page of 20 plus one to learn whether a next page exists,
				// starting half-way through the ids.
				q := pet.ListQuery{Status: st, After: int64(n / 2), Limit: 21}
				b.ReportAllocs()
				for b.Loop() {
					page, err := s.List(ctx, q)
					if err != nil || len(page) != 21 {
						b.Fatalf("List = %d pets, %v", len(page), err)
					}
				}
			})
		}
	}
}
