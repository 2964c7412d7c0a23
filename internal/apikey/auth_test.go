package apikey_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// fakeDB is a key database that counts its lookups.
type fakeDB struct {
	mu      sync.Mutex
	records map[string]apikey.Record
	err     error
	calls   int
}

func newFakeDB(recs ...apikey.Record) *fakeDB {
	db := &fakeDB{records: make(map[string]apikey.Record)}
	for _, r := range recs {
		db.records[r.Hash] = r
	}
	return db
}

func (db *fakeDB) KeyByHash(_ context.Context, hash string) (apikey.Record, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.calls++
	if db.err != nil {
		return apikey.Record{}, db.err
	}
	r, ok := db.records[hash]
	if !ok {
		return apikey.Record{}, fmt.Errorf("db: %w", apikey.ErrUnknown)
	}
	return r, nil
}

func (db *fakeDB) set(f func(db *fakeDB)) {
	db.mu.Lock()
	defer db.mu.Unlock()
	f(db)
}

func (db *fakeDB) lookups() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.calls
}

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newKey(t *testing.T) string {
	t.Helper()
	k, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func record(key, planName string, overrides ...ratelimit.Window) apikey.Record {
	h := apikey.Hash(key)
	return apikey.Record{ID: apikey.IDFromHash(h), Hash: h, Label: "test", Plan: planName, Overrides: overrides}
}

func staticKeys(t *testing.T) *apikey.StaticKeys { return staticKeysB(t) }

func staticKeysB(tb testing.TB) *apikey.StaticKeys {
	tb.Helper()
	k, err := apikey.LoadKeys(filepath.Join("testdata", "keys.yaml"), plan.Defaults())
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func newAuth(t *testing.T, opts apikey.Options) *apikey.Authenticator {
	t.Helper()
	a, err := apikey.NewAuthenticator(opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	dbKey, dbRevoked := newKey(t), newKey(t)
	revoked := record(dbRevoked, "free")
	revoked.RevokedAt = &time.Time{}
	withCandidate := record(dbKey, "PRO", ratelimit.Window{Limit: 10, Period: time.Second})
	withCandidate.Candidate = []ratelimit.Window{{Limit: 9000, Period: 24 * time.Hour}, {Limit: 200, Period: time.Minute}}
	db := newFakeDB(withCandidate, revoked,
		// The static file wins over the database.
		record(revokedKey, "business"))
	a := newAuth(t, apikey.Options{Keys: staticKeys(t), Lookup: db})

	tests := []struct {
		name      string
		token     string
		err       error
		plan      string
		windows   []ratelimit.Window
		candidate []ratelimit.Window
	}{
		{name: "static key", token: devKey, plan: "free",
			windows: []ratelimit.Window{{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}},
		{name: "static key with its own quotas and candidate", token: acmeKey, plan: "enterprise",
			windows:   []ratelimit.Window{{Limit: 5000, Period: time.Minute}, {Limit: 2000000, Period: 24 * time.Hour}},
			candidate: []ratelimit.Window{{Limit: 4000, Period: time.Minute}}},
		{name: "static key revoked", token: revokedKey, err: apikey.ErrRevoked},
		{name: "database key", token: dbKey, plan: "pro",
			windows:   []ratelimit.Window{{Limit: 10, Period: time.Second}, {Limit: 300, Period: time.Minute}, {Limit: 10000, Period: 24 * time.Hour}},
			candidate: []ratelimit.Window{{Limit: 200, Period: time.Minute}, {Limit: 9000, Period: 24 * time.Hour}}},
		{name: "database key revoked", token: dbRevoked, err: apikey.ErrRevoked},
		{name: "unknown key", token: otherKey, err: apikey.ErrUnknown},
		{name: "no key", token: "", err: apikey.ErrMissing},
		{name: "malformed key", token: "pst_nope", err: apikey.ErrMalformed},
		{name: "mistyped key", token: devKey[:20] + "x" + devKey[21:], err: apikey.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := a.Authenticate(context.Background(), tt.token, nil)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Authenticate() = %+v, %v; want %v", p, err, tt.err)
				}
				if tt.token != "" && strings.Contains(err.Error(), tt.token) {
					t.Errorf("the error quotes the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Authenticate(): %v", err)
			}
			if want := apikey.IDFromHash(apikey.Hash(tt.token)); p.KeyID != want {
				t.Errorf("KeyID = %q, want %q", p.KeyID, want)
			}
			if p.Plan != tt.plan || p.Policy.Name != tt.plan || !reflect.DeepEqual(p.Policy.Windows, tt.windows) ||
				!reflect.DeepEqual(p.Policy.Candidate, tt.candidate) {
				t.Errorf("principal = %+v, want plan %s with windows %v and candidate %v", p, tt.plan, tt.windows, tt.candidate)
			}
			if strings.Contains(fmt.Sprintf("%#v", p), tt.token) {
				t.Errorf("the principal carries the key: %#v", p)
			}
		})
	}
}

// A key's candidate is merged over its plan's as the plans stand: a plans
// reload that gives the plan a candidate, or changes it, reaches static and
// cached keys alike without a new lookup.
func TestCandidateFollowsThePlans(t *testing.T) {
	t.Parallel()
	dbKey := newKey(t)
	rec := record(dbKey, "pro")
	rec.Candidate = []ratelimit.Window{{Limit: 100, Period: time.Minute}}
	db := newFakeDB(rec)
	keys, err := apikey.ParseKeys([]byte("keys:\n  - {key: "+devKey+", plan: pro, candidate: {quotas: [{limit: 50, period: 1m}]}}\n"), plan.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, apikey.Options{Keys: keys, Lookup: db})
	candidate := func(token string) []ratelimit.Window {
		t.Helper()
		p, err := a.Authenticate(context.Background(), token, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p.Policy.Candidate
	}
	minute := func(limit int64) ratelimit.Window { return ratelimit.Window{Limit: limit, Period: time.Minute} }
	day := func(limit int64) ratelimit.Window { return ratelimit.Window{Limit: limit, Period: 24 * time.Hour} }
	if got := candidate(devKey); !reflect.DeepEqual(got, []ratelimit.Window{minute(50)}) {
		t.Errorf("static key, pro without a candidate: %v", got)
	}
	if got := candidate(dbKey); !reflect.DeepEqual(got, []ratelimit.Window{minute(100)}) {
		t.Errorf("database key, pro without a candidate: %v", got)
	}

	plans, err := plan.Parse([]byte("plans: {pro: {candidate: {quotas: [{limit: 250, period: 1m}, {limit: 8000, period: 24h}]}}}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Update(plans, keys); err != nil {
		t.Fatal(err)
	}
	if got := candidate(devKey); !reflect.DeepEqual(got, []ratelimit.Window{minute(50), day(8000)}) {
		t.Errorf("static key, pro with a candidate: %v", got)
	}
	if got := candidate(dbKey); !reflect.DeepEqual(got, []ratelimit.Window{minute(100), day(8000)}) {
		t.Errorf("database key, pro with a candidate: %v", got)
	}
	if n := db.lookups(); n != 1 {
		t.Errorf("%d lookups, want 1: a plans reload needs none", n)
	}
}

func TestMalformedKeysCostNoLookup(t *testing.T) {
	t.Parallel()
	db := newFakeDB()
	a := newAuth(t, apikey.Options{Lookup: db})
	for _, token := range []string{"x", "pst_" + strings.Repeat("a", 38), "Bearer " + devKey} {
		if _, err := a.Authenticate(context.Background(), token, nil); !errors.Is(err, apikey.ErrMalformed) {
			t.Errorf("Authenticate(%q) = %v, want ErrMalformed", token, err)
		}
	}
	if n := db.lookups(); n != 0 {
		t.Fatalf("%d database lookups for malformed keys, want 0", n)
	}
}

func TestCache(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	key, missing := newKey(t), newKey(t)
	tests := []struct {
		name string
		// steps run in order; each authenticates after advancing the clock
		// and may change the database first.
		steps []step
	}{
		{"found: reused until the TTL", []step{
			{token: key, lookups: 1},
			{advance: ttl - time.Second, token: key, lookups: 1},
			{advance: time.Second, token: key, lookups: 2},
			{token: key, lookups: 2},
		}},
		{"not found: reused until the TTL", []step{
			{token: missing, err: apikey.ErrUnknown, lookups: 1},
			{advance: ttl - time.Nanosecond, token: missing, err: apikey.ErrUnknown, lookups: 1},
			{advance: time.Nanosecond, token: missing, err: apikey.ErrUnknown, lookups: 2},
		}},
		{"a key created after a miss works after the TTL", []step{
			{token: missing, err: apikey.ErrUnknown, lookups: 1},
			{change: func(db *fakeDB) { db.records[apikey.Hash(missing)] = record(missing, "free") },
				advance: time.Second, token: missing, err: apikey.ErrUnknown, lookups: 1},
			{advance: ttl, token: missing, lookups: 2},
		}},
		{"revocation takes effect after the TTL", []step{
			{token: key, lookups: 1},
			{change: func(db *fakeDB) {
				r := db.records[apikey.Hash(key)]
				r.RevokedAt = &time.Time{}
				db.records[r.Hash] = r
			}, advance: ttl - time.Second, token: key, lookups: 1},
			{advance: time.Second, token: key, err: apikey.ErrRevoked, lookups: 2},
			{token: key, err: apikey.ErrRevoked, lookups: 2},
		}},
		{"a database error is not cached", []step{
			{change: func(db *fakeDB) { db.err = errors.New("connection refused") }, token: key, err: apikey.ErrUnavailable, lookups: 1},
			{token: key, err: apikey.ErrUnavailable, lookups: 2},
			{change: func(db *fakeDB) { db.err = nil }, token: key, lookups: 3},
			{token: key, lookups: 3},
		}},
		{"a database error does not evict a cached answer", []step{
			{token: key, lookups: 1},
			{change: func(db *fakeDB) { db.err = errors.New("connection refused") }, token: key, lookups: 1},
			{advance: ttl, token: key, err: apikey.ErrUnavailable, lookups: 2},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := newFakeDB(record(key, "free"))
			clk := newClock()
			a := newAuth(t, apikey.Options{Lookup: db, CacheTTL: ttl, Now: clk.Now})
			for i, s := range tt.steps {
				if s.change != nil {
					db.set(s.change)
				}
				clk.Advance(s.advance)
				_, err := a.Authenticate(context.Background(), s.token, nil)
				if (s.err == nil) != (err == nil) || !errors.Is(err, s.err) {
					t.Fatalf("step %d: Authenticate() error = %v, want %v", i, err, s.err)
				}
				if n := db.lookups(); n != s.lookups {
					t.Fatalf("step %d: %d lookups so far, want %d", i, n, s.lookups)
				}
			}
		})
	}
}

type step struct {
	change  func(*fakeDB)
	advance time.Duration
	token   string
	err     error
	lookups int
}

func TestCacheDisabled(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	db := newFakeDB(record(key, "free"))
	a := newAuth(t, apikey.Options{Lookup: db, CacheTTL: -1})
	for i := 1; i <= 3; i++ {
		if _, err := a.Authenticate(context.Background(), key, nil); err != nil {
			t.Fatal(err)
		}
		if n := db.lookups(); n != i {
			t.Fatalf("%d lookups after %d requests, want one each", n, i)
		}
	}
}

func TestCacheSizeBound(t *testing.T) {
	t.Parallel()
	keys := []string{newKey(t), newKey(t), newKey(t)}
	db := newFakeDB(record(keys[0], "free"), record(keys[1], "free"))
	a := newAuth(t, apikey.Options{Lookup: db, CacheSize: 2})
	auth := func(k string) { _, _ = a.Authenticate(context.Background(), k, nil) }
	auth(keys[0])
	auth(keys[1])
	auth(keys[0]) // keys[0] is now the most recently used
	auth(keys[2]) // an unknown key: evicts keys[1]
	if n := db.lookups(); n != 3 {
		t.Fatalf("%d lookups, want 3", n)
	}
	auth(keys[0])
	auth(keys[2])
	if n := db.lookups(); n != 3 {
		t.Fatalf("%d lookups after using the two cached keys, want still 3", n)
	}
	auth(keys[1])
	if n := db.lookups(); n != 4 {
		t.Fatalf("%d lookups after using the evicted key, want 4", n)
	}
}

func TestPlansChangeWithoutRestart(t *testing.T) {
	t.Parallel()
	dbKey := newKey(t)
	db := newFakeDB(record(dbKey, "pro"))
	a := newAuth(t, apikey.Options{Keys: staticKeys(t), Lookup: db})
	ctx := context.Background()
	if p, err := a.Authenticate(ctx, dbKey, nil); err != nil || p.Policy.Windows[0].Limit != 300 {
		t.Fatalf("before: %+v, %v", p, err)
	}
	plans, err := plan.Parse([]byte("plans: {pro: {quotas: [{limit: 5, period: 1s}]}, free: {ban: off}}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Update(plans, a.Keys()); err != nil {
		t.Fatal(err)
	}
	p, err := a.Authenticate(ctx, dbKey, nil)
	if err != nil || !reflect.DeepEqual(p.Policy.Windows, []ratelimit.Window{{Limit: 5, Period: time.Second}}) {
		t.Fatalf("cached database key after the change: %+v, %v", p, err)
	}
	if n := db.lookups(); n != 1 {
		t.Fatalf("%d lookups, want 1: a plan change needs no database round trip", n)
	}
	if p, err := a.Authenticate(ctx, devKey, nil); err != nil || p.Policy.Ban.Enabled() {
		t.Fatalf("static key after the change: %+v, %v", p, err)
	}
	if a.Plans() != plans {
		t.Fatal("Plans() is not the set in force")
	}
}

func TestUpdateRejectsKeysThatDoNotFit(t *testing.T) {
	t.Parallel()
	a := newAuth(t, apikey.Options{Keys: staticKeys(t)})
	noFree, err := plan.Parse([]byte("plans: {free: {remove: true}}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Update(noFree, a.Keys()); err == nil {
		t.Fatal("Update accepted a key on a removed plan")
	}
	if _, err := a.Authenticate(context.Background(), devKey, nil); err != nil {
		t.Fatalf("the previous configuration was lost: %v", err)
	}
	if _, err := apikey.NewAuthenticator(apikey.Options{Plans: noFree, Keys: staticKeys(t)}); err == nil {
		t.Fatal("NewAuthenticator accepted a key on a missing plan")
	}
}

func TestDatabaseKeyOnMissingPlan(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	a := newAuth(t, apikey.Options{Lookup: newFakeDB(record(key, "gold"))})
	_, err := a.Authenticate(context.Background(), key, nil)
	if err == nil || apikey.Reason(err) != "error" || !errors.Is(err, plan.ErrUnknownPlan) {
		t.Fatalf("Authenticate() = %v, want a server-side error about the plan", err)
	}
}

func TestPrincipalsDoNotShareWindows(t *testing.T) {
	t.Parallel()
	a := newAuth(t, apikey.Options{Keys: staticKeys(t)})
	p, err := a.Authenticate(context.Background(), devKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Policy.Windows[0].Limit = 1
	if q, _ := a.Authenticate(context.Background(), devKey, nil); q.Policy.Windows[0].Limit != 60 {
		t.Fatalf("changing one principal's policy changed the next: %v", q.Policy.Windows)
	}
}

// blockingDB answers only when released, and honours its context.
type blockingDB struct {
	release chan struct{}
	record  apikey.Record
	mu      sync.Mutex
	calls   int
}

func (db *blockingDB) KeyByHash(ctx context.Context, _ string) (apikey.Record, error) {
	db.mu.Lock()
	db.calls++
	db.mu.Unlock()
	select {
	case <-db.release:
		return db.record, nil
	case <-ctx.Done():
		return apikey.Record{}, ctx.Err()
	}
}

func TestCallerGivingUpDoesNotFailOthers(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	db := &blockingDB{release: make(chan struct{}), record: record(key, "free")}
	a := newAuth(t, apikey.Options{Lookup: db})

	ctx, cancel := context.WithCancel(context.Background())
	impatient := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(ctx, key, nil)
		impatient <- err
	}()
	cancel()
	if err := <-impatient; !errors.Is(err, apikey.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller got %v, want ErrUnavailable wrapping context.Canceled", err)
	}
	patient := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(context.Background(), key, nil)
		patient <- err
	}()
	close(db.release)
	if err := <-patient; err != nil {
		t.Fatalf("patient caller: %v", err)
	}
}

func TestLookupTimeout(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	db := &blockingDB{release: make(chan struct{}), record: record(key, "free")}
	a := newAuth(t, apikey.Options{Lookup: db, LookupTimeout: 10 * time.Millisecond})
	_, err := a.Authenticate(context.Background(), key, nil)
	if !errors.Is(err, apikey.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Authenticate() = %v, want ErrUnavailable wrapping the deadline", err)
	}
}
