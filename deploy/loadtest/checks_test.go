package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	good := func() http.Header {
		return headers(
			"X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "12", "X-RateLimit-Reset", "1800000030",
			"RateLimit", `"1m";r=12;t=30`, "RateLimit-Policy", `"1m";q=60;w=60, "24h";q=1000;w=86400`)
	}
	rl, err := parseRateLimit(good(), 200, now)
	if err != nil || rl.limit != 60 || rl.remaining != 12 || rl.window != time.Minute || !rl.reset.Equal(now.Add(30*time.Second)) {
		t.Fatalf("parseRateLimit(good) = %+v, %v", rl, err)
	}
	h := good()
	h.Set("Retry-After", "7")
	if rl, err := parseRateLimit(h, 429, now); err != nil || rl.retryAfter != 7*time.Second {
		t.Fatalf("429 with Retry-After 7: %+v, %v", rl, err)
	}
	// Without the draft's fields: the three alone, no window known.
	h = good()
	h.Del("RateLimit")
	h.Del("RateLimit-Policy")
	if rl, err := parseRateLimit(h, 200, now); err != nil || rl.limit != 60 || rl.remaining != 12 || rl.window != 0 {
		t.Fatalf("without the draft's fields: %+v, %v", rl, err)
	}
	h.Set("Retry-After", "7")
	if rl, err := parseRateLimit(h, 429, now); err != nil || rl.retryAfter != 7*time.Second {
		t.Fatalf("429 without the draft's fields, Retry-After 7: %+v, %v", rl, err)
	}
	tests := []struct {
		name    string
		edit    func(http.Header)
		status  int
		wantErr string
	}{
		{"no limit", func(h http.Header) { h.Del("X-RateLimit-Limit") }, 200, "no X-RateLimit-Limit"},
		{"no remaining", func(h http.Header) { h.Del("X-RateLimit-Remaining") }, 200, "no X-RateLimit-Remaining"},
		{"bad reset", func(h http.Header) { h.Set("X-RateLimit-Reset", "soon") }, 200, "X-RateLimit-Reset"},
		{"reset in the past", func(h http.Header) { h.Set("X-RateLimit-Reset", "1799999990") }, 200, "in the past"},
		{"remaining above limit", func(h http.Header) { h.Set("X-RateLimit-Remaining", "61") }, 200, "above"},
		{"no RateLimit", func(h http.Header) { h.Del("RateLimit") }, 200, "RateLimit"},
		{"r differs", func(h http.Header) { h.Set("RateLimit", `"1m";r=11;t=30`) }, 200, "r=11"},
		{"q differs", func(h http.Header) { h.Set("RateLimit-Policy", `"1m";q=61;w=60`) }, 200, "q=61"},
		{"window not in policy", func(h http.Header) { h.Set("RateLimit-Policy", `"24h";q=60;w=86400`) }, 200, "does not list"},
		{"malformed policy", func(h http.Header) { h.Set("RateLimit-Policy", `1m;q=60`) }, 200, "RateLimit-Policy"},
		{"no RateLimit-Policy", func(h http.Header) { h.Del("RateLimit-Policy") }, 200, "RateLimit-Policy \"\""},
		{"neither draft field, 429 without Retry-After", func(h http.Header) { h.Del("RateLimit"); h.Del("RateLimit-Policy") }, 429, "Retry-After"},
		{"neither draft field, limit missing", func(h http.Header) { h.Del("RateLimit"); h.Del("RateLimit-Policy"); h.Del("X-RateLimit-Limit") }, 200, "no X-RateLimit-Limit"},
		{"429 without Retry-After", func(http.Header) {}, 429, "Retry-After"},
		{"429 with Retry-After 0", func(h http.Header) { h.Set("Retry-After", "0") }, 429, "Retry-After"},
	}
	for _, tt := range tests {
		h := good()
		tt.edit(h)
		if _, err := parseRateLimit(h, tt.status, now); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestRemainingTracker(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	ans := func(send, recv int, rem int64) answer {
		return answer{send: ms(send), recv: ms(recv), remaining: rem, window: time.Second}
	}
	tr := newRemainingTracker(0)
	steps := []struct {
		send, recv int
		remaining  int64
		ok         bool
	}{
		{0, 10, 99, true},
		{20, 30, 98, true},
		{25, 40, 99, true},     // overlapped the request before: may have been decided first
		{50, 60, 99, false},    // sent after an answer of 98: a rise
		{70, 75, 97, true},     // falls again
		{80, 90, 96, true},     // compared with 97
		{1200, 1210, 99, true}, // past the window from the first request: old requests slid out
	}
	for i, s := range steps {
		ok, bound, _ := tr.observe("k", ans(s.send, s.recv, s.remaining))
		if ok != s.ok {
			t.Errorf("step %d (remaining %d): ok = %v (bound %d), want %v", i, s.remaining, ok, bound.remaining, s.ok)
		}
	}
	// Observed out of receive order: the late report still bounds
	// requests sent after it was received.
	tr = newRemainingTracker(0)
	tr.observe("k", ans(0, 20, 50))
	tr.observe("k", ans(0, 10, 40))
	if ok, bound, _ := tr.observe("k", ans(30, 40, 45)); ok || bound.remaining != 40 || !bound.recv.Equal(ms(10)) {
		t.Errorf("after out-of-order reports: ok %v bound %d received at %s, want a rise above 40, received at 10ms", ok, bound.remaining, bound.recv.Sub(t0))
	}
	if ok, _, compared := tr.observe("other", ans(30, 40, 99)); !ok || compared {
		t.Error("keys are tracked apart")
	}
	if compared, rose, most := tr.rises(); compared != 1 || rose != 1 || most != 5 {
		t.Errorf("rises: %d of %d compared, most %d; want 1 of 1, 5", rose, compared, most)
	}
	if key, a, from := tr.largest(); key != "k" || a.remaining != 45 || !a.send.Equal(ms(30)) || from.remaining != 40 || !from.recv.Equal(ms(10)) {
		t.Errorf("largest: %s answered %d (sent %s) after %d (received %s); want k, 45 sent at 30ms after 40 received at 10ms",
			key, a.remaining, a.send.Sub(t0), from.remaining, from.recv.Sub(t0))
	}

	// With a slack, a rise up to it passes, one beyond it fails.
	tr = newRemainingTracker(3)
	tr.observe("k", ans(0, 10, 90))
	for i, s := range []struct {
		remaining int64
		ok        bool
	}{{93, true}, {94, false}, {80, true}, {83, true}, {84, false}} {
		// Each sent after the answers before it were received: compared
		// with the least of them.
		if ok, _, _ := tr.observe("k", ans(20+20*i, 30+20*i, s.remaining)); ok != s.ok {
			t.Errorf("slack 3, Remaining %d: ok %v, want %v", s.remaining, ok, s.ok)
		}
	}
}

func TestArrival(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int
		rate float64
		ramp time.Duration
		want time.Duration
	}{
		{1, 100, 0, 10 * time.Millisecond},
		{250, 100, 0, 2500 * time.Millisecond},
		// Rising to 100/s over 2 s: 100 arrivals in the ramp, the 25th
		// at 1 s; then 100 a second.
		{25, 100, 2 * time.Second, time.Second},
		{100, 100, 2 * time.Second, 2 * time.Second},
		{101, 100, 2 * time.Second, 2010 * time.Millisecond},
		{200, 100, 2 * time.Second, 3 * time.Second},
	} {
		if got := arrival(c.n, c.rate, c.ramp); (got - c.want).Abs() > time.Microsecond {
			t.Errorf("arrival(%d, %v, %s) = %s, want %s", c.n, c.rate, c.ramp, got, c.want)
		}
	}
	// Never earlier than the arrival before it.
	for n := 1; n < 1000; n++ {
		if arrival(n+1, 300, 3*time.Second) < arrival(n, 300, 3*time.Second) {
			t.Fatalf("arrival %d before arrival %d", n+1, n)
		}
	}
}

