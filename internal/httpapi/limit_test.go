package httpapi

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

func TestRateLimitHeadersOnEveryResponse(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	reset := time.Now().Add(30*time.Second + 300*time.Millisecond)
	ts.limiter.decision = ratelimit.Decision{Outcome: ratelimit.Allowed, Binding: 0, Windows: []ratelimit.WindowState{
		{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Remaining: 12, Reset: reset},
		{Window: ratelimit.Window{Limit: 1000, Period: 24 * time.Hour}, Remaining: 500, Reset: time.Now().Add(10 * time.Hour)},
	}}
	p := ts.create("Rex", 1, "sold")
	for _, req := range []request{
		{target: "/v1/pets"},                                      // 200
		{target: "/v1/pets/" + itoa(p.ID)},                        // 200, deprecated
		{method: http.MethodPost, target: "/v1/pets", body: `{}`}, // 400
		{target: "/v1/pets?limit=0"},                              // 400
		{target: "/v1/pets/424242"},                               // 404
		{target: "/v1/nothing"},                                   // 404
		{method: http.MethodDelete, target: "/v1/pets"},           // 405
		{method: http.MethodPost, target: "/v1/pets", body: `{"name":"Max","categoryId":2}`}, // 201
	} {
		req.key = keyFree
		resp := ts.do(req)
		h := resp.Header
		want := map[string]string{
			"X-RateLimit-Limit":     "60",
			"X-RateLimit-Remaining": "12",
			"X-RateLimit-Reset":     strconv.FormatInt(reset.Unix()+1, 10),
			"RateLimit-Policy":      `"1m";q=60;w=60, "24h";q=1000;w=86400`,
		}
		for name, v := range want {
			if got := h.Get(name); got != v {
				t.Errorf("%s %s (%d): %s = %q, want %q", req.method, req.target, resp.StatusCode, name, got, v)
			}
		}
		// t is 30 or 31 seconds depending on how long the request took.
		if got := h.Get("RateLimit"); got != `"1m";r=12;t=31` && got != `"1m";r=12;t=30` {
			t.Errorf("%s %s: RateLimit = %q", req.method, req.target, got)
		}
	}
}

func TestRateLimitHeadersBindingWindow(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		d    ratelimit.Decision
		want map[string]string
	}{
		{
			name: "day window binds",
			d: ratelimit.Decision{Outcome: ratelimit.Allowed, Binding: 1, Windows: []ratelimit.WindowState{
				{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Remaining: 40, Reset: now.Add(10 * time.Second)},
				{Window: ratelimit.Window{Limit: 1000, Period: 24 * time.Hour}, Remaining: 3, Reset: now.Add(90*time.Minute + 500*time.Millisecond)},
			}},
			want: map[string]string{
				"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "1700005401",
				"RateLimit": `"24h";r=3;t=5401`, "RateLimit-Policy": `"1m";q=60;w=60, "24h";q=1000;w=86400`,
			},
		},
		{
			name: "sub-second window",
			d: ratelimit.Decision{Outcome: ratelimit.Allowed, Windows: []ratelimit.WindowState{
				{Window: ratelimit.Window{Limit: 5, Period: 500 * time.Millisecond}, Remaining: 5, Reset: now},
			}},
			want: map[string]string{
				"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "1700000000",
				"RateLimit": `"500ms";r=5;t=0`, "RateLimit-Policy": `"500ms";q=5;w=1`,
			},
		},
		{
			name: "limited shows nothing remaining",
			d: ratelimit.Decision{Outcome: ratelimit.Limited, RetryAfter: 1500 * time.Millisecond, Windows: []ratelimit.WindowState{
				{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Remaining: 0, Reset: now.Add(45 * time.Second)},
			}},
			want: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000045", "RateLimit": `"1m";r=0;t=45`},
		},
		{
			name: "banned resets when the ban ends",
			d: ratelimit.Decision{Outcome: ratelimit.Banned, RetryAfter: 10 * time.Minute, Windows: []ratelimit.WindowState{
				{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Remaining: 60, Reset: now},
			}},
			want: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000600", "RateLimit": `"1m";r=0;t=600`},
		},
		{
			name: "measured on the deciding clock",
			d: ratelimit.Decision{Outcome: ratelimit.Allowed, Time: now.Add(-time.Hour), Windows: []ratelimit.WindowState{
				{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Remaining: 7, Reset: now.Add(-time.Hour + 20*time.Second)},
			}},
			want: map[string]string{"X-RateLimit-Reset": "1699996420", "RateLimit": `"1m";r=7;t=20`},
		},
		{
			name: "no windows, no headers",
			d:    ratelimit.Decision{Outcome: ratelimit.Allowed},
			want: map[string]string{"X-RateLimit-Limit": "", "RateLimit": "", "RateLimit-Policy": ""},
		},
	}
	for _, tt := range tests {
		// Fields set earlier in the canonical spelling are replaced, not
		// sent twice.
		h := http.Header{}
		if len(tt.d.Windows) > 0 {
			for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
				h.Set(name, "stale")
			}
		}
		setLimitHeaders(h, &tt.d, func() time.Time { return now }, true)
		for name, v := range tt.want {
			// Read by the exact name: the X-RateLimit fields must be
			// spelled as the specification spells them.
			if got := strings.Join(h[name], ","); got != v {
				t.Errorf("%s: %s = %q, want %q (fields %v)", tt.name, name, got, v, h)
			}
		}
		if errs := spellingErrors(h); len(errs) > 0 {
			t.Errorf("%s: %v", tt.name, errs)
		}
	}
}

