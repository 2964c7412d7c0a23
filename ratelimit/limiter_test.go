package ratelimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

func TestWindowEdges(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := perMinute(5)
	t0 := f.clk.Now()
	f.allow(t, "a", p)
	f.clk.Add(30 * time.Second)
	for i := range 4 {
		d := f.allow(t, "a", p)
		if !d.Allowed() || d.Windows[0].Remaining != int64(3-i) {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i+2, d, 3-i)
		}
		if want := t0.Add(30 * time.Second).Add(time.Minute); !d.Windows[0].Reset.Equal(want) {
			t.Fatalf("reset %s, want %s (when the newest request slides out)", d.Windows[0].Reset, want)
		}
	}
	f.clk.Add(time.Second)
	d := f.allow(t, "a", p)
	if d.Outcome != Limited || d.RetryAfter != 29*time.Second || d.Windows[0].Remaining != 0 {
		t.Fatalf("6th request: %+v, want limited for 29s (until the first slides out)", d)
	}
	// One microsecond early it is still refused; on the edge exactly one
	// request gets in.
	f.clk.Set(t0.Add(time.Minute - time.Microsecond))
	if d := f.allow(t, "a", p); d.Allowed() {
		t.Fatalf("admitted 1µs before the first request slid out: %+v", d)
	}
	f.clk.Set(t0.Add(time.Minute))
	if d := f.allow(t, "a", p); !d.Allowed() || d.Windows[0].Remaining != 0 {
		t.Fatalf("on the edge: %+v, want admitted with 0 remaining", d)
	}
	d = f.allow(t, "a", p)
	if d.Outcome != Limited || d.RetryAfter != 30*time.Second || d.Cached {
		t.Fatalf("after the edge: %+v, want limited 30s by Redis", d)
	}
	f.clk.Add(10 * time.Second)
	d = f.allow(t, "a", p)
	if d.Outcome != Limited || d.RetryAfter != 20*time.Second || !d.Cached {
		t.Fatalf("a key known to be limited should be answered from the cache: %+v", d)
	}
}

func TestMultipleWindowsAndBinding(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "two", Windows: []Window{{Limit: 3, Period: time.Minute}, {Limit: 2, Period: time.Second}}}
	f.allow(t, "k", p)
	d := f.allow(t, "k", p)
	if !d.Allowed() || d.Windows[0].Period != time.Second || d.Binding != 0 || d.Bound().Remaining != 0 || d.Windows[1].Remaining != 1 {
		t.Fatalf("second request: %+v, want the 1s window (sorted first) binding with 0 left", d)
	}
	d = f.allow(t, "k", p)
	if d.Outcome != Limited || d.RetryAfter != time.Second {
		t.Fatalf("third request: %+v, want limited 1s by the short window", d)
	}
	f.clk.Add(time.Second)
	d = f.allow(t, "k", p)
	if !d.Allowed() || d.Binding != 1 || d.Windows[1].Remaining != 0 || d.Windows[0].Remaining != 1 {
		t.Fatalf("after 1s: %+v, want admitted with the minute window binding", d)
	}
	d = f.allow(t, "k", p)
	if d.Outcome != Limited || d.RetryAfter != 59*time.Second {
		t.Fatalf("over the minute window: %+v, want 59s", d)
	}
	// A tie goes to the longer window.
	q := Policy{Name: "tie", Windows: []Window{{Limit: 1, Period: time.Second}, {Limit: 1, Period: time.Minute}}}
	if d := f.allow(t, "tie", q); d.Binding != 1 || d.Bound().Period != time.Minute {
		t.Fatalf("tie: %+v, want the minute window", d)
	}
}

