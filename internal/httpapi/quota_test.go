package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// quotaPlans adds to the built-in plans one that bans quickly and one in
// shadow mode.
const quotaPlans = `plans:
  tiny:
    quotas: [{limit: 3, period: 1m}, {limit: 100, period: 1h}]
    ban: {threshold: 2, within: 1m, duration: 5m, multiplier: 2, max: 1h, memory: 24h}
  trial: {mode: shadow, quotas: [{limit: 20, period: 1m}]}
  growth:
    quotas: [{limit: 10, period: 1m}]
    ban: off
    candidate: {quotas: [{limit: 3, period: 1m}], ban: {threshold: 1, within: 1m, duration: 5m}}
`

// quotaFixture serves the real router with the real authenticator (static
// keys resolved through the plans, per-key quotas included), the real
// limiter and the operation's real throttle. On a miniredis (mini) the
// clock stands still at now, the server's clock too, so that every figure
// is exact.
type quotaFixture struct {
	*testServer
	mini *miniredis.Miniredis
	now  time.Time
	// keys by name: free, override (pro with its own 1m and 1h quotas,
	// the 1m replacing pro's), tiny, shadow.
	keys map[string]string
}

// newQuotaFixture builds the fixture; opts may set the failure mode and
// the Redis timeout.
func newQuotaFixture(t *testing.T, opts ratelimit.Options, more ...serverOption) *quotaFixture {
	t.Helper()
	f := &quotaFixture{mini: miniredis.RunT(t)}
	// A quarter second past the start of a bucket of every window used
	// here (day buckets are 432 s, hour 18 s, minute 300 ms): figures do
	// not depend on when the test runs, and rounding up shows.
	f.now = time.Unix(time.Now().Unix()/432*432, 250_000_000)
	f.mini.SetTime(f.now)
	client := redis.NewClient(&redis.Options{Addr: f.mini.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	f.start(t, client, opts, func() time.Time { return f.now }, more...)
	return f
}

// start serves the fixture's keys with a limiter and throttle on client;
// clock is the server's (time.Now when nil).
func (f *quotaFixture) start(t *testing.T, client redis.UniversalClient, opts ratelimit.Options, clock func() time.Time, more ...serverOption) {
	t.Helper()
	f.keys = map[string]string{}
	plans, err := plan.Parse([]byte(quotaPlans))
	if err != nil {
		t.Fatal(err)
	}
	var keysFile strings.Builder
	keysFile.WriteString("keys:\n")
	for _, k := range []struct{ name, spec string }{
		{"free", "plan: free"},
		{"override", "plan: pro, quotas: [{limit: 5, period: 1m}, {limit: 4, period: 1h}]"},
		{"tiny", "plan: tiny"},
		{"shadow", "plan: trial"},
		{"candidate", "plan: growth"},
	} {
		f.keys[k.name] = generateKey(t)
		fmt.Fprintf(&keysFile, "  - {key: %s, %s}\n", f.keys[k.name], k.spec)
	}
	keys, err := apikey.ParseKeys([]byte(keysFile.String()), plans)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := apikey.NewAuthenticator(apikey.Options{Plans: plans, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	// One round trip per request (no leases), so that counts are exact.
	opts.Prefix, opts.MaxLease = "httpapi-test:"+randomHex(t)+":", 1
	if opts.Timeout == 0 {
		opts.Timeout = time.Second // miniredis runs Lua slowly under -race
	}
	lim, err := ratelimit.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	thr, err := ratelimit.NewNamedThrottle(client, "rate_limit", UsageThrottleLimit(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thr.Close() })
	f.testServer = newTestServer(t, append([]serverOption{func(c *Config) {
		c.Auth = auth
		c.Limiter = lim
		c.Usage = lim
		c.UsageThrottle = thr
		c.now = clock
	}}, more...)...)
}

// quota asks GET /v1/rate_limit with the named key and decodes a 200.
func (f *quotaFixture) quota(t *testing.T, name string) (rateLimitBody, *response) {
	t.Helper()
	resp := f.get("/v1/rate_limit", f.keys[name])
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/rate_limit (%s): %d %s", name, resp.StatusCode, resp.body)
	}
	var b rateLimitBody
	decodeJSON(t, resp.body, &b)
	return b, resp
}

// pets sends n GET /v1/pets with the named key, each expected to be
// answered want, and returns the last response.
func (f *quotaFixture) pets(t *testing.T, name string, n, want int) *response {
	t.Helper()
	var resp *response
	for i := range n {
		resp = f.get("/v1/pets", f.keys[name])
		if resp.StatusCode != want {
			t.Fatalf("GET /v1/pets (%s) %d of %d: %d %s, want %d", name, i+1, n, resp.StatusCode, resp.body, want)
		}
	}
	return resp
}

// unix is f.now plus d in Unix seconds, rounded up.
func (f *quotaFixture) unix(d time.Duration) int64 { return ceilUnix(f.now.Add(d)) }

// rateLimitFields are the rate-limit fields a response carries, by
// canonical name; absent ones are missing.
func rateLimitFields(h http.Header) map[string]string {
	out := map[string]string{}
	for _, name := range exactSpellings {
		if v := h.Get(name); v != "" {
			out[name] = v
		}
	}
	return out
}

func TestRateLimitReportsQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		key   string
		setup func(t *testing.T, f *quotaFixture)
		want  func(f *quotaFixture) rateLimitBody
		// fields are the response's rate-limit fields, exactly.
		fields func(f *quotaFixture) map[string]string
	}{
		{
			name: "fresh key",
			key:  "free",
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "free", Mode: "enforce", Windows: []rateLimitWindow{
					{Period: "1m", Limit: 60, Used: 0, Remaining: 60, Reset: f.unix(0)},
					{Period: "24h", Limit: 1000, Used: 0, Remaining: 1000, Reset: f.unix(0)},
				}}
			},
			fields: func(f *quotaFixture) map[string]string {
				return map[string]string{
					"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "60", "X-RateLimit-Reset": itoa(f.unix(0)),
					"RateLimit": `"1m";r=60;t=0`, "RateLimit-Policy": `"1m";q=60;w=60, "24h";q=1000;w=86400`,
				}
			},
		},
		{
			name:  "after some requests",
			key:   "free",
			setup: func(t *testing.T, f *quotaFixture) { f.pets(t, "free", 5, http.StatusOK) },
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "free", Mode: "enforce", Windows: []rateLimitWindow{
					{Period: "1m", Limit: 60, Used: 5, Remaining: 55, Reset: f.unix(time.Minute)},
					{Period: "24h", Limit: 1000, Used: 5, Remaining: 995, Reset: f.unix(24 * time.Hour)},
				}}
			},
			fields: func(f *quotaFixture) map[string]string {
				return map[string]string{
					"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "55", "X-RateLimit-Reset": itoa(f.unix(time.Minute)),
					"RateLimit": `"1m";r=55;t=60`, "RateLimit-Policy": `"1m";q=60;w=60, "24h";q=1000;w=86400`,
				}
			},
		},
		{
			// The candidate measured the same 5 requests and would have
			// admitted 3 of them, limited the 4th (a strike) and banned
			// the key at the 5th (a second strike, over its threshold of
			// one); it enforces nothing.
			name:  "a plan with a candidate",
			key:   "candidate",
			setup: func(t *testing.T, f *quotaFixture) { f.pets(t, "candidate", 5, http.StatusOK) },
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "growth", Mode: "enforce",
					Windows:      []rateLimitWindow{{Period: "1m", Limit: 10, Used: 5, Remaining: 5, Reset: f.unix(time.Minute)}},
					Candidate:    []rateLimitWindow{{Period: "1m", Limit: 3, Used: 3, Remaining: 0, Reset: f.unix(time.Minute)}},
					CandidateBan: &rateLimitBan{Banned: true, Until: f.unix(5 * time.Minute), RetryAfter: 300, Strikes: 0, Offences: 1},
				}
			},
			fields: func(f *quotaFixture) map[string]string {
				return map[string]string{
					"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": itoa(f.unix(time.Minute)),
					"RateLimit": `"1m";r=5;t=60`, "RateLimit-Policy": `"1m";q=10;w=60`,
				}
			},
		},
		{
			// pro is 300/1m and 10000/24h; the key's own quotas replace
			// the minute and add an hour, which binds.
			name:  "per-key quotas, three windows",
			key:   "override",
			setup: func(t *testing.T, f *quotaFixture) { f.pets(t, "override", 2, http.StatusOK) },
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "pro", Mode: "enforce", Windows: []rateLimitWindow{
					{Period: "1m", Limit: 5, Used: 2, Remaining: 3, Reset: f.unix(time.Minute)},
					{Period: "1h", Limit: 4, Used: 2, Remaining: 2, Reset: f.unix(time.Hour)},
					{Period: "24h", Limit: 10000, Used: 2, Remaining: 9998, Reset: f.unix(24 * time.Hour)},
				}}
			},
			fields: func(f *quotaFixture) map[string]string {
				return map[string]string{
					"X-RateLimit-Limit": "4", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": itoa(f.unix(time.Hour)),
					// The limiter keeps a bucket's last admission to
					// 1/65535 of the bucket (275 µs for an hour), rounded
					// up: the hour's requests leave it just after now+1h.
					"RateLimit": `"1h";r=2;t=3601`, "RateLimit-Policy": `"1m";q=5;w=60, "1h";q=4;w=3600, "24h";q=10000;w=86400`,
				}
			},
		},
		{
			// tiny admits 3 a minute and bans for 5 minutes after more
			// than 2 refusals; a ban starts the strikes over.
			name: "banned key",
			key:  "tiny",
			setup: func(t *testing.T, f *quotaFixture) {
				f.pets(t, "tiny", 3, http.StatusOK)
				for i := 0; ; i++ {
					resp := f.pets(t, "tiny", 1, http.StatusTooManyRequests)
					if resp.errorBody(t).Code == codeKeyBanned {
						if resp.Header.Get("Retry-After") != "300" {
							t.Fatalf("ban Retry-After %q, want 300", resp.Header.Get("Retry-After"))
						}
						return
					}
					if i == 10 {
						t.Fatal("no ban after 10 refusals")
					}
				}
			},
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "tiny", Mode: "enforce", Windows: []rateLimitWindow{
					{Period: "1m", Limit: 3, Used: 3, Remaining: 0, Reset: f.unix(time.Minute)},
					{Period: "1h", Limit: 100, Used: 3, Remaining: 97, Reset: f.unix(time.Hour)},
				}, Ban: rateLimitBan{Banned: true, Until: f.unix(5 * time.Minute), RetryAfter: 300, Strikes: 0, Offences: 1}}
			},
			fields: func(f *quotaFixture) map[string]string {
				return map[string]string{
					"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": itoa(f.unix(5 * time.Minute)),
					"RateLimit": `"1m";r=0;t=300`, "RateLimit-Policy": `"1m";q=3;w=60, "1h";q=100;w=3600`,
				}
			},
		},
		{
			name:  "plan in shadow mode",
			key:   "shadow",
			setup: func(t *testing.T, f *quotaFixture) { f.pets(t, "shadow", 2, http.StatusOK) },
			want: func(f *quotaFixture) rateLimitBody {
				return rateLimitBody{Plan: "trial", Mode: "shadow", Windows: []rateLimitWindow{
					{Period: "1m", Limit: 20, Used: 2, Remaining: 18, Reset: f.unix(time.Minute)},
				}}
			},
			fields: func(*quotaFixture) map[string]string { return map[string]string{} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newQuotaFixture(t, ratelimit.Options{})
			if tt.setup != nil {
				tt.setup(t, f)
			}
			got, resp := f.quota(t, tt.key)
			if want := tt.want(f); !reflect.DeepEqual(got, want) {
				t.Errorf("body %s\nwant %+v", resp.body, want)
			}
			if got, want := rateLimitFields(resp.Header), tt.fields(f); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("rate-limit fields %v\nwant %v", got, want)
			}
		})
	}
}