// TestRateLimitHeadersOverGeneratedDecisions checks the rate-limit fields
// against what the README promises, for decisions generated across the
// accepted space (one to four windows, periods from 1 ms to 366 days at
// millisecond or microsecond precision, limits from 1 to MaxLimit, every
// outcome, the decision's time set or not): the X-RateLimit fields give
// the binding window's limit, its remaining (0 when refused) and when its
// counted requests have all slid out, in Unix seconds rounded up (for a
// ban, no earlier than its end; never before the decision); RateLimit
// names that window and gives the same remaining and the seconds until
// then, rounded up; RateLimit-Policy lists every window, named by a
// period that parses back exactly, with its limit and its period in whole
// seconds (at least 1). Every value fits its schema in openapi.yaml.
// Without the draft's fields the X-RateLimit fields are the same, and
// alone.
func TestRateLimitHeadersOverGeneratedDecisions(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	item := regexp.MustCompile(`^"([0-9a-z]+)";(r|q)=([0-9]{1,15});(t|w)=([0-9]{1,15})$`)
	limits := []int64{1, 2, 127, 128, 255, 256, 65_535, 65_536, ratelimit.MaxLimit}
	// The fields' schemas in the OpenAPI document.
	contract := loadContract(t)
	schema := func(name string) *openapi3.Schema {
		h := contract.doc.Components.Headers[name]
		if h == nil || h.Value.Schema == nil {
			t.Fatalf("openapi.yaml has no schema for the %s header", name)
		}
		return h.Value.Schema.Value
	}
	schemas := map[string]*openapi3.Schema{}
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"} {
		schemas[name] = schema(name)
	}
	for c := range 20_000 {
		var d ratelimit.Decision
		for range 1 + rng.IntN(4) {
			unit := time.Millisecond
			if rng.IntN(4) == 0 {
				unit = time.Microsecond
			}
			p := max(time.Duration(rng.Int64N(int64(ratelimit.MaxPeriod/unit)))*unit, ratelimit.MinPeriod)
			if rng.IntN(2) == 0 {
				p = []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour, ratelimit.MaxPeriod}[rng.IntN(6)]
			}
			if slices.ContainsFunc(d.Windows, func(w ratelimit.WindowState) bool { return w.Period == p }) {
				continue
			}
			l := 1 + rng.Int64N(ratelimit.MaxLimit)
			if rng.IntN(2) == 0 {
				l = limits[rng.IntN(len(limits))]
			}
			d.Windows = append(d.Windows, ratelimit.WindowState{Window: ratelimit.Window{Limit: l, Period: p}, Remaining: rng.Int64N(l + 1)})
		}
		slices.SortFunc(d.Windows, func(a, b ratelimit.WindowState) int { return int(a.Period - b.Period) })
		now := time.Unix(1_700_000_000+rng.Int64N(1e8), rng.Int64N(1e9))
		clock := now
		if rng.IntN(2) == 0 {
			d.Time = now
			clock = now.Add(time.Duration(rng.Int64N(int64(time.Hour)))) // the decision's own time wins
		}
		for i := range d.Windows {
			w := &d.Windows[i]
			w.Reset = now.Add(time.Duration(rng.Int64N(int64(w.Period+w.Period/200))) / time.Microsecond * time.Microsecond)
			if w.Remaining <= d.Windows[d.Binding].Remaining {
				d.Binding = i
			}
		}
		d.Outcome = []ratelimit.Outcome{ratelimit.Allowed, ratelimit.Limited, ratelimit.Banned}[rng.IntN(3)]
		if !d.Allowed() {
			d.RetryAfter = time.Duration(1 + rng.Int64N(int64(2*d.Bound().Period)))
		}
		h := http.Header{}
		setLimitHeaders(h, &d, func() time.Time { return clock }, true)
		// Without the draft's fields: the specification's three, as
		// with them, and nothing else, though fields were set before
		// (a throttle's, in either spelling).
		lean := http.Header{"RateLimit": {"stale"}, "Ratelimit-Policy": {"stale"}, "X-Ratelimit-Limit": {"stale"}}
		setLimitHeaders(lean, &d, func() time.Time { return clock }, false)
		if len(lean) != 3 || !slices.Equal(lean[headerLimit], h[headerLimit]) || !slices.Equal(lean[headerRemaining], h[headerRemaining]) || !slices.Equal(lean[headerReset], h[headerReset]) {
			t.Fatalf("decision %d %+v: without the draft's fields %v, with them %v", c, d, lean, h)
		}

		b := d.Bound()
		remaining := b.Remaining
		if !d.Allowed() {
			remaining = 0
		}
		reset := b.Reset
		if d.Outcome == ratelimit.Banned && now.Add(d.RetryAfter).After(reset) {
			reset = now.Add(d.RetryAfter)
		}
		if now.After(reset) {
			reset = now
		}
		// By the exact spelling (h.Get would canonicalize the name).
		get := func(name string) string { return strings.Join(h[name], ",") }
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("decision %d %+v (now %s): %s; fields %v", c, d, now.Format(time.RFC3339Nano), fmt.Sprintf(format, args...), h)
		}
		for name, sc := range schemas {
			var v any = get(name)
			if sc.Type.Is("integer") {
				n, err := strconv.ParseInt(get(name), 10, 64)
				if err != nil {
					fail("%s %q is not an integer", name, get(name))
				}
				v = float64(n)
			}
			if err := sc.VisitJSON(v); err != nil {
				fail("%s %q does not fit openapi.yaml: %v", name, get(name), err)
			}
		}
		if got := get("X-RateLimit-Limit"); got != strconv.FormatInt(b.Limit, 10) {
			fail("X-RateLimit-Limit %q, want the binding window's limit %d", got, b.Limit)
		}
		if got := get("X-RateLimit-Remaining"); got != strconv.FormatInt(remaining, 10) {
			fail("X-RateLimit-Remaining %q, want %d", got, remaining)
		}
		xr, err := strconv.ParseInt(get("X-RateLimit-Reset"), 10, 64)
		if err != nil || time.Unix(xr, 0).Before(reset) || !time.Unix(xr-1, 0).Before(reset) {
			fail("X-RateLimit-Reset %q, want %s rounded up to a whole second", get("X-RateLimit-Reset"), reset.Format(time.RFC3339Nano))
		}
		m := item.FindStringSubmatch(get("RateLimit"))
		if m == nil || m[2] != "r" || m[4] != "t" {
			fail("RateLimit %q is not an item \"NAME\";r=N;t=N", get("RateLimit"))
		}
		if p, err := plan.ParsePeriod(m[1]); err != nil || p != b.Period {
			fail("RateLimit names %q, not the binding window's period %s", m[1], b.Period)
		}
		if m[3] != strconv.FormatInt(remaining, 10) {
			fail("RateLimit r=%s, want %d", m[3], remaining)
		}
		ts, _ := strconv.ParseInt(m[5], 10, 64)
		if wait := reset.Sub(now); time.Duration(ts)*time.Second < wait || ts > 0 && time.Duration(ts-1)*time.Second >= wait {
			fail("RateLimit t=%d, want %s rounded up to whole seconds", ts, wait)
		}
		items := strings.Split(get("RateLimit-Policy"), ", ")
		if len(items) != len(d.Windows) {
			fail("RateLimit-Policy has %d items for %d windows", len(items), len(d.Windows))
		}
		for i, it := range items {
			m := item.FindStringSubmatch(it)
			w := d.Windows[i]
			if m == nil || m[2] != "q" || m[4] != "w" {
				fail("RateLimit-Policy item %q is not \"NAME\";q=N;w=N", it)
			}
			if p, err := plan.ParsePeriod(m[1]); err != nil || p != w.Period {
				fail("RateLimit-Policy item %q names another period than %s", it, w.Period)
			}
			ws := int64((w.Period + time.Second - 1) / time.Second)
			if m[3] != strconv.FormatInt(w.Limit, 10) || m[5] != strconv.FormatInt(ws, 10) {
				fail("RateLimit-Policy item %q, want q=%d;w=%d", it, w.Limit, ws)
			}
		}
	}
}