func TestPolicyChangesPerKey(t *testing.T) {
	t.Parallel()
	// Without leases, so that every admission counts exactly one.
	f := newFixture(t, Options{MaxLease: 1})
	base := perMinute(5)
	for range 5 {
		f.allow(t, "k", base)
	}
	if d := f.allow(t, "k", base); d.Outcome != Limited {
		t.Fatalf("want limited, got %+v", d)
	}
	// Another key with its own override is unaffected.
	if d := f.allow(t, "other", perMinute(1)); !d.Allowed() {
		t.Fatalf("other key: %+v", d)
	}
	// An override raising the limit applies at once (not from the cache)
	// and keeps the count: same geometry.
	raised := perMinute(8)
	for i := range 3 {
		if d := f.allow(t, "k", raised); !d.Allowed() {
			t.Fatalf("raised limit, request %d: %+v", i, d)
		}
	}
	if d := f.allow(t, "k", raised); d.Outcome != Limited {
		t.Fatalf("raised limit exhausted: %+v", d)
	}
	// Each window is its own record: adding a window leaves the minute's
	// counts alone (still exhausted), and the new day window counts from
	// now on.
	daily := Policy{Name: "test", Windows: []Window{{Limit: 8, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}}
	if d := f.allow(t, "k", daily); d.Outcome != Limited {
		t.Fatalf("after adding a window the minute must still be exhausted: %+v", d)
	}
	f.clk.Add(time.Minute)
	if d := f.allow(t, "k", daily); !d.Allowed() || d.Windows[0].Remaining != 7 || d.Windows[1].Remaining != 999 {
		t.Fatalf("a minute later: %+v", d)
	}
	// Changing the day's limit keeps its count; so does removing the
	// minute window and adding it back.
	lowered := Policy{Name: "test", Windows: []Window{{Limit: 8, Period: time.Minute}, {Limit: 500, Period: 24 * time.Hour}}}
	if d := f.allow(t, "k", lowered); !d.Allowed() || d.Windows[1].Remaining != 500-2 {
		t.Fatalf("day window after lowering its limit: %+v", d)
	}
	if d := f.allow(t, "k", Policy{Name: "test", Windows: []Window{{Limit: 500, Period: 24 * time.Hour}}}); !d.Allowed() || d.Windows[0].Remaining != 500-3 {
		t.Fatalf("day window without the minute window: %+v", d)
	}
	if d := f.allow(t, "k", daily); !d.Allowed() || d.Windows[0].Remaining != 5 || d.Windows[1].Remaining != 1000-4 {
		t.Fatalf("minute window added back: %+v", d)
	}
	if _, err := f.l.Allow(context.Background(), "k", Policy{Name: "bad"}); err == nil {
		t.Fatal("a policy without windows must be refused")
	}
}

// TestRetryAfterExact checks, for random traffic, that RetryAfter is the
// exact time until the next admission, and that a client waiting the
// rounded-up whole seconds is admitted on its first retry.
func TestRetryAfterExact(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "r", Windows: []Window{{Limit: 3, Period: 2 * time.Second}, {Limit: 7, Period: 9 * time.Second}}}
	rng := rand.New(rand.NewPCG(7, 7))
	ctx := context.Background()
	checked := 0
	for checked < 25 {
		f.clk.Add(time.Duration(rng.IntN(400_000)) * time.Microsecond)
		d := f.allow(t, "k", p)
		if d.Outcome != Limited {
			continue
		}
		checked++
		start := f.clk.Now()
		f.clk.Set(start.Add(d.RetryAfter - time.Microsecond))
		u, err := f.l.Usage(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if u.Windows[0].Remaining > 0 && u.Windows[1].Remaining > 0 {
			t.Fatalf("RetryAfter %s too long: room already 1µs before: %+v", d.RetryAfter, u)
		}
		f.clk.Set(start.Add(d.RetryAfter))
		if u, _ := f.l.Usage(ctx, "k", p); u.Windows[0].Remaining == 0 || u.Windows[1].Remaining == 0 {
			t.Fatalf("RetryAfter %s too short: %+v", d.RetryAfter, u)
		}
		wait := ceilSecond(d.RetryAfter)
		if wait-d.RetryAfter >= time.Second {
			t.Fatalf("rounding %s to %s", d.RetryAfter, wait)
		}
		f.clk.Set(start.Add(wait))
		if d2 := f.allow(t, "k", p); !d2.Allowed() {
			t.Fatalf("retry after waiting %s (RetryAfter %s) refused: %+v", wait, d.RetryAfter, d2)
		}
	}
}

// checkStrict fails if any interval of length period holds more than
// limit of the admission times (µs, ascending).
func checkStrict(t *testing.T, times []int64, w Window) {
	t.Helper()
	p := w.Period.Microseconds()
	lo := 0
	for hi := range times {
		for times[hi]-times[lo] >= p {
			lo++
		}
		if n := hi - lo + 1; int64(n) > w.Limit {
			t.Fatalf("window %s: %d admissions within %s, from %d to %d µs", w, n, w.Period, times[lo], times[hi])
		}
	}
}

func TestStrictUnderRandomTraffic(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{CacheSize: -1})
	p := Policy{Name: "s", Windows: []Window{{Limit: 4, Period: time.Second}, {Limit: 11, Period: 5 * time.Second}}}
	rng := rand.New(rand.NewPCG(3, 4))
	var admitted []int64
	steps := testenv.Cases(t, 750, 1500)
	for range steps {
		f.clk.Add(time.Duration(rng.ExpFloat64() * float64(80*time.Millisecond)))
		if d := f.allow(t, "k", p); d.Allowed() {
			admitted = append(admitted, f.clk.Now().UnixMicro())
		}
	}
	for _, w := range p.Windows {
		checkStrict(t, admitted, w)
	}
	if len(admitted) < steps/6 {
		t.Fatalf("only %d admitted: traffic too thin to test anything", len(admitted))
	}
}

