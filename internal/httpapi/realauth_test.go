package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// downLookup is a key database that cannot be reached.
type downLookup struct{}

func (downLookup) KeyByHash(context.Context, string) (apikey.Record, error) {
	return apikey.Record{}, errors.New("dial tcp 10.0.0.5:5432: connection refused")
}

// goneLookup is a key database that knows no keys.
type goneLookup struct{}

func (goneLookup) KeyByHash(_ context.Context, hash string) (apikey.Record, error) {
	return apikey.Record{}, fmt.Errorf("key %s: %w", hash[:8], apikey.ErrUnknown)
}

// TestWithRealAuthenticator checks that the apikey Authenticator's answers
// map to the documented responses.
func TestWithRealAuthenticator(t *testing.T) {
	t.Parallel()
	active, revoked, stranger := generateKey(t), generateKey(t), generateKey(t)
	keys, err := apikey.ParseKeys(fmt.Appendf(nil, "keys:\n  - {key: %s, plan: pro}\n  - {key: %s, plan: free, revoked: true}\n", active, revoked), plan.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	// Changing a checksum character leaves a key that fails its checksum.
	swap := map[bool]string{true: "B", false: "A"}[active[len(active)-1] == 'A']
	malformed := active[:len(active)-1] + swap
	tests := []struct {
		name   string
		lookup apikey.KeyLookup
		key    string
		status int
	}{
		{"static key", nil, active, http.StatusOK},
		{"revoked static key", nil, revoked, http.StatusUnauthorized},
		{"bad checksum", nil, malformed, http.StatusUnauthorized},
		{"unknown without a database", nil, stranger, http.StatusUnauthorized},
		{"unknown to the database", goneLookup{}, stranger, http.StatusUnauthorized},
		{"database down", downLookup{}, stranger, http.StatusServiceUnavailable},
		{"static key with the database down", downLookup{}, active, http.StatusOK},
	}
	for _, tt := range tests {
		auth, err := apikey.NewAuthenticator(apikey.Options{Keys: keys, Lookup: tt.lookup})
		if err != nil {
			t.Fatal(err)
		}
		ts := newTestServer(t, func(c *Config) { c.Auth = auth })
		resp := ts.get("/v1/pets", tt.key)
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, resp.body)
			continue
		}
		if tt.status == http.StatusOK {
			want := apikey.IDFromHash(apikey.Hash(tt.key))
			if calls := ts.limiter.Calls(); len(calls) != 1 || calls[0] != want {
				t.Errorf("%s: limiter keys %v, want [%s]", tt.name, calls, want)
			}
		}
		if strings.Contains(ts.logs.String(), tt.key) {
			t.Errorf("%s: the key was logged", tt.name)
		}
	}
}

func generateKey(t *testing.T) string {
	t.Helper()
	k, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// countingLookup is a key database that knows some keys and counts queries.
type countingLookup struct {
	known   map[string]bool // hashes
	queries atomic.Int64
}

func (c *countingLookup) KeyByHash(_ context.Context, hash string) (apikey.Record, error) {
	c.queries.Add(1)
	if c.known[hash] {
		return apikey.Record{Hash: hash, Label: "real", Plan: plan.Pro}, nil
	}
	return apikey.Record{}, fmt.Errorf("key %s: %w", hash[:8], apikey.ErrUnknown)
}

// TestThrottleBeforeKeyDatabase: an address out of throttle budget is
// turned away before its keys are looked up, so its made-up keys cost no
// query and never enter the key cache; keys that are found are never
// charged, so many real keys behind one address are not throttled.
func TestThrottleBeforeKeyDatabase(t *testing.T) {
	t.Parallel()
	real := make([]string, 5)
	db := &countingLookup{known: map[string]bool{}}
	for i := range real {
		real[i] = generateKey(t)
		db.known[apikey.Hash(real[i])] = true
	}
	auth, err := apikey.NewAuthenticator(apikey.Options{Lookup: db})
	if err != nil {
		t.Fatal(err)
	}
	throttle, err := ratelimit.NewThrottle(nil, ratelimit.ThrottleLimit{Rate: 1, Burst: 1, Period: time.Minute}, ratelimit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = throttle.Close() })
	ts := newTestServer(t, func(c *Config) { c.Auth, c.Throttle = auth, throttle })

	// Five real keys from one address, a throttle of 1 per minute: each
	// is looked up once and none is charged.
	for _, k := range real {
		for i := range 2 {
			if resp := ts.do(request{method: http.MethodGet, target: "/v1/pets", key: k}); resp.StatusCode != http.StatusOK {
				t.Fatalf("real key, request %d: %d %s", i, resp.StatusCode, resp.body)
			}
		}
	}
	if n := db.queries.Load(); n != 5 {
		t.Fatalf("%d queries for five real keys, want 5", n)
	}
	// Made-up keys: the first is looked up and refused (401), which spends
	// the address's budget; the other 199 are turned away with no query.
	made := make([]string, 200)
	for i := range made {
		made[i] = generateKey(t)
		resp := ts.do(request{method: http.MethodGet, target: "/v1/pets", key: made[i]})
		want := http.StatusTooManyRequests
		if i == 0 {
			want = http.StatusUnauthorized
		}
		if resp.StatusCode != want {
			t.Fatalf("made-up key %d: %d %s, want %d", i, resp.StatusCode, resp.body, want)
		}
	}
	if n := db.queries.Load(); n != 6 {
		t.Fatalf("200 made-up keys from one address cost %d queries, want 1 (then the address is throttled)", n-5)
	}
	// The turned-away keys did not enter the cache: from another address
	// one is looked up.
	resp := ts.do(request{method: http.MethodGet, target: "/v1/pets", key: made[1], remote: "198.51.100.7:999"})
	if resp.StatusCode != http.StatusUnauthorized || db.queries.Load() != 7 {
		t.Fatalf("made-up key from a fresh address: %d after %d queries, want 401 after 7", resp.StatusCode, db.queries.Load())
	}
	// Real keys still work from the throttled address (cached).
	if resp := ts.do(request{method: http.MethodGet, target: "/v1/pets", key: real[0]}); resp.StatusCode != http.StatusOK {
		t.Fatalf("real key after the flood: %d %s", resp.StatusCode, resp.body)
	}
	if got := metricValue(t, ts.metrics.authFailures.WithLabelValues("throttled")); got != 199 {
		t.Fatalf("auth_failures_total{reason=throttled} = %v, want 199", got)
	}
}