func TestRiseAllowed(t *testing.T) {
	t.Parallel()
	c := config{rate: 1000, burst: 1000}
	if n := riseAllowed(c, 20); n != 0 {
		t.Errorf("no -remaining-held: %d allowed, want 0", n)
	}
	c.held = 384
	if n := riseAllowed(c, 20); n != 768 {
		t.Errorf("held 384: %d allowed, want 768 (what three replicas can have counted and not spent: 4 x 64 each)", n)
	}
	// 1,000/s over 20 keys for 10 s, and a burst of 1,000 over 20 keys.
	c.leaseLife = 10 * time.Second
	if n := riseAllowed(c, 20); n != 768+500+50 {
		t.Errorf("held 384, life 10s: %d allowed, want 1318", n)
	}
	c.rate, c.burst = 7, 3
	if n := riseAllowed(c, 20); n != 768+4+1 {
		t.Errorf("rounded up: %d allowed, want 773", n)
	}
}

func TestReadKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := readKeys(write("ok.csv", "id,key,plan,label\nkey_1,pst_a,loadtest,x\nkey_2,pst_b,loadtest,\n"))
	if err != nil || len(keys) != 2 || keys[1].secret != "pst_b" || keys[0].id != "key_1" {
		t.Fatalf("readKeys = %+v, %v", keys, err)
	}
	for name, content := range map[string]string{
		"noheader.csv": "key_1,pst_a,loadtest,x\n",
		"empty.csv":    "id,key,plan,label\n",
		"notakey.csv":  "id,key,plan,label\nkey_1,secret,loadtest,x\n",
		"ragged.csv":   "id,key,plan,label\nkey_1,pst_a\n",
	} {
		if _, err := readKeys(write(name, content)); err == nil {
			t.Errorf("readKeys(%s) accepted %q", name, content)
		}
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"-url", "http://x"},
		{"-url", "http://x", "-keys", "k.csv", "-rate", "0"},
		{"-url", "http://x", "-keys", "k.csv", "-check-rate", "2"},
		{"-url", "http://x", "-keys", "k.csv", "-ramp", "30s"},
		{"-url", "http://x", "-keys", "k.csv", "-remaining-held", "-1"},
		{"-url", "http://x", "-keys", "k.csv", "extra"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted it", args)
		}
	}
	c, err := parseFlags([]string{"-url", "http://x", "-keys", "k.csv", "-short"}, &bytes.Buffer{})
	if err != nil || c.rate != 300 || c.duration != 5*time.Second {
		t.Fatalf("-short: %+v, %v", c, err)
	}
}