// TestPacingAdmitsNearlyAll paces a client at exactly limit per period; at
// least 99% of the limit must be admitted in the steady state.
func TestPacingAdmitsNearlyAll(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, Options{CacheSize: -1})
		p := perMinute(60)
		n := 0
		for i := range 900 {
			f.clk.Set(epoch.Add(time.Duration(i) * time.Second))
			if d := f.allow(t, "pace", p); d.Allowed() && i >= 60 {
				n++
			}
		}
		if frac := float64(n) / 840; frac < 0.99 {
			t.Fatalf("admitted %.4f of the limit", frac)
		}
	})
	// The Go reference is identical to the script (TestScriptMatchesReference)
	// and fast enough for long runs with large limits.
	for _, w := range []Window{
		{Limit: 1000, Period: 24 * time.Hour}, {Limit: 100_000, Period: 24 * time.Hour}, {Limit: 10_000, Period: 24 * time.Hour},
		{Limit: 300, Period: time.Minute}, {Limit: 200, Period: time.Minute}, {Limit: 60, Period: time.Minute}, {Limit: 7, Period: time.Second},
	} {
		t.Run(w.String(), func(t *testing.T) {
			t.Parallel()
			frac := pacedFraction(w, DefaultBuckets, 4)
			t.Logf("%s paced: %.5f of the limit admitted", w, frac)
			if frac < 0.99 {
				t.Fatalf("admitted %.4f of the limit", frac)
			}
		})
	}
}

// pacedFraction returns the share of the limit admitted to a client sending
// exactly limit requests per period, over periods windows after the first.
func pacedFraction(w Window, buckets, periods int) float64 {
	pl := compile(Policy{Name: "p", Windows: []Window{w}}, buckets, DefaultStrikeBuckets)
	st := &keyState{}
	start := epoch.UnixMicro()
	total := int64(periods+1) * w.Limit
	var n int64
	for i := range total {
		now := start + i*w.Period.Microseconds()/w.Limit
		if v := st.decide(pl, now, input{lease: noLease}); v.outcome == Allowed && i >= w.Limit {
			n++
		}
	}
	return float64(n) / float64(total-w.Limit)
}

func TestBansEscalateAndExpire(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	// The window refills within every ban, so Retry-After is the ban's.
	p := Policy{Name: "b", Windows: []Window{{Limit: 2, Period: 5 * time.Second}},
		Ban: BanPolicy{Threshold: 3, StrikeWindow: time.Minute, Base: 10 * time.Second, Multiplier: 3, Max: time.Minute, Memory: 10 * time.Minute}}
	ban := func(want time.Duration) {
		t.Helper()
		for i := range 2 {
			if d := f.allow(t, "k", p); !d.Allowed() {
				t.Fatalf("request %d: %+v, want allowed", i+1, d)
			}
		}
		for i := range 3 {
			if d := f.allow(t, "k", p); d.Outcome != Limited {
				t.Fatalf("rejection %d: %+v, want limited (not yet over the threshold)", i+1, d)
			}
		}
		d := f.allow(t, "k", p)
		if d.Outcome != Banned || d.RetryAfter != want {
			t.Fatalf("4th rejection: %+v, want banned for %s", d, want)
		}
		f.clk.Add(want - time.Second)
		if d := f.allow(t, "k", p); d.Outcome != Banned || d.RetryAfter != time.Second {
			t.Fatalf("during the ban: %+v, want banned 1s more", d)
		}
		f.clk.Add(time.Second)
	}
	ban(10 * time.Second)
	ban(30 * time.Second)
	ban(time.Minute) // 90s capped
	ban(time.Minute)
	if got := metricValue(t, f.l.met.bans.WithLabelValues("b")); got != 4 {
		t.Fatalf("bans_total = %v, want 4", got)
	}
	u, err := f.l.Usage(context.Background(), "k", p)
	if err != nil || u.Offences != 4 || !u.BannedUntil.IsZero() {
		t.Fatalf("usage %+v %v", u, err)
	}
	// Offences older than Memory are forgotten: back to the base length.
	f.clk.Add(10 * time.Minute)
	ban(10 * time.Second)

	// Strikes spread thinner than the threshold per strike window never ban.
	q := p
	q.Name = "slow"
	q.Windows = []Window{{Limit: 2, Period: time.Hour}}
	f.allow(t, "slow", q)
	f.allow(t, "slow", q)
	for i := range 20 {
		f.clk.Add(21 * time.Second)
		if d := f.allow(t, "slow", q); d.Outcome != Limited {
			t.Fatalf("slow strike %d: %+v", i, d)
		}
	}
}