// TestRetryAfterOverGeneratedWaits: the Retry-After of a refusal, for
// waits from 1 ns to over a year, is the exact wait rounded up to whole
// seconds (at least 1): waiting it is always enough, and never a second
// or more longer than needed (README, 429).
func TestRetryAfterOverGeneratedWaits(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 5))
	waits := []time.Duration{1, time.Second - 1, time.Second, time.Second + 1, ratelimit.MaxPeriod}
	for range 100_000 {
		unit := []time.Duration{1, time.Microsecond, time.Millisecond, time.Second}[rng.IntN(4)]
		waits = append(waits, time.Duration(1+rng.Int64N(int64(2*ratelimit.MaxPeriod/unit)))*unit)
	}
	for _, d := range waits {
		s := retryAfterSeconds(d)
		if time.Duration(s)*time.Second < d || s < 1 || s > 1 && time.Duration(s-1)*time.Second >= d {
			t.Fatalf("a wait of %v gives Retry-After %d", d, s)
		}
	}
}

func TestRateLimitRefusals(t *testing.T) {
	t.Parallel()
	window := []ratelimit.WindowState{{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Reset: time.Now().Add(time.Minute)}}
	tests := []struct {
		name       string
		d          ratelimit.Decision
		err        error
		status     int
		code       string
		retryAfter string
	}{
		{"limited 1.2s", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: 1200 * time.Millisecond}, nil, 429, codeRateLimited, "2"},
		{"limited exactly 2s", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: 2 * time.Second}, nil, 429, codeRateLimited, "2"},
		{"limited 1ns", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: time.Nanosecond}, nil, 429, codeRateLimited, "1"},
		{"limited 100ms", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: 100 * time.Millisecond}, nil, 429, codeRateLimited, "1"},
		{"limited zero", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window}, nil, 429, codeRateLimited, "1"},
		{"limited 59.001s", ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: 59001 * time.Millisecond}, nil, 429, codeRateLimited, "60"},
		{"banned 5m", ratelimit.Decision{Outcome: ratelimit.Banned, Windows: window, RetryAfter: 5 * time.Minute}, nil, 429, codeKeyBanned, "300"},
		{"banned 90.5s", ratelimit.Decision{Outcome: ratelimit.Banned, Windows: window, RetryAfter: 90500 * time.Millisecond}, nil, 429, codeKeyBanned, "91"},
		{"fail closed", ratelimit.Decision{}, fmt.Errorf("redis: %w", ratelimit.ErrUnavailable), 503, codeUnavailable, "1"},
		{"invalid policy", ratelimit.Decision{}, errors.New("ratelimit: policy has no windows"), 500, codeInternalError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(t)
			ts.limiter.decision, ts.limiter.err = tt.d, tt.err
			for _, target := range []string{"/v1/pets", "/v1/pets/1"} {
				resp := ts.get(target, keyFree)
				if resp.StatusCode != tt.status {
					t.Fatalf("%s: status %d, want %d", target, resp.StatusCode, tt.status)
				}
				if e := resp.errorBody(t); e.Code != tt.code {
					t.Errorf("%s: code %q, want %q", target, e.Code, tt.code)
				}
				if got := resp.Header.Get("Retry-After"); got != tt.retryAfter {
					t.Errorf("%s: Retry-After %q, want %q", target, got, tt.retryAfter)
				}
			}
			// A refused request leaves nothing remaining.
			if tt.status == 429 {
				if resp := ts.get("/v1/pets", keyFree); resp.Header.Get("X-RateLimit-Remaining") != "0" {
					t.Errorf("429 with X-RateLimit-Remaining %q", resp.Header.Get("X-RateLimit-Remaining"))
				}
			}
		})
	}
}