// TestRateLimitSpendsNothing: asking is counted in no window and is no
// strike, so requests after it find the quota as if it had not been asked.
func TestRateLimitSpendsNothing(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t, ratelimit.Options{})
	if got := f.pets(t, "free", 3, http.StatusOK).Header.Get("X-RateLimit-Remaining"); got != "57" {
		t.Fatalf("after 3 requests X-RateLimit-Remaining = %s, want 57", got)
	}
	for i := range 8 {
		b, resp := f.quota(t, "free")
		if b.Windows[0].Used != 3 || b.Windows[0].Remaining != 57 || b.Windows[1].Used != 3 || resp.Header.Get("X-RateLimit-Remaining") != "57" {
			t.Fatalf("ask %d: %s, remaining field %s", i+1, resp.body, resp.Header.Get("X-RateLimit-Remaining"))
		}
	}
	if got := f.pets(t, "free", 1, http.StatusOK).Header.Get("X-RateLimit-Remaining"); got != "56" {
		t.Fatalf("the request after 8 asks: X-RateLimit-Remaining = %s, want 56", got)
	}

	// A limited key may ask, and asking earns no strike: tiny bans after
	// more than 2 refusals, and one refusal plus 8 asks leave it unbanned.
	f.pets(t, "tiny", 3, http.StatusOK)
	if code := f.pets(t, "tiny", 1, http.StatusTooManyRequests).errorBody(t).Code; code != codeRateLimited {
		t.Fatalf("4th request: %s", code)
	}
	for i := range 8 {
		if b, resp := f.quota(t, "tiny"); b.Ban.Banned || b.Windows[0].Remaining != 0 {
			t.Fatalf("limited key, ask %d: %s", i+1, resp.body)
		}
	}
	if code := f.pets(t, "tiny", 1, http.StatusTooManyRequests).errorBody(t).Code; code != codeRateLimited {
		t.Fatalf("second refusal after 8 asks: %s, want %s (asks counted as strikes)", code, codeRateLimited)
	}
}