// TestBanRetryAfterWaitsForTheWindows: a ban shorter than the wait of an
// exhausted window answers with the window's wait, so a client that
// waits Retry-After is admitted on its first retry.
func TestBanRetryAfterWaitsForTheWindows(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{CacheSize: -1})
	p := Policy{Name: "b", Windows: []Window{{Limit: 2, Period: time.Hour}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Second}}
	f.allow(t, "k", p)
	f.allow(t, "k", p)
	f.allow(t, "k", p) // strike 1
	d := f.allow(t, "k", p)
	if d.Outcome != Banned || d.RetryAfter < 59*time.Minute {
		t.Fatalf("banned for 1s with the hour exhausted: %+v, want Retry-After of about an hour", d)
	}
	f.clk.Add(d.RetryAfter - time.Microsecond)
	if d := f.allow(t, "k", p); d.Allowed() {
		t.Fatalf("admitted 1µs before Retry-After: %+v", d)
	}
	f.clk.Add(time.Microsecond)
	if d := f.allow(t, "k", p); !d.Allowed() {
		t.Fatalf("not admitted after waiting Retry-After: %+v", d)
	}
}

func TestScriptReloadAfterFlush(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.allow(t, "k", perMinute(10))
	if err := f.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d := f.allow(t, "k", perMinute(10))
	if !d.Allowed() || d.Degraded || d.Windows[0].Remaining != 8 {
		t.Fatalf("after SCRIPT FLUSH: %+v", d)
	}
	ok, err := f.rdb.ScriptExists(ctx, decisionScript().sha).Result()
	if err != nil || !ok[0] {
		t.Fatalf("script not loaded again: %v %v", ok, err)
	}
	if f.l.breaker.isOpen() || f.l.breaker.failing.Load() {
		t.Fatal("NOSCRIPT must not count as a failure")
	}
}

func TestEveryKeyHasTTLAndExpires(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "t", Windows: []Window{{Limit: 2, Period: time.Minute}, {Limit: 5, Period: time.Hour}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Minute, Memory: 2 * time.Hour}}
	for i := range 10 {
		f.allow(t, "k"+string(rune('a'+i%3)), p)
	}
	keys := f.mini.Keys()
	if len(keys) < 6 {
		t.Fatalf("keys %v: want window and ban state for 3 keys", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "petstore:rl:{") {
			t.Errorf("key %q lacks the prefix and hash tag", k)
		}
		if ttl := f.mini.TTL(k); ttl <= 0 {
			t.Errorf("key %q has no TTL", k)
		}
	}
	f.clk.Add(2*time.Hour + 2*time.Minute)
	if keys := f.mini.Keys(); len(keys) != 0 {
		t.Fatalf("keys left after everything expired: %v", keys)
	}
}