func TestRateLimitOff(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, func(c *Config) { c.Limiter = nil; c.Throttle = nil })
	resp := ts.get("/v1/pets", keyFree)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "" || resp.Header.Get("RateLimit") != "" {
		t.Errorf("limiting off: %d, headers %v", resp.StatusCode, resp.Header)
	}
	if resp := ts.get("/v1/pets", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("throttle off: %d", resp.StatusCode)
	}
}

// TestRateLimitHeadersSpelledOnTheWire reads a raw response: the fields
// the specification names travel as X-RateLimit-*, not Go's canonical
// X-Ratelimit-* (and RateLimit, RateLimit-Policy as the IETF draft spells
// them), each exactly once.
func TestRateLimitHeadersSpelledOnTheWire(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	srv := httptest.NewServer(ts.handler)
	defer srv.Close()
	for _, req := range []string{
		"GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + keyFree + "\r\nConnection: close\r\n\r\n",
		"GET /v1/pets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", // 401, the per-IP throttle's fields
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(conn)
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := strings.Cut(string(raw), "\r\n\r\n")
		for _, name := range exactSpellings {
			if n := strings.Count(head, "\r\n"+name+": "); n != 1 {
				t.Errorf("%s sent %d times in:\n%s", name, n, head)
			}
		}
		if strings.Contains(head, "X-Ratelimit-") || strings.Contains(head, "\r\nRatelimit") {
			t.Errorf("canonical spelling sent:\n%s", head)
		}
	}
}