// TestRateLimitThrottle: the operation's own per-key throttle, bursts of
// 10 then one a second, refuses with 429 and its own fields, and neither
// touches the key's quota nor another key's throttle.
func TestRateLimitThrottle(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t, ratelimit.Options{})
	// Every answer is charged, a 400 too, and carries the throttle's
	// fields; a 200 carries the quota's instead. The throttle states its
	// reset on this replica's clock, which runs apart from the test's
	// Redis: that field is checked against the request's span.
	checkThrottleFields := func(what string, resp *response, before, after time.Time, remaining int) {
		t.Helper()
		got := rateLimitFields(resp.Header)
		wait := time.Duration(10-remaining) * time.Second
		if reset, _ := strconv.ParseInt(got["X-RateLimit-Reset"], 10, 64); reset < ceilUnix(before.Add(wait)) || reset > ceilUnix(after.Add(wait)) {
			t.Errorf("%s: X-RateLimit-Reset %s, want %s from now", what, got["X-RateLimit-Reset"], wait)
		}
		delete(got, "X-RateLimit-Reset")
		want := map[string]string{
			"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": strconv.Itoa(remaining),
			"RateLimit": fmt.Sprintf(`"10s";r=%d;t=%d`, remaining, 10-remaining), "RateLimit-Policy": `"10s";q=10;w=10`,
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: fields %v, want %v", what, got, want)
		}
	}
	before := time.Now()
	bad := f.get("/v1/rate_limit?plan=pro", f.keys["free"])
	if bad.StatusCode != http.StatusBadRequest || !strings.HasPrefix(bad.errorBody(t).Message, "plan:") {
		t.Fatalf("with a query parameter: %d %s", bad.StatusCode, bad.body)
	}
	checkThrottleFields("400", bad, before, time.Now(), 9)
	for i := range 9 {
		if _, resp := f.quota(t, "free"); resp.Header.Get("X-RateLimit-Limit") != "60" {
			t.Fatalf("ask %d: X-RateLimit-Limit %s, want the quota's 60", i+2, resp.Header.Get("X-RateLimit-Limit"))
		}
	}
	before = time.Now()
	refused := f.get("/v1/rate_limit", f.keys["free"])
	if refused.StatusCode != http.StatusTooManyRequests || refused.errorBody(t).Code != codeRateLimited || refused.Header.Get("Retry-After") != "1" {
		t.Fatalf("11th ask: %d Retry-After %q %s, want 429 rate_limited after 1 s", refused.StatusCode, refused.Header.Get("Retry-After"), refused.body)
	}
	checkThrottleFields("429", refused, before, time.Now(), 0)
	if head := f.do(request{method: http.MethodHead, target: "/v1/rate_limit", key: f.keys["free"]}); head.StatusCode != http.StatusTooManyRequests {
		t.Errorf("HEAD over the throttle: %d", head.StatusCode)
	}
	// The key's quota is untouched, and another key has its own budget.
	if got := f.pets(t, "free", 1, http.StatusOK).Header.Get("X-RateLimit-Remaining"); got != "59" {
		t.Errorf("first request after 12 asks: X-RateLimit-Remaining %s, want 59", got)
	}
	if _, resp := f.quota(t, "override"); resp.StatusCode != http.StatusOK {
		t.Errorf("another key: %d", resp.StatusCode)
	}
	// One second later (by Redis's clock) one more ask is admitted.
	f.now = f.now.Add(time.Second)
	f.mini.SetTime(f.now)
	if _, resp := f.quota(t, "free"); resp.StatusCode != http.StatusOK {
		t.Errorf("after Retry-After: %d", resp.StatusCode)
	}
}

