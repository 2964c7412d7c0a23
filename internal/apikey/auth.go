package apikey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/animal-store/petstore/internal/plan"
)

// KeyLookup finds a stored key by the SHA-256 of the key (see Hash). An
// error wrapping ErrUnknown means there is no such key; any other error
// means the store could not answer.
type KeyLookup interface {
	KeyByHash(ctx context.Context, hash string) (Record, error)
}

// Defaults of Options.
const (
	// DefaultCacheTTL bounds how long a database answer is reused, and so
	// how long a revoked key keeps working on a replica that had seen it.
	DefaultCacheTTL = 30 * time.Second
	// DefaultCacheSize bounds the cache (about 300 bytes an entry), so that
	// a flood of made-up keys cannot grow memory.
	DefaultCacheSize = 10000
	// DefaultLookupTimeout bounds one database lookup.
	DefaultLookupTimeout = 2 * time.Second
)

// Options configure an Authenticator.
type Options struct {
	// Plans is the initial plan set; nil means plan.Defaults().
	Plans *plan.Set
	// Keys are the initial static keys; nil means none.
	Keys *StaticKeys
	// Lookup finds keys that are not static; nil means static keys only.
	Lookup KeyLookup
	// CacheTTL is how long a database answer, found or not found, is
	// reused. Zero means DefaultCacheTTL; a negative value disables the
	// cache (every request not on a static key asks the database).
	CacheTTL time.Duration
	// CacheSize is the most answers kept; the least recently used goes
	// first. Zero means DefaultCacheSize.
	CacheSize int
	// LookupTimeout bounds one database lookup; zero means
	// DefaultLookupTimeout.
	LookupTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Authenticator resolves API keys to principals: first the static keys,
// then the database through a bounded cache in which concurrent misses for
// one key share a single lookup. Plans and static keys can be replaced at
// any time (Update); a principal's policy always comes from the current
// plans. It is safe for concurrent use.
type Authenticator struct {
	lookup  KeyLookup
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time

	cfg atomic.Pointer[config]

	mu       sync.Mutex
	cache    *lru
	inflight map[string]*call
}

// config is one consistent generation of plans and static keys.
type config struct {
	plans  *plan.Set
	keys   *StaticKeys
	static map[string]resolution
}

// resolution is a key's principal, or why it has none, under one plan set.
type resolution struct {
	plans     *plan.Set
	principal Principal
	err       error
}

// call is a database lookup in flight, shared by every request for its key.
type call struct {
	done   chan struct{}
	entry  *entry
	err    error
	joined int // requests waiting on it, for tests
}

// NewAuthenticator returns an authenticator; it fails if a static key does
// not fit the plans.
func NewAuthenticator(opts Options) (*Authenticator, error) {
	a := &Authenticator{
		lookup:   opts.Lookup,
		ttl:      opts.CacheTTL,
		timeout:  opts.LookupTimeout,
		now:      opts.Now,
		inflight: make(map[string]*call),
	}
	if a.ttl == 0 {
		a.ttl = DefaultCacheTTL
	}
	if a.timeout <= 0 {
		a.timeout = DefaultLookupTimeout
	}
	if a.now == nil {
		a.now = time.Now
	}
	size := opts.CacheSize
	if size <= 0 {
		size = DefaultCacheSize
	}
	a.cache = newLRU(size)
	plans := opts.Plans
	if plans == nil {
		plans = plan.Defaults()
	}
	if err := a.Update(plans, opts.Keys); err != nil {
		return nil, err
	}
	return a, nil
}

// Update replaces the plans and static keys at once. It fails, changing
// nothing, if a static key does not fit the plans.
func (a *Authenticator) Update(plans *plan.Set, keys *StaticKeys) error {
	if plans == nil {
		return errors.New("apikey: no plans")
	}
	c := &config{plans: plans, keys: keys, static: make(map[string]resolution, keys.Len())}
	for _, rec := range keys.Records() {
		if _, err := rec.Policy(plans); err != nil {
			return fmt.Errorf("apikey: static key %s: %w", rec.ID, err)
		}
		c.static[rec.Hash] = resolve(rec, plans)
	}
	a.cfg.Store(c)
	return nil
}

// Plans returns the current plans.
func (a *Authenticator) Plans() *plan.Set { return a.cfg.Load().plans }

// Keys returns the current static keys.
func (a *Authenticator) Keys() *StaticKeys { return a.cfg.Load().keys }

// Authenticate returns the principal of token, a bearer token. Errors wrap
// ErrMissing, ErrMalformed, ErrUnknown or ErrRevoked (401), ErrUnavailable
// (503: the database did not answer); any other error means the key's plan
// cannot be applied, a server-side misconfiguration (500).
//
// beforeLookup, when not nil, is called when (and only when) answering
// needs the database: the key is well formed but neither static nor
// cached. If it returns an error, Authenticate returns that error without
// asking the database or caching anything, so a caller can charge such
// requests to a throttle before they cost a query.
func (a *Authenticator) Authenticate(ctx context.Context, token string, beforeLookup func() error) (Principal, error) {
	if token == "" {
		return Principal{}, ErrMissing
	}
	if err := CheckFormat(token); err != nil {
		return Principal{}, err
	}
	var buf [hashLen]byte
	sum := appendHash(buf[:0], token)
	cfg := a.cfg.Load()
	if res, ok := cfg.static[string(sum)]; ok { // looked up without a string of its own
		return res.result()
	}
	hash := string(sum)
	if a.lookup == nil {
		return Principal{}, fmt.Errorf("%w %s", ErrUnknown, IDFromHash(hash))
	}
	e, err := a.fetch(ctx, hash, beforeLookup)
	if err != nil {
		return Principal{}, err
	}
	if !e.found {
		return Principal{}, fmt.Errorf("%w %s", ErrUnknown, IDFromHash(hash))
	}
	res := e.resolved.Load()
	if res == nil || res.plans != cfg.plans {
		r := resolve(e.rec, cfg.plans)
		res = &r
		e.resolved.Store(res)
	}
	return res.result()
}

func resolve(rec Record, plans *plan.Set) resolution {
	if rec.Revoked() {
		return resolution{plans: plans, err: fmt.Errorf("%w %s", ErrRevoked, rec.ID)}
	}
	pol, err := rec.Policy(plans)
	if err != nil {
		return resolution{plans: plans, err: fmt.Errorf("apikey: key %s: %w", rec.ID, err)}
	}
	return resolution{plans: plans, principal: Principal{KeyID: rec.ID, Label: rec.Label, Plan: pol.Name, Policy: pol}}
}

// result returns the principal with windows of its own, so that no caller
// can change another request's policy. Candidate windows are shared with
// the resolution (the limiter only reads them): copying them too would
// cost every request of a key with a candidate an allocation.
func (r resolution) result() (Principal, error) {
	if r.err != nil {
		return Principal{}, r.err
	}
	p := r.principal
	p.Policy.Windows = slices.Clone(p.Policy.Windows)
	return p, nil
}

// fetch returns the cache entry for hash, asking the database on a miss.
// Concurrent misses for one hash share one lookup, which runs apart from
// any single request: a caller that gives up does not fail the others.
func (a *Authenticator) fetch(ctx context.Context, hash string, beforeLookup func() error) (*entry, error) {
	a.mu.Lock()
	if e := a.cache.get(hash, a.now()); e != nil {
		a.mu.Unlock()
		return e, nil
	}
	if beforeLookup != nil {
		a.mu.Unlock()
		if err := beforeLookup(); err != nil {
			return nil, err
		}
		a.mu.Lock()
		// Another request may have loaded the key meanwhile.
		if e := a.cache.get(hash, a.now()); e != nil {
			a.mu.Unlock()
			return e, nil
		}
	}
	c, ok := a.inflight[hash]
	if !ok {
		c = &call{done: make(chan struct{})}
		a.inflight[hash] = c
		go a.load(context.WithoutCancel(ctx), hash, c)
	}
	c.joined++
	a.mu.Unlock()

	select {
	case <-c.done:
		return c.entry, c.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
}

// load asks the database and publishes the answer to the call's waiters
// and, unless the database failed, to the cache.
func (a *Authenticator) load(ctx context.Context, hash string, c *call) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	e := &entry{hash: hash}
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("apikey: key lookup panicked: %v", r)
			}
		}()
		e.rec, err = a.lookup.KeyByHash(ctx, hash)
	}()
	switch {
	case err == nil:
		e.found = true
		e.rec.Hash = hash
		if e.rec.ID == "" {
			e.rec.ID = IDFromHash(hash)
		}
	case errors.Is(err, ErrUnknown):
		e.rec = Record{}
	default:
		c.err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		if errors.Is(err, ErrUnavailable) {
			c.err = err
		}
	}

	a.mu.Lock()
	if c.err == nil {
		c.entry = e
		if a.ttl > 0 {
			e.expires = a.now().Add(a.ttl)
			a.cache.add(e)
		}
	}
	delete(a.inflight, hash)
	a.mu.Unlock()
	close(c.done)
}