// TestRateLimitShadowMode: a decision under a plan in shadow mode is never
// enforced: the request is served, without rate-limit headers (the plan
// has no limits as far as its clients know), and a refusal it would have
// made is logged at debug level with its outcome.
func TestRateLimitShadowMode(t *testing.T) {
	t.Parallel()
	window := []ratelimit.WindowState{{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Reset: time.Now().Add(time.Minute)}}
	for _, d := range []ratelimit.Decision{
		{Outcome: ratelimit.Allowed, Windows: window, Shadow: true},
		{Outcome: ratelimit.Limited, Windows: window, RetryAfter: 3 * time.Second, Shadow: true},
		{Outcome: ratelimit.Banned, Windows: window, RetryAfter: 5 * time.Minute, Shadow: true},
	} {
		t.Run(d.Outcome.String(), func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(t)
			ts.limiter.decision = d
			resp := ts.get("/v1/pets", keyFree)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200: %s", resp.StatusCode, resp.body)
			}
			for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After"} {
				if v := resp.Header.Get(name); v != "" {
					t.Errorf("%s: %q on a shadow decision", name, v)
				}
			}
			var logged []map[string]any
			for _, rec := range ts.logs.records(t) {
				if rec["msg"] == "ratelimit: shadow refusal" {
					logged = append(logged, rec)
				}
			}
			switch {
			case d.Allowed() && len(logged) != 0:
				t.Errorf("an admission logged as a shadow refusal: %v", logged)
			case !d.Allowed() && (len(logged) != 1 || logged[0]["level"] != "DEBUG" || logged[0]["outcome"] != d.Outcome.String() ||
				logged[0]["key_id"] != "key_free" || logged[0]["plan"] != "free" || logged[0]["request_id"] == ""):
				t.Errorf("shadow refusal log lines %v, want one at DEBUG naming key, plan, outcome %s and request id", logged, d.Outcome)
			}
		})
	}
}