func TestRateLimitUnauthorized(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t, ratelimit.Options{})
	for name, key := range map[string]string{"no key": "", "unknown key": generateKey(t), "malformed key": keyBadShape} {
		resp := f.do(request{target: "/v1/rate_limit", key: key})
		if resp.StatusCode != http.StatusUnauthorized || resp.errorBody(t).Code != codeUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %s", name, resp.StatusCode, resp.body)
		}
	}
	// Refused before the throttle and the limiter: nothing was read or
	// written for any key (the replicas' heartbeats aside: their census,
	// and the token of the dataset they keep the finalize marks by).
	heartbeat := []string{":{replicas}", ":{replicas}:final4", ":{replicas}:dataset"}
	for _, k := range f.mini.Keys() {
		if !slices.ContainsFunc(heartbeat, func(s string) bool { return strings.HasSuffix(k, s) }) {
			t.Errorf("Redis key %s after refused requests", k)
		}
	}
}

// TestRateLimitWithoutRedis: without the shared counts the operation
// answers 503 in both failure modes, while fail-open keeps serving pets.
func TestRateLimitWithoutRedis(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode ratelimit.FailureMode
		pets int
	}{
		{ratelimit.FailOpen, http.StatusOK},
		{ratelimit.FailClosed, http.StatusServiceUnavailable},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			t.Parallel()
			// Redis is gone from the start (what worked before it went is
			// the other tests' matter), so a short timeout is safe.
			f := newQuotaFixture(t, ratelimit.Options{FailureMode: tt.mode, Timeout: 100 * time.Millisecond})
			f.mini.Close()
			for i := range 3 {
				resp := f.get("/v1/rate_limit", f.keys["free"])
				if resp.StatusCode != http.StatusServiceUnavailable || resp.errorBody(t).Code != codeUnavailable || resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("ask %d without Redis: %d Retry-After %q %s", i+1, resp.StatusCode, resp.Header.Get("Retry-After"), resp.body)
				}
			}
			f.pets(t, "free", 1, tt.pets)
		})
	}
}