// TestFailOpenFallbackAndRecovery: Redis failing for good trips the
// breaker once failures span TripAfter; meanwhile and after, the replica
// admits only its share of what the last shared verdict left; the
// admissions it made alone reach the shared window when Redis is back.
func TestFailOpenFallbackAndRecovery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 3, ProbeInterval: 10 * time.Millisecond, Timeout: time.Second, MaxLease: 1})
	p := perMinute(10)
	f.allow(t, "k", p) // 9 remain: this replica's share is 3
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	admitted := 0
	for i := range 20 {
		d := f.allow(t, "k", p)
		if !d.Degraded {
			t.Fatalf("decision during the outage not marked degraded: %+v", d)
		}
		if d.Allowed() {
			admitted++
		}
		if open := f.l.breaker.isOpen(); open != (i >= 10) {
			// Failures every 100 ms span TripAfter (1 s) at the 11th.
			t.Fatalf("request %d: breaker open %v", i, open)
		}
		f.clk.Add(100 * time.Millisecond)
	}
	if admitted != 3 {
		t.Fatalf("admitted %d during the outage, want floor(9 remaining / 3 replicas) = 3", admitted)
	}
	if g := metricValue(t, f.l.met.fallbackActive); g != 1 {
		t.Fatalf("fallback gauge %v during the outage", g)
	}
	if n := metricValue(t, f.l.met.breakerTrips); n != 1 {
		t.Fatalf("breaker trips %v, want 1", n)
	}
	if n := metricValue(t, f.l.met.local.WithLabelValues("test", "allowed")); n != 3 {
		t.Fatalf("local decisions allowed %v, want 3", n)
	}
	if n := strings.Count(f.logs.String(), "redis unreachable"); n != 1 {
		t.Fatalf("%d outage log lines, want 1:\n%s", n, f.logs)
	}
	f.mini.SetError("")
	deadline := time.Now().Add(5 * time.Second)
	for f.l.breaker.isOpen() {
		if time.Now().After(deadline) {
			t.Fatal("did not return to shared limiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// 1 shared + 3 local (reconciled with this round trip) + this one.
	if d := f.allow(t, "k", p); d.Degraded || !d.Allowed() || d.Windows[0].Remaining != 5 {
		t.Fatalf("after recovery: %+v, want the shared count with the local admissions added (5 remaining)", d)
	}
	if g := metricValue(t, f.l.met.fallbackActive); g != 0 {
		t.Fatalf("fallback gauge %v after recovery", g)
	}
	if s := metricValue(t, f.l.met.fallbackSeconds); s < 0.8 {
		t.Fatalf("fallback seconds %v, want about 0.9 (the clock moved 0.9 s with the breaker open)", s)
	}
	if n := strings.Count(f.logs.String(), "reachable again"); n != 1 {
		t.Fatalf("%d recovery log lines, want 1:\n%s", n, f.logs)
	}
	if got := metricValue(t, f.l.met.redisErrors); got < 1 {
		t.Fatalf("redis errors %v", got)
	}
}

// TestBlipDoesNotTrip: a failed round trip decides its own request from
// local state and nothing else: no trip, no log line, and the next request
// is shared again.
func TestBlipDoesNotTrip(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 3, ProbeInterval: 10 * time.Millisecond, Timeout: time.Second, MaxLease: 1})
	p := perMinute(5)
	for range 3 {
		f.allow(t, "k", p) // 2 remain: this replica's share is 0
	}
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	for range 2 {
		if d := f.allow(t, "k", p); !d.Degraded || d.Allowed() {
			t.Fatalf("during a blip with a share of 0: %+v, want refused locally", d)
		}
	}
	f.mini.SetError("")
	if d := f.allow(t, "k", p); d.Degraded || !d.Allowed() || d.Windows[0].Remaining != 1 {
		t.Fatalf("after the blip: %+v, want shared again with 1 remaining", d)
	}
	if f.l.breaker.isOpen() || metricValue(t, f.l.met.breakerTrips) != 0 || strings.Contains(f.logs.String(), "unreachable") {
		t.Fatalf("a blip tripped the breaker:\n%s", f.logs)
	}
	// A key never seen gets max(1, floor(5/3)) = 1 per window.
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	got := 0
	for range 4 {
		if d := f.allow(t, "fresh", p); d.Allowed() {
			got++
		}
	}
	if got != 1 {
		t.Fatalf("unseen key admitted %d during a blip, want 1", got)
	}
}

func TestFailClosed(t *testing.T) {
	t.Parallel()
	// No leases: a lease granted before Redis failed is spent from
	// memory, as it was counted when granted; this is about round trips.
	f := newFixture(t, Options{FailureMode: FailClosed, ProbeInterval: 10 * time.Millisecond, Timeout: time.Second, MaxLease: 1})
	p := perMinute(10)
	f.allow(t, "k", p)
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	for range 3 {
		if _, err := f.l.Allow(context.Background(), "k", p); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err %v, want ErrUnavailable", err)
		}
	}
	if _, err := f.l.Usage(context.Background(), "k", p); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("usage err %v, want ErrUnavailable", err)
	}
	// Three failures at one instant are a blip, not an outage: the very
	// next request is shared again, with no wait for a probe.
	f.mini.SetError("")
	if d, err := f.l.Allow(context.Background(), "k", p); err != nil || !d.Allowed() || d.Degraded {
		t.Fatalf("after the blip: %+v %v", d, err)
	}
	// Failures that persist for TripAfter trip the breaker: from then on
	// refusals come at once, and the probe ends them.
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	for !f.l.breaker.isOpen() {
		if _, err := f.l.Allow(context.Background(), "k", p); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err %v, want ErrUnavailable", err)
		}
		f.clk.Add(300 * time.Millisecond)
	}
	f.mini.SetError("")
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := f.l.Allow(context.Background(), "k", p)
		if err == nil {
			if !d.Allowed() || d.Degraded {
				t.Fatalf("after recovery %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("did not recover")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFailClosedSpendsHeldLeases: failing closed admits nothing Redis
// has not counted. A lease granted before Redis failed was counted when
// granted, so its admissions are spent from memory, to the last; the
// request after them is refused as unavailable.
func TestFailClosedSpendsHeldLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{FailureMode: FailClosed, Timeout: time.Second})
	busy := perMinute(10_000)
	left := leaseBusy(t, f, "k", busy)
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	for i := range left {
		d, err := f.l.Allow(context.Background(), "k", busy)
		if err != nil || !d.Allowed() || !d.Leased {
			t.Fatalf("leased admission %d of %d: %+v %v, want spent from the lease", i+1, left, d, err)
		}
	}
	if _, err := f.l.Allow(context.Background(), "k", busy); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after the lease: err %v, want ErrUnavailable", err)
	}
}

