// Package pettest is the conformance suite every pet store must pass. A
// store's tests call Run with a constructor returning a fresh, empty store;
// the suite then checks ids, listing, keyset paging, idempotent creates and
// behaviour under concurrency, so that the in-memory and the PostgreSQL
// stores are interchangeable behind the HTTP layer.
package pettest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/pet"
)

// Store is the contract the HTTP layer relies on.
type Store interface {
	Create(ctx context.Context, np pet.NewPet, idem *pet.Idempotency) (p pet.Pet, replayed bool, err error)
	Get(ctx context.Context, id int64) (pet.Pet, error)
	List(ctx context.Context, q pet.ListQuery) ([]pet.Pet, error)
	Ping(ctx context.Context) error
}

// Advancer is implemented by stores under test whose clock the suite can
// move forward (see Clock). For other stores the expiry test waits for a
// short TTL in real time.
type Advancer interface {
	Advance(d time.Duration)
}

// Run runs the conformance suite. newStore must return a new, empty store
// each time it is called; subtests run in parallel, each on its own store.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"CreateGetRoundTrip", testCreateGetRoundTrip},
		{"GetNotFound", testGetNotFound},
		{"IDsIncrease", testIDsIncrease},
		{"ListOrdering", testListOrdering},
		{"ListFilter", testListFilter},
		{"KeysetPaging", testKeysetPaging},
		{"LimitBoundaries", testLimitBoundaries},
		{"IdempotentReplay", testIdempotentReplay},
		{"IdempotencyConflict", testIdempotencyConflict},
		{"IdempotencyExpiry", testIdempotencyExpiry},
		{"IdempotencyWithoutTTL", testIdempotencyWithoutTTL},
		{"ConcurrentCreates", testConcurrentCreates},
		{"ConcurrentSameKey", testConcurrentSameKey},
		{"UnicodeNames", testUnicodeNames},
		{"Ping", testPing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// mix is a set of pets with every status, interleaved so that filtered
// lists skip ids.
func mix(n int) []pet.NewPet {
	statuses := []pet.Status{pet.StatusAvailable, pet.StatusPending, pet.StatusAvailable, pet.StatusSold, pet.StatusPending}
	out := make([]pet.NewPet, n)
	for i := range out {
		out[i] = pet.NewPet{
			Name:       fmt.Sprintf("pet-%03d", i),
			CategoryID: int64(i%4 + 1),
			Status:     statuses[i%len(statuses)],
		}
	}
	return out
}

func create(t *testing.T, s Store, np pet.NewPet) pet.Pet {
	t.Helper()
	p, replayed, err := s.Create(t.Context(), np, nil)
	if err != nil {
		t.Fatalf("Create(%+v): %v", np, err)
	}
	if replayed {
		t.Fatalf("Create(%+v) without idempotency key reported a replay", np)
	}
	return p
}

func createAll(t *testing.T, s Store, nps []pet.NewPet) []pet.Pet {
	t.Helper()
	out := make([]pet.Pet, len(nps))
	for i, np := range nps {
		out[i] = create(t, s, np)
	}
	return out
}

func list(t *testing.T, s Store, q pet.ListQuery) []pet.Pet {
	t.Helper()
	got, err := s.List(t.Context(), q)
	if err != nil {
		t.Fatalf("List(%+v): %v", q, err)
	}
	return got
}

// listAll returns every pet in the store, in id order.
func listAll(t *testing.T, s Store) []pet.Pet {
	t.Helper()
	return list(t, s, pet.ListQuery{Limit: 1 << 20})
}

func withStatus(ps []pet.Pet, st pet.Status) []pet.Pet {
	var out []pet.Pet
	for _, p := range ps {
		if st == "" || p.Status == st {
			out = append(out, p)
		}
	}
	return out
}

func samePets(t *testing.T, what string, got, want []pet.Pet) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

func testCreateGetRoundTrip(t *testing.T, s Store) {
	tests := []struct {
		name string
		np   pet.NewPet
	}{
		{"available", pet.NewPet{Name: "Rex", CategoryID: 1, Status: pet.StatusAvailable}},
		{"pending", pet.NewPet{Name: "Mia", CategoryID: 2, Status: pet.StatusPending}},
		{"sold", pet.NewPet{Name: "Old Tom", CategoryID: 3, Status: pet.StatusSold}},
		{"largest category", pet.NewPet{Name: "Big", CategoryID: 1<<63 - 1, Status: pet.StatusAvailable}},
		{"longest name", pet.NewPet{Name: strings.Repeat("n", pet.MaxNameLength), CategoryID: 7, Status: pet.StatusSold}},
		{"punctuation", pet.NewPet{Name: `O'Brien "the cat" \ 100% _x_`, CategoryID: 4, Status: pet.StatusPending}},
	}
	for _, tt := range tests {
		created := create(t, s, tt.np)
		want := pet.Pet{ID: created.ID, Name: tt.np.Name, CategoryID: tt.np.CategoryID, Status: tt.np.Status}
		if created != want {
			t.Errorf("%s: Create returned %+v, want %+v", tt.name, created, want)
		}
		got, err := s.Get(t.Context(), created.ID)
		if err != nil {
			t.Fatalf("%s: Get(%d): %v", tt.name, created.ID, err)
		}
		if got != want {
			t.Errorf("%s: Get(%d) = %+v, want %+v", tt.name, created.ID, got, want)
		}
	}
}

func testGetNotFound(t *testing.T, s Store) {
	p := create(t, s, pet.NewPet{Name: "Only", CategoryID: 1, Status: pet.StatusAvailable})
	for _, id := range []int64{-1, 0, p.ID + 1, p.ID + 1000, 1<<63 - 1} {
		got, err := s.Get(t.Context(), id)
		if !errors.Is(err, pet.ErrNotFound) {
			t.Errorf("Get(%d) = %+v, %v; want an error wrapping pet.ErrNotFound", id, got, err)
		}
	}
}

func testIDsIncrease(t *testing.T, s Store) {
	ps := createAll(t, s, mix(25))
	if ps[0].ID != 1 {
		t.Errorf("first id = %d, want 1", ps[0].ID)
	}
	for i := 1; i < len(ps); i++ {
		if ps[i].ID <= ps[i-1].ID {
			t.Fatalf("id %d assigned after id %d: ids must increase", ps[i].ID, ps[i-1].ID)
		}
	}
}

func testListOrdering(t *testing.T, s Store) {
	want := createAll(t, s, mix(30))
	samePets(t, "List of everything", listAll(t, s), want)
}

func testListFilter(t *testing.T, s Store) {
	all := createAll(t, s, mix(40))
	for _, st := range pet.Statuses {
		got := list(t, s, pet.ListQuery{Status: st, Limit: 1000})
		want := withStatus(all, st)
		if len(want) == 0 {
			t.Fatalf("fixture has no %s pets", st)
		}
		samePets(t, fmt.Sprintf("List(status=%s)", st), got, want)
	}
	// Pets of other statuses after the last sold one do not leak into the page.
	sold := withStatus(all, pet.StatusSold)
	create(t, s, pet.NewPet{Name: "late", CategoryID: 1, Status: pet.StatusAvailable})
	if got := list(t, s, pet.ListQuery{Status: pet.StatusSold, After: sold[len(sold)-1].ID, Limit: 10}); len(got) != 0 {
		t.Errorf("List(sold after the last sold pet) = %v, want empty", got)
	}
}

func testKeysetPaging(t *testing.T, s Store) {
	all := createAll(t, s, mix(53))
	statuses := append([]pet.Status{""}, pet.Statuses...)
	for _, st := range statuses {
		want := withStatus(all, st)
		for _, size := range []int{1, 2, 7, 10, len(want), len(want) + 1, 100} {
			var got []pet.Pet
			after := int64(0)
			for pages := 0; ; pages++ {
				if pages > len(want)+1 {
					t.Fatalf("status=%q size=%d: paging does not terminate", st, size)
				}
				page := list(t, s, pet.ListQuery{Status: st, After: after, Limit: size})
				if len(page) > size {
					t.Fatalf("status=%q size=%d: page of %d pets", st, size, len(page))
				}
				got = append(got, page...)
				if len(page) < size {
					break
				}
				after = page[len(page)-1].ID
			}
			samePets(t, fmt.Sprintf("pages of %d with status=%q", size, st), got, want)
		}
	}
}

func testLimitBoundaries(t *testing.T, s Store) {
	if got := list(t, s, pet.ListQuery{Limit: 20}); len(got) != 0 {
		t.Fatalf("List on an empty store = %v, want empty", got)
	}
	if got := list(t, s, pet.ListQuery{Status: pet.StatusSold, Limit: 20}); len(got) != 0 {
		t.Fatalf("List(sold) on an empty store = %v, want empty", got)
	}
	all := createAll(t, s, mix(12))
	last := all[len(all)-1].ID
	avail := withStatus(all, pet.StatusAvailable)
	tests := []struct {
		name string
		q    pet.ListQuery
		want []pet.Pet
	}{
		{"limit 1", pet.ListQuery{Limit: 1}, all[:1]},
		{"limit equals count", pet.ListQuery{Limit: len(all)}, all},
		{"limit above count", pet.ListQuery{Limit: len(all) + 1}, all},
		{"limit far above count", pet.ListQuery{Limit: 1 << 30}, all},
		{"negative after", pet.ListQuery{After: -5, Limit: 3}, all[:3]},
		{"after first", pet.ListQuery{After: all[0].ID, Limit: 2}, all[1:3]},
		{"after last but one", pet.ListQuery{After: all[len(all)-2].ID, Limit: 5}, all[len(all)-1:]},
		{"after last", pet.ListQuery{After: last, Limit: 5}, nil},
		{"after beyond last", pet.ListQuery{After: last + 100, Limit: 5}, nil},
		{"after largest id", pet.ListQuery{After: 1<<63 - 1, Limit: 5}, nil},
		{"filtered limit 1", pet.ListQuery{Status: pet.StatusAvailable, Limit: 1}, avail[:1]},
		{"filtered limit equals count", pet.ListQuery{Status: pet.StatusAvailable, Limit: len(avail)}, avail},
		{"filtered after last match", pet.ListQuery{Status: pet.StatusAvailable, After: avail[len(avail)-1].ID, Limit: 5}, nil},
		{"filtered after a non-matching id", pet.ListQuery{Status: pet.StatusAvailable, After: avail[0].ID + 1, Limit: 1}, avail[1:2]},
	}
	for _, tt := range tests {
		samePets(t, tt.name, list(t, s, tt.q), tt.want)
	}
}

func idem(key, fingerprint string) *pet.Idempotency {
	return &pet.Idempotency{Key: key, Fingerprint: fingerprint, TTL: time.Hour}
}

func testIdempotentReplay(t *testing.T, s Store) {
	ctx := t.Context()
	np := pet.NewPet{Name: "Once", CategoryID: 3, Status: pet.StatusPending}
	first, replayed, err := s.Create(ctx, np, idem("k1/abc", "fp-1"))
	if err != nil || replayed {
		t.Fatalf("first Create = %+v, %v, %v; want a new pet", first, replayed, err)
	}
	for i := range 3 {
		again, replayed, err := s.Create(ctx, np, idem("k1/abc", "fp-1"))
		if err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
		if !replayed || again != first {
			t.Fatalf("replay %d = %+v, replayed=%v; want %+v, replayed=true", i, again, replayed, first)
		}
	}
	// Other keys (another caller's scope, or none) create new pets.
	other, replayed, err := s.Create(ctx, np, idem("k2/abc", "fp-1"))
	if err != nil || replayed || other.ID == first.ID {
		t.Fatalf("Create under another key = %+v, %v, %v; want a new pet", other, replayed, err)
	}
	plain := create(t, s, np)
	samePets(t, "pets after replays", listAll(t, s), []pet.Pet{first, other, plain})
}

func testIdempotencyConflict(t *testing.T, s Store) {
	ctx := t.Context()
	first, _, err := s.Create(ctx, pet.NewPet{Name: "A", CategoryID: 1, Status: pet.StatusAvailable}, idem("k1/x", "fp-a"))
	if err != nil {
		t.Fatal(err)
	}
	got, replayed, err := s.Create(ctx, pet.NewPet{Name: "B", CategoryID: 1, Status: pet.StatusAvailable}, idem("k1/x", "fp-b"))
	if !errors.Is(err, pet.ErrIdempotencyConflict) {
		t.Fatalf("Create with a reused key and another fingerprint = %+v, %v, %v; want pet.ErrIdempotencyConflict", got, replayed, err)
	}
	// The conflict leaves the key bound to the first request.
	again, replayed, err := s.Create(ctx, pet.NewPet{Name: "A", CategoryID: 1, Status: pet.StatusAvailable}, idem("k1/x", "fp-a"))
	if err != nil || !replayed || again != first {
		t.Fatalf("replay after a conflict = %+v, %v, %v; want %+v replayed", again, replayed, err, first)
	}
	samePets(t, "pets after a conflict", listAll(t, s), []pet.Pet{first})
}

func testIdempotencyExpiry(t *testing.T, s Store) {
	ctx := t.Context()
	ttl := time.Minute
	wait := func(d time.Duration) { s.(Advancer).Advance(d) }
	if _, ok := s.(Advancer); !ok {
		// Real time: keep the TTL short so the test stays quick.
		ttl = 200 * time.Millisecond
		wait = time.Sleep
	}
	key := func(fp string) *pet.Idempotency { return &pet.Idempotency{Key: "k1/ttl", Fingerprint: fp, TTL: ttl} }
	np := pet.NewPet{Name: "Ephemeral", CategoryID: 1, Status: pet.StatusAvailable}

	first, _, err := s.Create(ctx, np, key("fp-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(Advancer); ok {
		// Within the TTL the key still replays.
		wait(ttl / 2)
		got, replayed, err := s.Create(ctx, np, key("fp-1"))
		if err != nil || !replayed || got != first {
			t.Fatalf("Create within the TTL = %+v, %v, %v; want a replay of %+v", got, replayed, err, first)
		}
		wait(ttl / 2)
	} else {
		wait(ttl + ttl/2)
	}
	// Once expired, the key is absent: the same request creates anew.
	second, replayed, err := s.Create(ctx, np, key("fp-1"))
	if err != nil || replayed || second.ID == first.ID {
		t.Fatalf("Create after expiry = %+v, %v, %v; want a new pet", second, replayed, err)
	}
	// ...and it is bound again, for a fresh TTL.
	got, replayed, err := s.Create(ctx, np, key("fp-1"))
	if err != nil || !replayed || got != second {
		t.Fatalf("Create after re-binding = %+v, %v, %v; want a replay of %+v", got, replayed, err, second)
	}
	wait(ttl + time.Millisecond)
	// An expired key is no conflict either.
	third, replayed, err := s.Create(ctx, np, key("fp-other"))
	if err != nil || replayed {
		t.Fatalf("Create with another fingerprint after expiry = %+v, %v, %v; want a new pet", third, replayed, err)
	}
	samePets(t, "pets after expiries", listAll(t, s), []pet.Pet{first, second, third})
}

// A key remembered for no time is never seen again: each create is new.
func testIdempotencyWithoutTTL(t *testing.T, s Store) {
	var want []pet.Pet
	for _, fp := range []string{"fp-1", "fp-1", "fp-2"} {
		p, replayed, err := s.Create(t.Context(), pet.NewPet{Name: "NoTTL", CategoryID: 1, Status: pet.StatusSold}, &pet.Idempotency{Key: "k1/none", Fingerprint: fp})
		if err != nil || replayed {
			t.Fatalf("Create with a zero TTL = %+v, %v, %v; want a new pet", p, replayed, err)
		}
		want = append(want, p)
	}
	samePets(t, "pets created with a zero TTL", listAll(t, s), want)
}

func testConcurrentCreates(t *testing.T, s Store) {
	const workers, each = 8, 25
	ctx := t.Context()
	var (
		mu  sync.Mutex
		ids = map[int64]pet.NewPet{}
		wg  sync.WaitGroup
	)
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				np := pet.NewPet{Name: fmt.Sprintf("w%d-%d", w, i), CategoryID: int64(w + 1), Status: pet.Statuses[i%3]}
				p, _, err := s.Create(ctx, np, nil)
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				if prev, dup := ids[p.ID]; dup {
					errs <- fmt.Errorf("id %d assigned to %+v and %+v", p.ID, prev, np)
				}
				ids[p.ID] = np
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	all := listAll(t, s)
	if len(all) != workers*each {
		t.Fatalf("List returned %d pets after %d creates", len(all), workers*each)
	}
	for _, p := range all {
		np, ok := ids[p.ID]
		if !ok || p.Name != np.Name || p.CategoryID != np.CategoryID || p.Status != np.Status {
			t.Fatalf("listed %+v, created %+v under that id", p, np)
		}
	}
}

func testConcurrentSameKey(t *testing.T, s Store) {
	const callers = 16
	ctx := t.Context()
	np := pet.NewPet{Name: "Racer", CategoryID: 9, Status: pet.StatusAvailable}
	type result struct {
		p        pet.Pet
		replayed bool
		err      error
	}
	results := make([]result, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			p, replayed, err := s.Create(ctx, np, idem("k1/race", "fp-race"))
			results[i] = result{p, replayed, err}
		})
	}
	close(start)
	wg.Wait()

	created := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if !r.replayed {
			created++
		}
		if r.p != results[0].p {
			t.Fatalf("caller %d got %+v, caller 0 got %+v", i, r.p, results[0].p)
		}
	}
	if created != 1 {
		t.Errorf("%d callers report a new pet, want exactly 1", created)
	}
	samePets(t, "pets after racing creates", listAll(t, s), []pet.Pet{results[0].p})
}

func testUnicodeNames(t *testing.T, s Store) {
	names := []string{
		"Zoë",
		"Ærøskøbing Måne",
		"日本語の名前",
		"Кот Василий",
		"שלום",
		"مرحبا",
		"🐈‍⬛ Shadow",
		"e\u0301 (decomposed)",
		"é (composed)",
		"𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
		"a\u200db",
		strings.Repeat("🐕", pet.MaxNameLength),
	}
	var want []pet.Pet
	for _, name := range names {
		want = append(want, create(t, s, pet.NewPet{Name: name, CategoryID: 1, Status: pet.StatusAvailable}))
	}
	for i, p := range want {
		if p.Name != names[i] {
			t.Errorf("Create returned name %q, want %q", p.Name, names[i])
		}
		got, err := s.Get(t.Context(), p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != names[i] {
			t.Errorf("Get returned name %q (% x), want %q (% x)", got.Name, got.Name, names[i], names[i])
		}
	}
	samePets(t, "List of unicode names", listAll(t, s), want)
}

func testPing(t *testing.T, s Store) {
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