// TestDraftLimitFieldsOmitted: a server configured without the draft's
// fields (DraftLimitFields false, the default) answers every request as one sending them
// does, the same status and the same X-RateLimit-Limit, -Remaining and
// -Reset, but with neither RateLimit nor RateLimit-Policy in any
// spelling: a key's 200, 201, 404 and 429 (the real limiter on
// miniredis), a request without a valid key (the per-IP throttle's
// fields), and GET /v1/rate_limit's 200 (the quota's) and its
// throttle's 429.
func TestDraftLimitFieldsOmitted(t *testing.T) {
	t.Parallel()
	full := newQuotaFixture(t, ratelimit.Options{})
	lean := newQuotaFixture(t, ratelimit.Options{}, func(c *Config) { c.DraftLimitFields = false })
	lean.now = full.now
	lean.mini.SetTime(lean.now)
	// The per-IP throttle is a fake: the same decision on both.
	lean.throttle.decision = full.throttle.decision
	type step struct {
		what string
		req  func(f *quotaFixture) request
		// clock: the throttle's fields are stated on this process's
		// clock, so Reset may differ by the second boundary between
		// the two requests.
		clock bool
	}
	get := func(target, key string) func(f *quotaFixture) request {
		return func(f *quotaFixture) request { return request{target: target, key: f.keys[key]} }
	}
	steps := []step{
		{what: "200", req: get("/v1/pets", "free")},
		{what: "201", req: func(f *quotaFixture) request {
			return request{method: http.MethodPost, target: "/v1/pets", key: f.keys["free"], body: `{"name":"Rex","categoryId":1}`}
		}},
		{what: "404", req: get("/v1/pets/424242", "free")},
		{what: "401", req: func(*quotaFixture) request { return request{target: "/v1/pets", key: "nope"} }},
		{what: "rate_limit 200", req: get("/v1/rate_limit", "tiny"), clock: true},
	}
	for i := range 4 {
		steps = append(steps, step{what: fmt.Sprintf("tiny's request %d", i+1), req: get("/v1/pets", "tiny")})
	}
	for i := range 11 {
		steps = append(steps, step{what: fmt.Sprintf("ask %d", i+2), req: get("/v1/rate_limit", "free"), clock: true})
	}
	statuses := map[int]bool{}
	for _, st := range steps {
		a, b := full.do(st.req(full)), lean.do(st.req(lean))
		if a.StatusCode != b.StatusCode {
			t.Fatalf("%s: %d without the draft's fields, %d with them", st.what, b.StatusCode, a.StatusCode)
		}
		statuses[a.StatusCode] = true
		want, got := rateLimitFields(a.Header), rateLimitFields(b.Header)
		if want["RateLimit"] == "" || want["RateLimit-Policy"] == "" {
			t.Fatalf("%s (%d): the full server sent %v, want the draft's fields among them", st.what, a.StatusCode, want)
		}
		for name := range b.Header {
			if strings.EqualFold(name, headerRateLimit) || strings.EqualFold(name, headerPolicy) {
				t.Errorf("%s (%d): %s sent without the draft's fields", st.what, b.StatusCode, name)
			}
		}
		for _, name := range []string{headerLimit, headerRemaining, headerReset} {
			if got[name] == want[name] {
				continue
			}
			x, _ := strconv.ParseInt(want[name], 10, 64)
			y, err := strconv.ParseInt(got[name], 10, 64)
			if name == headerReset && st.clock && err == nil && (y == x+1 || y == x-1) {
				continue
			}
			t.Errorf("%s (%d): %s %q without the draft's fields, %q with them", st.what, b.StatusCode, name, got[name], want[name])
		}
	}
	for _, code := range []int{200, 201, 404, 401, 429} {
		if !statuses[code] {
			t.Errorf("no %d among the answers %v: the steps should reach it", code, statuses)
		}
	}
}