// fakeService answers like petstore for keys on a plan of `limit` per
// minute, from one counter per key; rising makes Remaining go up on every
// tenth answer, as a broken limiter would; draft adds the IETF draft's two
// fields to the specification's three. GET /v1/rate_limit names the
// window and spends nothing.
func fakeService(limit int, rising, draft bool) http.Handler {
	var mu sync.Mutex
	counts := map[string]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Authorization")
		if r.URL.Path == "/v1/rate_limit" {
			mu.Lock()
			n := counts[k]
			mu.Unlock()
			fmt.Fprintf(w, `{"plan":"loadtest","mode":"enforce","windows":[{"period":"1m","limit":%d,"used":%d,"remaining":%d,"reset":%d}]}`,
				limit, n, max(limit-n, 0), time.Now().Add(time.Minute).Unix())
			return
		}
		mu.Lock()
		counts[k]++
		n := counts[k]
		mu.Unlock()
		rem := limit - n
		if rising && n%10 == 0 {
			rem += 5
		}
		h := w.Header()
		h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(max(rem, 0)))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10))
		if draft {
			h.Set("RateLimit", fmt.Sprintf(`"1m";r=%d;t=60`, max(rem, 0)))
			h.Set("RateLimit-Policy", fmt.Sprintf(`"1m";q=%d;w=60`, limit))
		}
		if rem < 0 {
			h.Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"code":"rate_limited","message":"rate limit exceeded","status":429}`)
			return
		}
		fmt.Fprint(w, "[]")
	})
}

// TestRunAgainstFakes runs the kit end to end: a service that keeps its
// promises passes, one whose Remaining rises (with the draft's fields or
// the specification's three alone; by 4 at most, which a slack of 6
// passes and one of 2 does not), that refuses steady load, that is
// slower than the thresholds or whose GET /v1/rate_limit fails fails the
// run. The latency thresholds are wide where latency is not the point:
// the fakes share the machine with everything else.
func TestRunAgainstFakes(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys.csv")
	if err := os.WriteFile(keys, []byte("id,key,plan,label\nkey_1,pst_a,loadtest,\nkey_2,pst_b,loadtest,\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(30 * time.Millisecond)
		fakeService(100000, false, true).ServeHTTP(w, r)
	})
	noQuota := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/rate_limit" {
			http.NotFound(w, r)
			return
		}
		fakeService(100000, false, false).ServeHTTP(w, r)
	})
	// GET /v1/rate_limit answers 503 (Retry-After 0) to each key's
	// first ask, as a deployment just started may; or to every ask.
	unavailable := func(times int) http.Handler {
		var mu sync.Mutex
		asked := map[string]int{}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/rate_limit" {
				mu.Lock()
				asked[r.Header.Get("Authorization")]++
				n := asked[r.Header.Get("Authorization")]
				mu.Unlock()
				if n <= times {
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusServiceUnavailable)
					fmt.Fprint(w, `{"code":"unavailable","message":"service temporarily unavailable; retry shortly","status":503}`)
					return
				}
			}
			fakeService(100000, false, false).ServeHTTP(w, r)
		})
	}
	wide := []string{"-p95", "10s", "-p99", "10s", "-burst-p99", "10s"}
	tests := []struct {
		name    string
		svc     http.Handler
		flags   []string
		wantErr bool
		want    string
	}{
		{"keeps its promises", fakeService(100000, false, true), wide, false, "all thresholds passed"},
		{"keeps its promises, three fields", fakeService(100000, false, false), wide, false, "ok   Remaining never rises"},
		{"Remaining rises", fakeService(100000, true, true), wide, true, "FAIL Remaining never rises"},
		{"Remaining rises, three fields", fakeService(100000, true, false), wide, true, "FAIL Remaining never rises"},
		{"Remaining rises within the slack", fakeService(100000, true, false), append([]string{"-remaining-held", "3"}, wide...), false, "(allowed: 6)"},
		{"Remaining rises beyond the slack", fakeService(100000, true, false), append([]string{"-remaining-held", "1"}, wide...), true, "FAIL Remaining never rises"},
		{"refuses steady load", fakeService(50, false, true), wide, true, "FAIL status is what the scenario expects"},
		{"slower than the thresholds", slow, []string{"-p95", "20ms", "-p99", "10s", "-burst-p99", "10s"}, true, "FAIL steady latency p95"},
		{"no GET /v1/rate_limit", noQuota, wide, true, ""},
		{"GET /v1/rate_limit unavailable at first", unavailable(1), wide, false, "all thresholds passed"},
		{"ramped up", fakeService(100000, false, true), append([]string{"-ramp", "500ms"}, wide...), false, "ramped up over 500ms"},
		{"GET /v1/rate_limit unavailable", unavailable(quotaTries), wide, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.svc)
			defer srv.Close()
			var out bytes.Buffer
			args := append([]string{"-url", srv.URL, "-keys", keys, "-rate", "200", "-duration", "1s", "-burst", "50", "-workers", "16"}, tt.flags...)
			err := run(context.Background(), args, &out, &bytes.Buffer{})
			if (err != nil) != tt.wantErr || !strings.Contains(out.String(), tt.want) || tt.want == "" && !strings.Contains(fmt.Sprint(err), "GET /v1/rate_limit for key_") {
				t.Fatalf("run: %v, want error %v and %q in:\n%s", err, tt.wantErr, tt.want, out.String())
			}
		})
	}
}
