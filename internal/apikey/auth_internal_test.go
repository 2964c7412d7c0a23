package apikey

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedLookup blocks every lookup until released and counts them.
type gatedLookup struct {
	release chan struct{}
	calls   atomic.Int64
	err     error
}

func (g *gatedLookup) KeyByHash(ctx context.Context, hash string) (Record, error) {
	g.calls.Add(1)
	<-g.release
	if g.err != nil {
		return Record{}, g.err
	}
	return Record{Hash: hash, Plan: "free"}, nil
}

// waitJoined waits until n requests wait on the lookup for hash.
func waitJoined(t *testing.T, a *Authenticator, hash string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		c := a.inflight[hash]
		joined := 0
		if c != nil {
			joined = c.joined
		}
		a.mu.Unlock()
		if joined == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests joined the lookup, want %d", joined, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConcurrentMissesShareOneLookup(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"found", nil},
		{"unknown", ErrUnknown},
		{"database down", errors.New("connection refused")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key, err := Generate()
			if err != nil {
				t.Fatal(err)
			}
			g := &gatedLookup{release: make(chan struct{}), err: tt.err}
			a, err := NewAuthenticator(Options{Lookup: g})
			if err != nil {
				t.Fatal(err)
			}
			const n = 50
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					_, errs[i] = a.Authenticate(context.Background(), key, nil)
				})
			}
			waitJoined(t, a, Hash(key), n)
			close(g.release)
			wg.Wait()
			if c := g.calls.Load(); c != 1 {
				t.Fatalf("%d lookups for %d concurrent requests, want 1", c, n)
			}
			for i, err := range errs {
				if (tt.err == nil) != (err == nil) || (tt.err != nil && !errors.Is(err, ErrUnknown) && !errors.Is(err, ErrUnavailable)) {
					t.Fatalf("request %d: %v, want %v", i, err, tt.err)
				}
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if len(a.inflight) != 0 {
				t.Fatalf("%d lookups still recorded in flight", len(a.inflight))
			}
		})
	}
}

// A flood of distinct well-formed keys cannot grow the cache past its size.
func TestCacheStaysWithinItsSize(t *testing.T) {
	t.Parallel()
	g := &gatedLookup{release: make(chan struct{}), err: ErrUnknown}
	close(g.release)
	a, err := NewAuthenticator(Options{Lookup: g, CacheSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		key, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Authenticate(context.Background(), key, nil); !errors.Is(err, ErrUnknown) {
			t.Fatalf("Authenticate() = %v", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.cache.len(); n != 100 {
		t.Fatalf("cache holds %d entries, want its size, 100", n)
	}
	if len(a.cache.items) != a.cache.len() {
		t.Fatalf("cache index holds %d entries, list %d", len(a.cache.items), a.cache.len())
	}
}