func TestRateLimitMethodsAndWiring(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t, ratelimit.Options{})
	head := f.do(request{method: http.MethodHead, target: "/v1/rate_limit", key: f.keys["free"]})
	if head.StatusCode != http.StatusOK || head.Header.Get("X-RateLimit-Limit") != "60" {
		t.Errorf("HEAD: %d %v", head.StatusCode, head.Header)
	}
	post := f.do(request{method: http.MethodPost, target: "/v1/rate_limit", key: f.keys["free"], body: "{}"})
	if post.StatusCode != http.StatusMethodNotAllowed || post.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d Allow %q", post.StatusCode, post.Header.Get("Allow"))
	}
	// Without a UsageReader the operation is not served (which the
	// document, describing the service as deployed, does not cover).
	ts := newTestServer(t)
	r := httpRequest(http.MethodGet, "/v1/rate_limit", "")
	r.Header.Set("Authorization", "Bearer "+keyFree)
	rec := newRecorderOnly()
	ts.handler.ServeHTTP(rec, r)
	if rec.Code != http.StatusNotFound {
		t.Errorf("without Usage: %d %s", rec.Code, rec.Body)
	}
	if !slices.Contains(ts.limiter.Calls(), "key_free") {
		t.Error("an unserved path under /v1 is no longer rate limited")
	}
}

