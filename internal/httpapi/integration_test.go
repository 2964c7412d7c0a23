package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// policyAuth authenticates keyFree with a chosen policy and refuses the rest.
type policyAuth struct{ policy ratelimit.Policy }

func (a policyAuth) Authenticate(ctx context.Context, token string, _ func() error) (apikey.Principal, error) {
	if token == keyFree {
		return apikey.Principal{KeyID: "key_free", Plan: a.policy.Name, Policy: a.policy}, nil
	}
	return testAuth{}.Authenticate(ctx, token, nil)
}

var tinyPolicy = ratelimit.Policy{
	Name:    "tiny",
	Windows: []ratelimit.Window{{Limit: 3, Period: time.Minute}, {Limit: 100, Period: time.Hour}},
	Ban:     ratelimit.BanPolicy{Threshold: 2, StrikeWindow: time.Minute, Base: 5 * time.Minute, Multiplier: 2, Max: time.Hour, Memory: 24 * time.Hour},
}

// newLimitedServer serves with the real limiter and throttle on client.
func newLimitedServer(t *testing.T, client redis.UniversalClient, opts ratelimit.Options) *testServer {
	t.Helper()
	opts.Prefix = "httpapi-test:" + randomHex(t) + ":"
	if opts.Timeout == 0 {
		opts.Timeout = time.Second // miniredis runs Lua slowly under -race
	}
	lim, err := ratelimit.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	thr, err := ratelimit.NewThrottle(client, ratelimit.ThrottleLimit{Rate: 2, Burst: 2, Period: time.Minute}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thr.Close() })
	return newTestServer(t, func(c *Config) {
		c.Auth = policyAuth{policy: tinyPolicy}
		c.Limiter = lim
		c.Throttle = thr
	})
}

func randomHex(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// checkLimiting walks one key through its minute window into a ban, and one
// address through its throttle.
func checkLimiting(t *testing.T, ts *testServer) {
	t.Helper()
	for i := range 3 {
		resp := ts.get("/v1/pets", keyFree)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, resp.body)
		}
		h := resp.Header
		if h.Get("X-RateLimit-Limit") != "3" || h.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) {
			t.Errorf("request %d: limit %s remaining %s", i+1, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"))
		}
		if got := h.Get("RateLimit-Policy"); got != `"1m";q=3;w=60, "1h";q=100;w=3600` {
			t.Errorf("RateLimit-Policy %q", got)
		}
	}
	limited := ts.get("/v1/pets", keyFree)
	if limited.StatusCode != http.StatusTooManyRequests || limited.errorBody(t).Code != codeRateLimited {
		t.Fatalf("4th request: %d %s", limited.StatusCode, limited.body)
	}
	if ra, _ := strconv.Atoi(limited.Header.Get("Retry-After")); ra < 1 || ra > 60 {
		t.Errorf("Retry-After %q", limited.Header.Get("Retry-After"))
	}
	// Going on while limited earns a ban (more than 2 refusals a minute).
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp := ts.get("/v1/pets", keyFree)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("while limited: %d", resp.StatusCode)
		}
		if resp.errorBody(t).Code == codeKeyBanned {
			if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 290 || ra > 300 {
				t.Errorf("ban Retry-After %q, want about 300", resp.Header.Get("Retry-After"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no ban after repeated refusals")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The throttle admits two unauthenticated requests from an address.
	for i, want := range []int{401, 401, 429} {
		if resp := ts.do(request{target: "/v1/pets", remote: "198.51.100.9:1"}); resp.StatusCode != want {
			t.Errorf("unauthenticated request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
}

func TestLimitingWithMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	checkLimiting(t, newLimitedServer(t, client, ratelimit.Options{}))
}

func TestLimitingWithRedis(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = client.Close() })
	checkLimiting(t, newLimitedServer(t, client, ratelimit.Options{}))
}

func TestFailClosedWithoutRedis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	ts := newLimitedServer(t, client, ratelimit.Options{FailureMode: ratelimit.FailClosed, Timeout: 2 * time.Second})
	if resp := ts.get("/v1/pets", keyFree); resp.StatusCode != http.StatusOK {
		t.Fatalf("with Redis: %d %s", resp.StatusCode, resp.body)
	}
	m.Close()
	for _, target := range []string{"/v1/pets", "/v1/pets/1"} {
		resp := ts.get(target, keyFree)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.errorBody(t).Code != codeUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s without Redis, fail closed: %d Retry-After %q %s", target, resp.StatusCode, resp.Header.Get("Retry-After"), resp.body)
		}
	}
}

// TestClientGoneDuringTheRateLimitDecision checks the same for a client
// gone before its key's decision is made, through the real limiter: a
// 499, no error logged, and nothing decided or counted for it.
func TestClientGoneDuringTheRateLimitDecision(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	reg := prometheus.NewRegistry()
	lim, err := ratelimit.New(client, ratelimit.Options{Timeout: time.Second, Registerer: reg, Prefix: "gone-test:" + randomHex(t) + ":"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	policy := ratelimit.Policy{Name: "gone", Windows: []ratelimit.Window{{Limit: 10, Period: time.Minute}}}
	ts := newTestServer(t, func(c *Config) {
		c.Auth = policyAuth{policy: policy}
		c.Limiter = lim
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httpRequest(http.MethodGet, "/v1/pets", "").WithContext(ctx)
	req.Header.Set("Authorization", "Bearer "+keyFree)
	ts.handler.ServeHTTP(newRecorderOnly(), req)
	if got := metricValue(t, ts.metrics.requests.WithLabelValues("/v1/pets", "GET", "499")); got != 1 {
		t.Errorf("requests{code=499} = %v", got)
	}
	for _, r := range ts.logs.records(t) {
		if r["level"] == "ERROR" || r["level"] == "WARN" {
			t.Errorf("a client gone during its decision logged as %v: %v", r["level"], r)
		}
	}
	for _, name := range []string{"petstore_ratelimit_decisions_total", "petstore_ratelimit_local_decisions_total"} {
		if n := testenv.CounterSum(t, reg, name, map[string]string{"plan": "gone"}); n != 0 {
			t.Errorf("%s = %v for a client gone before its decision", name, n)
		}
	}
	u, err := lim.Usage(context.Background(), "key_free", policy)
	if err != nil {
		t.Fatal(err)
	}
	if u.Windows[0].Used != 0 {
		t.Errorf("a client gone before its decision was counted in Redis: %+v", u)
	}
}
