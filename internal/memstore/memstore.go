// Package memstore keeps pets in process memory. It is the default store: it
// needs nothing to run, and suits a single replica, development and tests.
// Nothing survives a restart and replicas do not share pets.
//
// Pets are never deleted and ids grow by one from 1, so the store keeps an
// id-ordered slice of every pet and one id-ordered slice of ids per status.
// A page is found by indexing (unfiltered) or a binary search (filtered),
// so listing costs O(log n + page) whatever the number of stored pets.
package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/animal-store/petstore/internal/pet"
)

// Store is an in-memory pet store, safe for concurrent use.
type Store struct {
	now func() time.Time

	mu sync.RWMutex
	// pets holds every pet in id order; pets[i].ID == i+1.
	pets []pet.Pet
	// byStatus holds, per status, the ids of the pets with that status in
	// ascending order.
	byStatus map[pet.Status][]int64
	// keys maps an idempotency key to what its first create made.
	keys map[string]idemEntry
	// expiries orders the keys by expiry so expired ones can be dropped
	// without scanning the map.
	expiries expiryHeap
}

type idemEntry struct {
	fingerprint string
	petID       int64
	expires     time.Time
}

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read the time from now, which decides when
// idempotency keys expire. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{
		now:      time.Now,
		byStatus: make(map[pet.Status][]int64, len(pet.Statuses)),
		keys:     make(map[string]idemEntry),
	}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// Create stores a new pet, assigning the next id. With idem set (and a
// positive TTL), a retry of the same request within idem.TTL returns the
// original pet with replayed true, and a reuse of the key for another
// request fails with pet.ErrIdempotencyConflict.
func (s *Store) Create(ctx context.Context, np pet.NewPet, idem *pet.Idempotency) (pet.Pet, bool, error) {
	if err := ctx.Err(); err != nil {
		return pet.Pet{}, false, fmt.Errorf("memstore: create pet: %w", err)
	}
	if idem != nil && idem.TTL <= 0 {
		// Remembered for no time at all: a plain create.
		idem = nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	var now time.Time
	if idem != nil {
		now = s.now()
		s.dropExpired(now)
		if e, ok := s.keys[idem.Key]; ok {
			if e.fingerprint != idem.Fingerprint {
				return pet.Pet{}, false, fmt.Errorf("memstore: create pet: %w", pet.ErrIdempotencyConflict)
			}
			return s.pets[e.petID-1], true, nil
		}
	}

	p := pet.Pet{ID: int64(len(s.pets)) + 1, Name: np.Name, CategoryID: np.CategoryID, Status: np.Status}
	s.pets = append(s.pets, p)
	s.byStatus[p.Status] = append(s.byStatus[p.Status], p.ID)
	if idem != nil {
		e := idemEntry{fingerprint: idem.Fingerprint, petID: p.ID, expires: now.Add(idem.TTL)}
		s.keys[idem.Key] = e
		heap.Push(&s.expiries, expiry{key: idem.Key, at: e.expires})
	}
	return p, false, nil
}

// dropExpired forgets every idempotency key whose TTL has run out by now.
// Each key is pushed and popped once, so the cost is amortised over the
// creates that made the keys.
func (s *Store) dropExpired(now time.Time) {
	for len(s.expiries) > 0 && !s.expiries[0].at.After(now) {
		x := heap.Pop(&s.expiries).(expiry)
		// The key may have been bound again since this expiry was queued.
		if e, ok := s.keys[x.key]; ok && e.expires.Equal(x.at) {
			delete(s.keys, x.key)
		}
	}
}

// Get returns the pet with the given id or an error wrapping pet.ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (pet.Pet, error) {
	if err := ctx.Err(); err != nil {
		return pet.Pet{}, fmt.Errorf("memstore: get pet %d: %w", id, err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if id < 1 || id > int64(len(s.pets)) {
		return pet.Pet{}, fmt.Errorf("memstore: get pet %d: %w", id, pet.ErrNotFound)
	}
	return s.pets[id-1], nil
}

// List returns at most q.Limit pets with ids above q.After, of q.Status if
// set, in ascending id order.
func (s *Store) List(ctx context.Context, q pet.ListQuery) ([]pet.Pet, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memstore: list pets: %w", err)
	}
	if q.Limit <= 0 {
		return []pet.Pet{}, nil
	}
	after := max(q.After, 0)

	s.mu.RLock()
	defer s.mu.RUnlock()

	if q.Status == "" {
		// ids are dense: the first pet after After sits at index After.
		start := min(after, int64(len(s.pets)))
		end := start + min(int64(q.Limit), int64(len(s.pets))-start)
		out := make([]pet.Pet, end-start)
		copy(out, s.pets[start:end])
		return out, nil
	}

	ids := s.byStatus[q.Status]
	start := sort.Search(len(ids), func(i int) bool { return ids[i] > after })
	n := min(q.Limit, len(ids)-start)
	out := make([]pet.Pet, n)
	for i, id := range ids[start : start+n] {
		out[i] = s.pets[id-1]
	}
	return out, nil
}

// Ping reports whether the store can serve; memory always can.
func (s *Store) Ping(ctx context.Context) error {
	return ctx.Err()
}

type expiry struct {
	key string
	at  time.Time
}

// expiryHeap is a min-heap of key expiries (container/heap).
type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	return x
}