// TestRateLimitWithRedis runs the peek on a real Redis, whose script
// decodes with Redis's struct library where miniredis uses the Lua codec.
func TestRateLimitWithRedis(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = client.Close() })
	f := &quotaFixture{}
	f.start(t, client, ratelimit.Options{}, nil)
	f.pets(t, "override", 3, http.StatusOK)
	for range 5 {
		b, resp := f.quota(t, "override")
		var counts []string
		for _, w := range b.Windows {
			counts = append(counts, fmt.Sprintf("%s %d/%d used, %d left", w.Period, w.Used, w.Limit, w.Remaining))
		}
		if got := strings.Join(counts, "; "); got != "1m 3/5 used, 2 left; 1h 3/4 used, 1 left; 24h 3/10000 used, 9997 left" {
			t.Fatalf("windows: %s", got)
		}
		if resp.Header.Get("X-RateLimit-Remaining") != "1" || resp.Header.Get("X-RateLimit-Limit") != "4" {
			t.Fatalf("fields %v", rateLimitFields(resp.Header))
		}
	}
	if got := f.pets(t, "override", 1, http.StatusOK).Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("4th request after 5 asks: X-RateLimit-Remaining %s, want 0", got)
	}
	f.pets(t, "override", 1, http.StatusTooManyRequests)
	if b, _ := f.quota(t, "override"); b.Windows[1].Remaining != 0 || b.Ban.Strikes != 1 {
		t.Fatalf("after a refusal: %+v", b)
	}
}

// TestRateLimitContractCheck proves the document's check of this
// operation's 200 is not vacuous.
func TestRateLimitContractCheck(t *testing.T) {
	t.Parallel()
	c := loadContract(t)
	req := httptest.NewRequest(http.MethodGet, "/v1/rate_limit", nil)
	const good = `{"plan":"free","mode":"enforce","windows":[{"period":"1m","limit":60,"used":1,"remaining":59,"reset":1795290702}],"ban":{"banned":false,"strikes":0,"offences":0}}`
	respond := func(body string) *response {
		rec := httptest.NewRecorder()
		h := rec.Header()
		h.Set("X-Request-Id", "abc")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Type", "application/json")
		return &response{Response: &http.Response{StatusCode: http.StatusOK, Header: h}, body: []byte(body)}
	}
	if errs := c.check(req, respond(good)); len(errs) != 0 {
		t.Fatalf("a conforming response fails the check: %v", errs)
	}
	for name, body := range map[string]string{
		"no ban":         strings.Replace(good, `,"ban":{"banned":false,"strikes":0,"offences":0}`, "", 1),
		"no windows":     strings.Replace(good, `[{"period":"1m","limit":60,"used":1,"remaining":59,"reset":1795290702}]`, "[]", 1),
		"negative used":  strings.Replace(good, `"used":1`, `"used":-1`, 1),
		"unknown mode":   strings.Replace(good, `"enforce"`, `"dry-run"`, 1),
		"period as secs": strings.Replace(good, `"1m"`, `60`, 1),
		"reset missing":  strings.Replace(good, `,"reset":1795290702`, "", 1),
	} {
		if errs := c.check(req, respond(body)); len(errs) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
}