// TestFailClosedAdmitsOnlyWhatRedisCounted checks the fail-closed
// promise over generated plans (one window, or a short one and a day),
// replica counts and rates: once Redis fails, a replica admits only from
// leases it held (each admission Leased, no more of them than the leases
// held when Redis failed, none after its lease's end), and nothing once
// they end: a second at most. Half the cases run with blocks in force
// (finalized, as a fresh install of the chart runs) at a pace that earns
// them, where a block held when Redis failed is spent until its end, up
// to blockLife later.
func TestFailClosedAdmitsOnlyWhatRedisCounted(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 89)
	blockCases, lateCases := 0, 0
	for c := range testenv.Cases(t, 8, 24) {
		replicas := 1 + rng.IntN(3)
		blocks := c%2 == 1
		w := Window{Limit: 200 + rng.Int64N(100_000), Period: time.Second * time.Duration(1+rng.IntN(3600))}
		rate := 50 + rng.Float64()*350 // the fleet's requests a second
		before := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		if blocks {
			// Too slow to lease a bucket, and history enough to be
			// granted blocks.
			rate = (0.5 + rng.Float64()*6) * float64(replicas)
			before = 5*time.Second + time.Duration(rng.Int64N(int64(25*time.Second)))
		}
		p := Policy{Name: "closed", Windows: []Window{w}}
		if rng.IntN(2) == 0 {
			p.Windows = append(p.Windows, Window{Limit: 100 * w.Limit, Period: 24 * time.Hour})
		}
		f := newFixtureWith(t, Options{FailureMode: FailClosed, Replicas: replicas}, hooks{blocks: blocks})
		ls := f.fleet(t, replicas)
		next := func() time.Duration { return time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) }
		for end := f.clk.Now().Add(before); f.clk.Now().Before(end); f.clk.Add(next()) {
			if _, err := ls[rng.IntN(replicas)].Allow(context.Background(), "k", p); err != nil {
				t.Fatalf("case %d before the failure: %v", c, err)
			}
		}
		var held, heldBlocks int64
		ends := make([]time.Time, replicas) // each replica's lease's end, on its clock
		for i, l := range ls {
			left := leaseLeft(l, "k")
			held += left
			if left > 0 {
				ends[i] = time.Unix(0, leaseEntryField(l, "k", func(e *leaseEntry) int64 { return e.deadline.UnixNano() }))
				heldBlocks += blockLeft(l, "k")
			}
		}
		if heldBlocks > 0 {
			blockCases++
		}
		f.mini.SetError("LOADING Redis is loading the dataset in memory")
		failed := f.clk.Now()
		var admitted int64
		var lastAdmitted time.Duration // after the failure
		for ; f.clk.Now().Sub(failed) < blockLife+time.Second; f.clk.Add(next()) {
			i := rng.IntN(replicas)
			d, err := ls[i].Allow(context.Background(), "k", p)
			switch {
			case err == nil && d.Allowed() && !d.Leased:
				t.Fatalf("case %d: %s after Redis failed: admitted without a lease: %+v", c, f.clk.Now().Sub(failed), d)
			case err == nil && d.Allowed():
				admitted++
				lastAdmitted = f.clk.Now().Sub(failed)
				if !f.clk.Now().Before(ends[i]) {
					t.Fatalf("case %d: replica %d admitted from a lease %s after Redis failed, past the end (%s after) of the lease it held then",
						c, i, f.clk.Now().Sub(failed), ends[i].Sub(failed))
				}
				if el := f.clk.Now().Sub(failed); heldBlocks == 0 && el >= leaseLife || el >= blockLife {
					t.Fatalf("case %d: admitted from a lease %s after Redis failed, past any lease's life", c, el)
				}
			case err != nil && !errors.Is(err, ErrUnavailable):
				t.Fatalf("case %d: err %v, want ErrUnavailable", c, err)
			}
		}
		t.Logf("case %d: %d replicas, %v at %.1f/s: %d admitted from the %d admissions held when Redis failed (%d of them in blocks), the last %s after it",
			c, replicas, p.Windows, rate, admitted, held, heldBlocks, lastAdmitted.Round(time.Millisecond))
		if lastAdmitted >= leaseLife {
			lateCases++
		}
		if admitted > held {
			t.Fatalf("case %d: %d admitted after Redis failed, more than the %d leases held", c, admitted, held)
		}
	}
	if blockCases == 0 || lateCases == 0 {
		t.Fatalf("%d cases held a block when Redis failed, %d spent one past a lease's life: the promise went unexercised with blocks", blockCases, lateCases)
	}
}

func TestCacheBatchesStrikesAndBansOnTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "flood", Windows: []Window{{Limit: 10, Period: time.Minute}},
		Ban: BanPolicy{Threshold: 100, StrikeWindow: time.Minute, Base: time.Hour}}
	for range 10 {
		f.allow(t, "k", p)
	}
	before := f.cmds.n.Load()
	const flood = 2000
	for i := 1; i <= flood; i++ {
		d := f.allow(t, "k", p)
		switch {
		case i <= 100 && d.Outcome != Limited:
			t.Fatalf("rejection %d: %+v, want limited", i, d)
		case i == 101 && (d.Outcome != Banned || d.Cached):
			t.Fatalf("rejection 101 (strike 101 > threshold 100): %+v, want a fresh ban", d)
		case i > 101 && (d.Outcome != Banned || !d.Cached):
			t.Fatalf("rejection %d: %+v, want banned from the cache", i, d)
		}
	}
	per := float64(f.cmds.n.Load()-before) / flood
	t.Logf("%.4f commands per rejected request", per)
	if per > 0.05 {
		t.Fatalf("%.4f commands per rejected request, want <= 0.05", per)
	}
	// Time alone also flushes strikes: a slow trickle still reaches Redis.
	q := Policy{Name: "trickle", Windows: []Window{{Limit: 1, Period: time.Hour}},
		Ban: BanPolicy{Threshold: 5, StrikeWindow: time.Hour, Base: time.Hour}}
	f.allow(t, "t", q)
	for range 4 {
		f.allow(t, "t", q)
		f.clk.Add(300 * time.Millisecond)
	}
	u, _ := f.l.Usage(context.Background(), "t", q)
	if u.Strikes < 3 {
		t.Fatalf("strikes %d in Redis after a slow trickle, want them flushed", u.Strikes)
	}
}

func TestUnbanReachesEveryReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	other, err := newLimiter(f.rdb, Options{Timeout: 2 * time.Second}, hooks{clock: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	p := Policy{Name: "u", Windows: []Window{{Limit: 1, Period: time.Second}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Hour}}
	f.allow(t, "k", p)
	f.allow(t, "k", p)
	if d := f.allow(t, "k", p); d.Outcome != Banned {
		t.Fatalf("want banned, got %+v", d)
	}
	ctx := context.Background()
	if d, _ := other.Allow(ctx, "k", p); d.Outcome != Banned {
		t.Fatalf("other replica: %+v", d)
	}
	if d := f.allow(t, "k", p); !d.Cached {
		t.Fatalf("want the ban cached: %+v", d)
	}
	// Subscriptions are set up asynchronously; give them a moment.
	time.Sleep(100 * time.Millisecond)
	if err := other.Unban(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	f.clk.Add(time.Second)
	deadline := time.Now().Add(2 * time.Second)
	for {
		d := f.allow(t, "k", p)
		if d.Allowed() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %+v after Unban on another replica", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if u, _ := f.l.Usage(ctx, "k", p); !u.BannedUntil.IsZero() || u.Strikes != 0 {
		t.Fatalf("usage after unban %+v", u)
	}
}

func TestLocalLimiter(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{}
	clk.Set(epoch)
	l, err := newLimiter(nil, Options{}, hooks{clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	p := Policy{Name: "l", Windows: []Window{{Limit: 2, Period: time.Minute}},
		Ban: BanPolicy{Threshold: 2, StrikeWindow: time.Minute, Base: 5 * time.Minute, Memory: time.Hour}}
	var ds []Decision
	for range 5 {
		d, err := l.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	want := []Outcome{Allowed, Allowed, Limited, Limited, Banned}
	for i, d := range ds {
		if d.Outcome != want[i] || d.Degraded {
			t.Fatalf("request %d: %+v, want %s", i, d, want[i])
		}
	}
	if ds[2].RetryAfter != time.Minute || ds[4].RetryAfter != 5*time.Minute {
		t.Fatalf("retry %s / %s", ds[2].RetryAfter, ds[4].RetryAfter)
	}
	u, err := l.Usage(ctx, "k", p)
	if err != nil || u.Windows[0].Used != 2 || u.BannedUntil.IsZero() || u.Offences != 1 {
		t.Fatalf("usage %+v %v", u, err)
	}
	if err := l.Unban(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "k", p); d.Outcome != Limited {
		t.Fatalf("after unban: %+v, want limited (the window is still full)", d)
	}
	clk.Add(time.Minute)
	if d, _ := l.Allow(ctx, "k", p); !d.Allowed() {
		t.Fatalf("after a minute: %+v", d)
	}
}

func TestResetForgetsCountsStrikesAndBansOnEveryReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	other, err := newLimiter(f.rdb, Options{Timeout: 2 * time.Second}, hooks{clock: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	p := Policy{Name: "r", Windows: []Window{{Limit: 2, Period: time.Hour}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Hour}}
	for range 4 {
		f.allow(t, "k", p)
	}
	ctx := context.Background()
	if d, _ := other.Allow(ctx, "k", p); d.Outcome != Banned {
		t.Fatalf("other replica before reset: %+v", d)
	}
	// Subscriptions are set up asynchronously; give them a moment.
	time.Sleep(100 * time.Millisecond)
	if err := f.l.Reset(ctx, "k", p); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		d, err := other.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed() {
			if d.Bound().Remaining != 1 {
				t.Fatalf("after reset the window should count only this request: %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %+v after Reset on another replica", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	u, err := f.l.Usage(ctx, "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if !u.BannedUntil.IsZero() || u.Strikes != 0 || u.Offences != 0 || u.Windows[0].Used != 1 {
		t.Fatalf("usage after reset %+v", u)
	}
}

// TestReconcileSendsWhatEachWindowStillCounts: after an outage of several
// minutes, the first round trip adds to the minute window only the local
// admissions of the last minute, and to the hour window all of them, so a
// long outage is not followed by a full minute of refusals.
func TestReconcileSendsWhatEachWindowStillCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 3, ProbeInterval: 10 * time.Millisecond, Timeout: time.Second, MaxLease: 1})
	p := Policy{Name: "r", Windows: []Window{{Limit: 30, Period: time.Minute}, {Limit: 1000, Period: time.Hour}}}
	f.allow(t, "k", p)
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	var local []time.Time
	for range 90 {
		f.clk.Add(2 * time.Second)
		if d := f.allow(t, "k", p); d.Allowed() {
			if !d.Degraded {
				t.Fatalf("shared decision during the outage: %+v", d)
			}
			local = append(local, f.clk.Now())
		}
	}
	if !f.l.breaker.isOpen() {
		t.Fatal("three minutes of failures did not trip the breaker")
	}
	f.mini.SetError("")
	deadline := time.Now().Add(5 * time.Second)
	for f.l.breaker.isOpen() {
		if time.Now().After(deadline) {
			t.Fatal("did not return to shared limiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	now := f.clk.Now()
	recent := 0
	for _, at := range local {
		if now.Sub(at) < time.Minute {
			recent++
		}
	}
	d := f.allow(t, "k", p)
	if d.Degraded || !d.Allowed() {
		t.Fatalf("after recovery: %+v", d)
	}
	if got, want := d.Windows[0].Remaining, int64(30-recent-1); got != want {
		t.Fatalf("minute window after recovery: %d remaining, want %d (the %d local admissions of the last minute, of %d)", got, want, recent, len(local))
	}
	if got, want := d.Windows[1].Remaining, int64(1000-1-len(local)-1); got != want {
		t.Fatalf("hour window after recovery: %d remaining, want %d (all %d local admissions)", got, want, len(local))
	}
	t.Logf("%d local admissions in 3 minutes (share 10/min of 30/min over 3 replicas), %d in the last minute", len(local), recent)
}
