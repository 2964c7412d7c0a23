package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// leaseLeft returns the admissions left in key's lease.
func leaseLeft(l *Limiter, key string) int64 {
	return leaseEntryField(l, key, func(e *leaseEntry) int64 { return e.left })
}

// leaseEntryField returns field of key's lease-table entry, 0 without one.
func leaseEntryField(l *Limiter, key string, field func(*leaseEntry) int64) int64 {
	sh := l.lease.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		return field(e)
	}
	return 0
}

// TestLeaseEndsWithItsBucket takes a lease and checks that it is spent
// only until it ends (here the lease life, inside a 3s bucket), less the
// microsecond the server's clock resolution costs: 2µs before, a request
// is answered from it; 1µs before, Redis decides again.
// Remaining counts down as if every request had gone to Redis, and the
// window's reset is measured from the lease's end.
func TestLeaseEndsWithItsBucket(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "lease", Windows: []Window{{Limit: 200, Period: 10 * time.Minute}, {Limit: 100_000, Period: 24 * time.Hour}}}
	// The start of a 3s bucket of the 10-minute window.
	t0 := epoch.Truncate(time.Hour).Add(time.Hour)
	f.clk.Set(t0)
	var leaseAt time.Time
	for i := range 40 {
		before := f.cmds.scripts.Load()
		d := f.allow(t, "k", p)
		if !d.Allowed() || d.Windows[0].Remaining != int64(199-i) {
			t.Fatalf("request %d: %+v, want admitted with %d remaining", i, d, 199-i)
		}
		if !d.Time.Equal(f.clk.Now()) {
			t.Fatalf("request %d decided at %s, want %s", i, d.Time, f.clk.Now())
		}
		if sent := f.cmds.scripts.Load() > before; sent == d.Leased {
			t.Fatalf("request %d: leased %v, but a command sent: %v", i, d.Leased, sent)
		}
		if !d.Leased && leaseLeft(f.l, "k") >= 2 {
			leaseAt = f.clk.Now()
			break
		}
		f.clk.Add(10 * time.Millisecond)
	}
	if leaseAt.IsZero() {
		t.Fatal("no lease of 3 or more for a key sending 100 requests/s")
	}
	leased := testenv.CounterSum(t, f.reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "lease"})
	end := leaseAt.Add(leaseLife)
	f.clk.Set(end.Add(-2 * time.Microsecond))
	before := f.cmds.scripts.Load()
	d := f.allow(t, "k", p)
	if !d.Leased || f.cmds.scripts.Load() != before || !d.Time.Equal(f.clk.Now()) {
		t.Fatalf("2µs before the lease ends: %+v (%d commands), want answered from the lease", d, f.cmds.scripts.Load()-before)
	}
	if got := testenv.CounterSum(t, f.reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "lease"}); got != leased+1 {
		t.Fatalf("leased_total %v after a leased admission, want %v", got, leased+1)
	}
	u, err := f.l.Usage(context.Background(), "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if want := end.Add(10 * time.Minute); u.Windows[0].Reset.Before(want) {
		t.Fatalf("reset %s, want no earlier than the lease's end plus the period, %s", u.Windows[0].Reset, want)
	}
	f.clk.Set(end.Add(-time.Microsecond))
	before = f.cmds.scripts.Load()
	left := leaseLeft(f.l, "k")
	d = f.allow(t, "k", p)
	if d.Leased || f.cmds.scripts.Load() == before || left == 0 {
		t.Fatalf("1µs before the lease's end (%d left in it): %+v, want a round trip", left, d)
	}
	// The admissions left in the lease stay counted, so Remaining drops
	// by them.
	u, _ = f.l.Usage(context.Background(), "k", p)
	if d.Windows[0].Remaining > u.Windows[0].Remaining+d.Windows[0].Limit {
		t.Fatalf("remaining %d after the lease vs %d in Redis", d.Windows[0].Remaining, u.Windows[0].Remaining)
	}
}

// TestLeaseStopsNearTheLimit checks that a key nearing its limit is decided
// one request per round trip, so that it gets exactly its limit.
func TestLeaseStopsNearTheLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 2})
	p := perMinute(300)
	admitted, leased := 0, 0
	var last Decision
	for range 400 {
		d := f.allow(t, "k", p)
		if d.Allowed() {
			admitted++
		}
		if d.Leased {
			leased++
			// A lease is granted only while 4·k·Replicas remain.
			if d.Windows[0].Remaining < 4*2 {
				t.Fatalf("leased admission with %d remaining", d.Windows[0].Remaining)
			}
		}
		last = d
		f.clk.Add(time.Millisecond)
	}
	if admitted != 300 || leased == 0 || last.Outcome != Limited {
		t.Fatalf("admitted %d (%d leased), last %+v: want exactly the limit, some of it leased", admitted, leased, last)
	}
}

// TestLeaseDroppedOnPolicyChange checks a lease taken under one policy is
// not spent under another.
func TestLeaseDroppedOnPolicyChange(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := perMinute(10_000)
	for range 20 {
		f.allow(t, "k", p)
	}
	if leaseLeft(f.l, "k") == 0 {
		t.Fatal("no lease after 20 requests at once")
	}
	q := perMinute(20_000)
	before := f.cmds.scripts.Load()
	if d := f.allow(t, "k", q); d.Leased || f.cmds.scripts.Load() == before || d.Windows[0].Limit != 20_000 {
		t.Fatalf("after a policy change: %+v, want decided by Redis under the new policy", d)
	}
}

// TestMaxLeaseOneDisablesLeasing checks Options.MaxLease: 1 sends every
// admission to Redis.
func TestMaxLeaseOneDisablesLeasing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{MaxLease: 1})
	p := perMinute(10_000)
	f.allow(t, "warm-up", p) // loads the script if the preload has not yet
	before := f.cmds.scripts.Load()
	for range 50 {
		if d := f.allow(t, "k", p); d.Leased {
			t.Fatalf("leased with MaxLease 1: %+v", d)
		}
	}
	if n := f.cmds.scripts.Load() - before; n != 50 {
		t.Fatalf("%d commands for 50 admissions, want 50", n)
	}
}

// TestLeasesStrictAcrossReplicas runs three limiters (replicas) on one
// key with bursty random traffic, on one clock, and checks every window
// over the actual admission times: leased admissions included, and
// whichever replica granted them.
func TestLeasesStrictAcrossReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 3, Buckets: 10, CacheSize: -1})
	var ls []*Limiter
	ls = append(ls, f.l)
	for _, cache := range []int{0, -1} {
		l, err := newLimiter(f.rdb, Options{Replicas: 3, Buckets: 10, CacheSize: cache, Timeout: 2 * time.Second}, hooks{clock: f.clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls = append(ls, l)
	}
	p := Policy{Name: "s", Windows: []Window{{Limit: 300, Period: time.Second}, {Limit: 1200, Period: 5 * time.Second}}}
	rng := rand.New(rand.NewPCG(5, 6))
	ctx := context.Background()
	var admitted []int64
	leased, limited := 0, 0
	before := f.cmds.scripts.Load()
	for range testenv.Cases(t, 1500, 6000) {
		// Bursts at ~400/s, lulls at ~100/s.
		mean := 2500 * time.Microsecond
		if f.clk.Now().UnixMilli()/700%3 == 0 {
			mean = 10 * time.Millisecond
		}
		f.clk.Add(time.Duration(rng.ExpFloat64() * float64(mean)))
		d, err := ls[rng.IntN(len(ls))].Allow(ctx, "k", p)
		if err != nil || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		switch {
		case d.Leased:
			leased++
		case !d.Allowed():
			limited++
		}
		if d.Allowed() {
			// Redis reads its clock in µs: a lease's times may be up to
			// 1µs early.
			if dt := f.clk.Now().Sub(d.Time); dt < 0 || dt >= time.Microsecond {
				t.Fatalf("admission at %s reported at %s", f.clk.Now(), d.Time)
			}
			admitted = append(admitted, f.clk.Now().UnixMicro())
		}
	}
	slices.Sort(admitted)
	for _, w := range p.Windows {
		checkStrict(t, admitted, w)
	}
	cmds := f.cmds.scripts.Load() - before
	t.Logf("%d admitted (%d leased), %d limited, %d commands", len(admitted), leased, limited, cmds)
	// (A quarter to a fifth of admissions are leased: the key bursts at
	// 400/s on three replicas, with 100 ms buckets.)
	if leased < len(admitted)/5 || limited == 0 {
		t.Fatalf("%d of %d admissions leased, %d limited: traffic did not exercise leases near the limit", leased, len(admitted), limited)
	}
}

// TestLeasePacingAdmitsNearlyAll paces a busy key at exactly its limit with
// leasing on: leases taken while the window was filling must not cost the
// steady state more than 1%.
func TestLeasePacingAdmitsNearlyAll(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	f := newFixture(t, Options{CacheSize: -1})
	p := perMinute(1500)
	step := time.Minute / 1500
	n, leased := 0, 0
	total := 4 * 1500
	for i := range total {
		f.clk.Set(epoch.Add(time.Duration(i) * step))
		d := f.allow(t, "pace", p)
		if d.Leased {
			leased++
		}
		if d.Allowed() && i >= 1500 {
			n++
		}
	}
	frac := float64(n) / float64(total-1500)
	t.Logf("paced at 25/s: %.4f of the limit admitted, %d leased", frac, leased)
	if leased == 0 {
		t.Fatal("no leases: the test does not exercise them")
	}
	if frac < 0.99 {
		t.Fatalf("admitted %.4f of the limit", frac)
	}
}

// leaseCapCase is the scenario of the lease cap: replica a holds a lease
// of the key under plan pa (a limit of 200 on a ten-minute window) when
// replica b, still on another plan pb for the key (260 on the same
// window), admits all it can; then a spends its lease. Without the cap, b
// would fill the window to 260 and a's leased admissions would land in a
// window past their plan's 200. advance moves the clock (the fixture's, or
// real time's); the admission times are Redis's.
type leaseCapCase struct {
	a, b    *Limiter
	advance func(time.Duration)
	now     func() time.Time
}

var (
	leaseCapA = Policy{Name: "a", Windows: []Window{{Limit: 200, Period: 10 * time.Minute}}}
	leaseCapB = Policy{Name: "b", Windows: []Window{{Limit: 260, Period: 10 * time.Minute}}}
)

// run plays the scenario and returns every admission's time (µs) with
// the limit of the plan that admitted it, b's first refusal, and how many
// of a's admissions after it came from its lease.
func (c leaseCapCase) run(t *testing.T) (times, limits []int64, refusal Decision, refusedAt time.Time, leasedAfter int) {
	t.Helper()
	ctx := context.Background()
	admit := func(l *Limiter, p Policy) Decision {
		d, err := l.Allow(ctx, "k", p)
		if err != nil || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Allowed() {
			times, limits = append(times, d.Time.UnixMicro()), append(limits, p.Windows[0].Limit)
		}
		return d
	}
	for range 40 {
		if d := admit(c.a, leaseCapA); !d.Leased && leaseLeft(c.a, "k") >= 2 {
			break
		}
		c.advance(10 * time.Millisecond)
	}
	if leaseLeft(c.a, "k") < 2 {
		t.Fatal("no lease of 2 or more for a key sending 100 requests/s")
	}
	for range 300 {
		c.advance(time.Millisecond)
		if d := admit(c.b, leaseCapB); !d.Allowed() {
			refusal, refusedAt = d, c.now()
			break
		}
	}
	if refusal.Outcome != Limited {
		t.Fatalf("b was never refused: %d admissions", len(times))
	}
	for leaseLeft(c.a, "k") > 0 {
		c.advance(time.Millisecond)
		if d := admit(c.a, leaseCapA); d.Leased {
			leasedAfter++
		}
	}
	return times, limits, refusal, refusedAt, leasedAfter
}

// checkHeldToTheirPlans fails unless every admission found the window,
// itself included and by the actual admission times, within the limit of
// the plan that admitted it.
func checkHeldToTheirPlans(t *testing.T, times, limits []int64, period time.Duration) {
	t.Helper()
	p := period.Microseconds()
	for i, x := range times {
		n := int64(0)
		for _, y := range times[:i+1] {
			if y > x-p {
				n++
			}
		}
		if n > limits[i] {
			t.Fatalf("admission %d at %d µs found %d in its window, past its plan's %d", i, x, n, limits[i])
		}
	}
}

// TestLeaseHoldsOtherPlansToItsLimit: while a lease granted under one
// plan may still be spent, a replica on another plan with a higher limit
// is held to the lease's limit on the window they share, so that every
// admission, leased ones when spent, stays within its own plan's limit.
// The refused request's Retry-After is exact: the lease's end, when b's
// own limit applies again (1 µs before it, still refused).
func TestLeaseHoldsOtherPlansToItsLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 1})
	b, err := newLimiter(f.rdb, Options{Replicas: 1, CacheSize: -1, Timeout: 2 * time.Second, Registerer: prometheus.NewRegistry()}, hooks{clock: f.clk.Now, noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// The start of a 3s bucket of the ten-minute window.
	f.clk.Set(epoch.Truncate(time.Hour).Add(time.Hour))
	c := leaseCapCase{a: f.l, b: b, advance: func(d time.Duration) { f.clk.Add(d) }, now: f.clk.Now}
	times, limits, refusal, refusedAt, leasedAfter := c.run(t)
	checkHeldToTheirPlans(t, times, limits, 10*time.Minute)
	if leasedAfter == 0 {
		t.Fatal("a spent nothing of its lease after b was refused: the case did not exercise the cap")
	}
	// b was refused at 200 in the window (a's lease counted whole), short
	// of its own 260: until the lease ends.
	if w := refusal.Windows[0]; w.Limit != 260 || w.Remaining != 60 {
		t.Fatalf("b's refusal reports %+v, want its own limit, 260, with 60 remaining", w)
	}
	end := refusedAt.Add(refusal.RetryAfter)
	f.clk.Set(end.Add(-time.Microsecond))
	if d, _ := b.Allow(context.Background(), "k", leaseCapB); d.Allowed() {
		t.Fatalf("b admitted 1µs before its Retry-After (%s after its refusal): %+v", refusal.RetryAfter, d)
	}
	f.clk.Set(end)
	if d, _ := b.Allow(context.Background(), "k", leaseCapB); !d.Allowed() {
		t.Fatalf("b refused at its Retry-After (%s after its refusal): %+v", refusal.RetryAfter, d)
	}
}

// TestLeaseCapRefusalWaitsUntilTheWindowFitsUnderIt: a request held by
// another plan's lease cap is admitted again at whichever comes first,
// the cap's end or enough of the window sliding out to fit under the
// cap, so its Retry-After is the earlier. Generated periods and limits:
// plan X (the higher limit) admits a few requests; a period later, just
// before they slide out, plan Y (the lower limit) takes a lease, which
// ends with the window's bucket, after they have slid out; X then sends
// until the cap refuses it. Its Retry-After is exact (a peek 1 µs before
// it refused, at it admitted), and falls before the lease's end; every
// admission fits its plan's window.
func TestLeaseCapRefusalWaitsUntilTheWindowFitsUnderIt(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 106)
	cases, early := testenv.Cases(t, 10, max(*invariantCases/2, 40)), 0
	for range cases {
		if runLeaseCapUnder(t, rng) {
			early++
		}
	}
	t.Logf("%d cases of %d were admitted again before the lease ended", early, cases)
	if early < cases/2 {
		t.Fatalf("%d cases of %d were admitted again before the lease ended: the cases should exercise it", early, cases)
	}
}

// runLeaseCapUnder plays one case of
// TestLeaseCapRefusalWaitsUntilTheWindowFitsUnderIt and reports whether
// X's Retry-After fell before the lease's end.
func runLeaseCapUnder(t *testing.T, rng *rand.Rand) bool {
	t.Helper()
	r := drawLeaseCap(t, rng)
	// X's first admissions slide out before the lease's end.
	slide := r.t1 + 2*r.unit + 200 + rng.Int64N(max(r.lend-r.t1-4*r.unit-400, 1))
	r.start(slide)
	defer r.mini.Close()
	// X sends until the cap refuses it: the window holds c.
	var refused verdict
	for range r.c + 1 {
		r.now++
		if refused = r.call(r.px, input{lease: noLease}); refused.outcome != Allowed {
			break
		}
		r.admit(r.px, r.now, "X's admission")
	}
	if refused.outcome == Allowed || r.now >= slide {
		t.Fatalf("%s: X not refused by the cap before %d", r.what, slide)
	}
	at := r.retryAfterExact(refused, slide)
	// Y spends its lease to its last microsecond, X sends once more.
	for range r.want - 1 {
		r.admit(r.py, r.lend-1, "Y's leased admission")
	}
	r.now = at
	if v := r.call(r.px, input{lease: noLease}); v.outcome == Allowed {
		r.admit(r.px, r.now, "X's admission after its Retry-After")
	}
	return at < r.lend
}

// TestLeaseCapRefusalOverItsOwnLimitWaitsForTheWindow: a request held by
// another plan's lease cap while its window is also over the request's
// own limit (a replica's report of what it admitted without Redis landed
// meanwhile) is admitted again only once the window fits its own limit,
// even after the cap has ended. Generated periods and limits: plan X
// (the higher limit) admits a few requests, which slide out a period on,
// after the lease's end; plan Y (the lower limit) takes a lease; while it
// lasts, a replica of X reports admissions that take the window to X's
// limit or past it, but not so far that X's first admissions sliding out
// leave it there. X's refusal's Retry-After is exact (a peek 1 µs before
// it refused, at it admitted) and falls after the lease's end: waiting
// for the cap's end alone is caught.
func TestLeaseCapRefusalOverItsOwnLimitWaitsForTheWindow(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 107)
	for range testenv.Cases(t, 10, max(*invariantCases/2, 40)) {
		runLeaseCapOver(t, rng)
	}
}

// runLeaseCapOver plays one case of
// TestLeaseCapRefusalOverItsOwnLimitWaitsForTheWindow.
func runLeaseCapOver(t *testing.T, rng *rand.Rand) {
	t.Helper()
	r := drawLeaseCap(t, rng)
	// The report takes the window to X's limit at least, and leaves it
	// under once X's first u0 admissions have slid out.
	report := r.lx - r.u0 - r.want + rng.Int64N(r.u0)
	r.what += fmt.Sprintf(", a report of %d", report)
	// X's first admissions slide out after the lease's end, before Y's
	// lease does.
	slide := r.lend + 2*r.unit + 200 + rng.Int64N(max(r.t1+r.pw-r.lend-4*r.unit-400, 1))
	r.start(slide)
	defer r.mini.Close()
	// While the lease lasts, X's request carries the report (admissions
	// made without Redis: not this test's log, whose windows they pass).
	r.now = r.t1 + 1 + rng.Int64N(max(r.lend-r.t1-2, 1))
	add := make([]int64, len(r.px.windows))
	for i := range add {
		add[i] = report
	}
	refused := r.call(r.px, input{add: add, lease: noLease})
	if refused.outcome == Allowed {
		t.Fatalf("%s: X admitted at %d with the window over its cap and its own limit", r.what, r.now)
	}
	if at := r.retryAfterExact(refused, slide); at <= r.lend {
		t.Fatalf("%s: X admitted again at %d, by the lease's end %d, though its first admissions slide out at %d", r.what, at, r.lend, slide)
	}
}

// leaseCapRig is a case of the lease-cap Retry-After tests above, on
// miniredis by its clock: plan X (the higher limit, lx) and plan Y (the
// lower, c: the cap) on one period of 1 s to an hour and up to a second
// more (half the time with a day beside), X's u0 first admissions a
// period before slide, and Y's lease of want granted at t1, early in a
// bucket of the window, ending at lend, with the bucket or a second on.
type leaseCapRig struct {
	t                  *testing.T
	px, py             *plan
	c, lx, u0, want    int64
	pw, unit, t1, lend int64
	what               string
	mini               *miniredis.Miniredis
	rdb                *redis.Client
	now                int64
	log                admissionLog
}

// drawLeaseCap draws a leaseCapRig's plans, limits and lease; start
// plays it up to the lease, on a miniredis of its own (the caller closes
// it).
func drawLeaseCap(t *testing.T, rng *rand.Rand) *leaseCapRig {
	t.Helper()
	p := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, time.Minute, 10 * time.Minute, time.Hour}[rng.IntN(6)] +
		time.Duration(rng.IntN(1000))*time.Millisecond
	r := &leaseCapRig{t: t, c: 10 + rng.Int64N(400)}
	r.lx = 2*r.c + rng.Int64N(1000)
	r.u0 = 1 + rng.Int64N(r.c/4)
	r.want = 2 + rng.Int64N(max((r.c-r.u0)/leaseMargin-2, 1))
	var day []Window
	if rng.IntN(2) == 0 {
		day = []Window{{Limit: 1_000_000, Period: 24 * time.Hour}}
	}
	r.py = compile(Policy{Name: "y", Windows: slices.Concat([]Window{{Limit: r.c, Period: p}}, day)}, DefaultBuckets, DefaultStrikeBuckets)
	r.px = compile(Policy{Name: "x", Windows: slices.Concat([]Window{{Limit: r.lx, Period: p}}, day)}, DefaultBuckets, DefaultStrikeBuckets)
	r.what = fmt.Sprintf("x %v, y %v with a lease of %d", r.px.policy.Windows, r.py.policy.Windows, r.want)
	g := r.py.windows[0].gran
	r.pw, r.unit = p.Microseconds(), r.py.windows[0].unit
	r.t1 = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	r.t1 = (r.t1/g+1)*g + rng.Int64N(g/10+1)
	r.lend = min((r.t1/g+1)*g, r.t1+leaseLife.Microseconds())
	return r
}

// start plays X's first admissions, a period before slide, then Y's
// lease at t1.
func (r *leaseCapRig) start(slide int64) {
	r.t.Helper()
	r.now = slide - r.pw
	r.mini, r.rdb = newMini(r.t, time.UnixMicro(r.now))
	for range r.u0 {
		if v := r.call(r.px, input{lease: noLease}); v.outcome != Allowed {
			r.t.Fatalf("%s: X's first admissions refused", r.what)
		}
		r.admit(r.px, r.now, "X's admission")
	}
	r.now = r.t1
	v := r.call(r.py, input{lease: leaseAsk{want: r.want, need: r.want * leaseMargin, life: leaseLife.Microseconds()}})
	if v.outcome != Allowed || v.granted != r.want || v.leaseEnd != r.lend {
		r.t.Fatalf("%s: Y asked a lease at %d: %v, %d granted until %d, want %d until %d", r.what, r.t1, v.outcome, v.granted, v.leaseEnd, r.want, r.lend)
	}
	r.admit(r.py, r.now, "Y's admission")
}

// call decides one request under pl at r.now.
func (r *leaseCapRig) call(pl *plan, in input) verdict {
	r.t.Helper()
	r.mini.SetTime(time.UnixMicro(r.now))
	return decideOne(r.t, r.rdb, r.mini, decision{keys: stateKeys("t:", "k", pl), pl: pl, nums: scriptNums(pl, in)}, pl, r.what)
}

// admit logs an admission under pl at x; the window must hold it.
func (r *leaseCapRig) admit(pl *plan, x int64, who string) {
	r.t.Helper()
	r.log.mustAdmit(r.t, pl, x, r.what, who)
}

// retryAfterExact checks X's refusal's Retry-After by peeks, refused 1 µs
// before it and admitted at it, and returns when that is.
func (r *leaseCapRig) retryAfterExact(refused verdict, slide int64) int64 {
	r.t.Helper()
	at := refused.now + refused.retry
	for _, x := range []int64{at - 1, at} {
		r.now = x
		if pk := r.call(r.px, input{lease: noLease, peek: true}); (pk.outcome == Allowed) != (x == at) {
			r.t.Fatalf("%s: X refused at %d with Retry-After %d µs (its first admissions slide out at %d, the lease ends at %d); at %d it is %v",
				r.what, refused.now, refused.retry, slide, r.lend, x, pk.outcome)
		}
	}
	return at
}

// TestLeaseHoldsOtherPlansToItsLimitOnRedis plays the same scenario on a
// real Redis, by real time, and checks the windows by Redis's times.
func TestLeaseHoldsOtherPlansToItsLimitOnRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := randomPrefix(t)
	var ls []*Limiter
	for _, cache := range []int{0, -1} {
		l, err := newLimiter(rdb, Options{Replicas: 1, CacheSize: cache, Prefix: prefix, Timeout: time.Second, Registerer: prometheus.NewRegistry()}, hooks{noHeartbeat: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	// A lease lasts to the end of the window's 3s bucket: start the case
	// just after one begins, so that it runs inside one bucket.
	time.Sleep(time.Until(time.Now().Truncate(3 * time.Second).Add(3*time.Second + 20*time.Millisecond)))
	c := leaseCapCase{a: ls[0], b: ls[1], advance: time.Sleep, now: time.Now}
	times, limits, _, _, leasedAfter := c.run(t)
	checkHeldToTheirPlans(t, times, limits, 10*time.Minute)
	if leasedAfter == 0 {
		t.Fatal("a spent nothing of its lease after b was refused: the case did not exercise the cap")
	}
}

// leaseCapPlans draws the plans of the lease cap's generated scenario:
// a's plan, with limits a case can reach, and b's, allowing more on some
// or all of the same windows (disagreeingPolicies), every window at least
// a minute long (atLeastAMinute); with the replica count and both paces.
func leaseCapPlans(rng *rand.Rand) (pa, pb Policy, replicas int, stepA, stepB time.Duration) {
	for {
		if base, ok := atLeastAMinute(genPolicies(rng, 24*time.Hour)[0]); ok {
			ps := disagreeingPolicies(rng, base)
			return ps[0], ps[1], 1 + rng.IntN(3), time.Duration(1+rng.Int64N(10)) * time.Millisecond,
				time.Duration(200+rng.Int64N(2800)) * time.Microsecond
		}
	}
}

// playLeaseCap plays the lease cap's scenario: replica a, on plan pa,
// sends every stepA until it holds a lease and falls quiet; b, on pb,
// sends every stepB until it is refused or a's lease is gone; then a
// spends what is left of its lease. Every admission, a's leased ones when
// spent, must find each window of its own plan, by its Decision.Time
// (Redis's clock), within that plan's limit. It returns how many of a's
// leased admissions came after b's traffic (none: the case did not
// exercise the cap). advance moves the clock (the fixture's, or real
// time's).
func playLeaseCap(t *testing.T, a, b *Limiter, key string, pa, pb Policy, stepA, stepB time.Duration, advance func(time.Duration)) (spent int) {
	t.Helper()
	var log admissionLog
	plans := map[string]*plan{pa.Name: compile(pa, DefaultBuckets, DefaultStrikeBuckets), pb.Name: compile(pb, DefaultBuckets, DefaultStrikeBuckets)}
	admit := func(l *Limiter, p Policy) Decision {
		d, err := l.Allow(context.Background(), key, p)
		if err != nil || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if !d.Allowed() {
			return d
		}
		x := d.Time.UnixMicro()
		if w, n := log.admit(plans[p.Name], x); w != nil {
			t.Fatalf("a %v every %s, b %v every %s: %s (leased %v) found %d admissions within %s ending at %d µs, past its plan's %d",
				pa, stepA, pb, stepB, p.Name, d.Leased, n, time.Duration(w.period)*time.Microsecond, x, w.limit)
		}
		return d
	}
	for range 400 {
		if d := admit(a, pa); !d.Allowed() || leaseLeft(a, key) >= 2 {
			break
		}
		advance(stepA)
	}
	if leaseLeft(a, key) < 2 {
		return 0 // no lease at this pace: nothing for the cap to hold
	}
	for range 4000 {
		advance(stepB)
		if d := admit(b, pb); !d.Allowed() || leaseLeft(a, key) == 0 {
			break
		}
	}
	for range 400 {
		advance(stepA)
		if d := admit(a, pa); d.Leased {
			spent++
		}
		if leaseLeft(a, key) == 0 {
			break
		}
	}
	return spent
}

// TestLeaseCapHoldsGeneratedPlans plays the lease cap's scenario
// (playLeaseCap) over generated plans, replica counts and paces on
// miniredis.
func TestLeaseCapHoldsGeneratedPlans(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 5)
	runLeaseCapCases(t, rng, testenv.Cases(t, 4, max(*invariantCases/2, 20)), func(t *testing.T, pa, pb Policy, replicas int, stepA, stepB time.Duration) int {
		f := newFixture(t, Options{Replicas: replicas})
		b, err := newLimiter(f.rdb, Options{Replicas: replicas, Timeout: 2 * time.Second, Registerer: prometheus.NewRegistry()}, hooks{clock: f.clk.Now, noHeartbeat: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		f.clk.Add(time.Duration(rng.Int64N(int64(time.Minute))))
		return playLeaseCap(t, f.l, b, "k", pa, pb, stepA, stepB, func(d time.Duration) { f.clk.Add(d) })
	})
}

// runLeaseCapCases runs n generated cases of the lease cap's scenario
// with play, which returns how many leased admissions a case spent after
// the other plan's traffic; some case must have spent some.
func runLeaseCapCases(t *testing.T, rng *rand.Rand, n int, play func(t *testing.T, pa, pb Policy, replicas int, stepA, stepB time.Duration) int) {
	exercised := 0
	for c := range n {
		pa, pb, replicas, stepA, stepB := leaseCapPlans(rng)
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			if play(t, pa, pb, replicas, stepA, stepB) > 0 {
				exercised++
			}
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("%d cases spent a lease after the other plan's traffic", exercised)
	if exercised == 0 {
		t.Fatal("no case spent a lease after the other plan's traffic: the cap went unexercised")
	}
}

// TestLeaseCapHoldsGeneratedPlansOnRedis plays generated cases of the
// same scenario on a real Redis, by real time (fewer: each takes up to a
// second).
func TestLeaseCapHoldsGeneratedPlansOnRedis(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, 6)
	runLeaseCapCases(t, rng, 24, func(t *testing.T, pa, pb Policy, replicas int, stepA, stepB time.Duration) int {
		ls := replicasOn(t, rdb, 2, replicas)
		return playLeaseCap(t, ls[0], ls[1], "k", pa, pb, stepA, stepB, time.Sleep)
	})
}

// TestLeaseWasteUnderRandomArrivals sends a key at random (Poisson)
// arrivals to a fleet of one to four replicas that spreads it at random,
// at generated rates from 10 to 150 of a replica's requests a second
// (steady in half the cases; in the other half dropping to a fifth of it
// for every other 5 s), 40 s a case, on a plan far from its limit, and
// checks both sides of a lease's size: what leases leave unspent
// (admissions counted in every window of the key that no request used,
// which bring it nearer its limits for nothing, its day's too), and how
// many requests leases answer (each other one is a round trip). Sized at
// the expected demand, leases left 10.9-11.6% of their admissions unspent
// here (up to 29% a case; four seeds) and answered 88-89% of requests;
// half a deviation below it, 5.6-6.6% (at most 19% a case, at the lowest
// rates, where a lease is two or three) and 83-86% (ten seeds). Sized by
// the key's rate over 10-20 s alone, 14-16%: a key that slows down wastes
// its leases. Pooled over the cases, at most 8% of leased admissions may
// go unspent, and no case more than 25%; leases must answer at least 78%
// of requests.
func TestLeaseWasteUnderRandomArrivals(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	rng := invariantRNG(t, 73)
	p := Policy{Name: "busy", Windows: []Window{{Limit: 1_000_000, Period: time.Minute}, {Limit: 100_000_000, Period: 24 * time.Hour}}}
	var granted, unspent, requests, leased int64
	for c := range 12 {
		// Rates stratified over the range, two cases (steady, stepping)
		// a stratum, so that each seed's mix of cases is alike.
		replicas := 1 + rng.IntN(4)
		per := 10 + (float64(c/2)+rng.Float64())*140/6 // a replica's requests a second
		steps := c%2 == 1
		f := newFixture(t, Options{Replicas: replicas})
		ls := f.fleet(t, replicas)
		var g, spent, n int64
		for el := time.Duration(0); el < 40*time.Second; el = f.clk.Now().Sub(epoch) {
			l := ls[rng.IntN(replicas)]
			d, err := l.Allow(context.Background(), "k", p)
			if err != nil || !d.Allowed() {
				t.Fatalf("case %d: %+v, %v", c, d, err)
			}
			n++
			if d.Leased {
				spent++
			} else {
				// A whole decision: what the replica's lease holds now
				// it was just granted (the decision took the first).
				g += leaseLeft(l, "k")
			}
			rate := per * float64(replicas)
			if steps && el/(5*time.Second)%2 == 1 {
				rate /= 5
			}
			f.clk.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		}
		// What every replica still holds is spent or lost within a second.
		for _, l := range ls {
			g -= leaseLeft(l, "k")
		}
		waste := g - spent
		t.Logf("case %2d: %d replicas, %5.1f requests a second each (stepping %v): %5d leased admissions, %4d unspent (%4.1f%%); %.3f of requests leased",
			c, replicas, per, steps, g, waste, 100*float64(waste)/float64(max(g, 1)), float64(spent)/float64(n))
		if float64(waste) > 0.25*float64(g) {
			t.Errorf("case %d: %d replicas, %.1f requests a second each (stepping %v): %d of %d leased admissions unspent, want at most 25%%", c, replicas, per, steps, waste, g)
		}
		granted += g
		unspent += waste
		requests += n
		leased += spent
	}
	t.Logf("pooled: %d of %d leased admissions unspent (%.1f%%); %.3f of requests leased", unspent, granted, 100*float64(unspent)/float64(granted), float64(leased)/float64(requests))
	if float64(unspent) > 0.08*float64(granted) {
		t.Errorf("pooled: %d of %d leased admissions unspent, want at most 8%%", unspent, granted)
	}
	if float64(leased) < 0.78*float64(requests) {
		t.Errorf("pooled: %d of %d requests leased, want at least 78%%", leased, requests)
	}
}

// TestBelowDemand checks the sizing rule leases and blocks share
// over generated counts and scales: never above the expected demand m
// (floored), exactly d deviations below it (floored) but never below 0,
// never less for more requests, and 0, not a wild conversion of NaN, for a
// count of 0 or less.
func TestBelowDemand(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 79)
	for range 20_000 {
		// Counts and scales over many orders of magnitude, a few of
		// them none.
		n := math.Floor(math.Exp(rng.Float64()*14)) - float64(rng.IntN(3))
		scale := math.Exp(rng.Float64()*14 - 9)
		d := []float64{0, leaseDeviations, 1}[rng.IntN(3)]
		k := belowDemand(n, scale, d)
		m := n * scale
		if m <= 0 {
			if k != 0 {
				t.Fatalf("belowDemand(%v, %v, %v) = %d, want 0", n, scale, d, k)
			}
			continue
		}
		want := max(math.Floor(m-d*math.Sqrt(m*(1+scale))), 0)
		if float64(k) != want || float64(k) > math.Floor(m) {
			t.Fatalf("belowDemand(%v, %v, %v) = %d, want %v (m %v)", n, scale, d, k, want, m)
		}
		if k2 := belowDemand(n+1, scale, d); k2 < k {
			t.Fatalf("belowDemand(%v, ...) = %d, less than %d for one request fewer", n+1, k2, k)
		}
	}
}

// TestLeasesRefuseLittleBelowTheLimit sends a key at random (Poisson)
// arrivals at 80-99% of its per-minute limit (600 to 6,000 a minute,
// generated) to one to three replicas spreading it at random, for three
// minutes a case; then the same arrivals to a limiter that decides every
// request exactly (the same algorithm, in process, with no leases): what
// any limiter refuses of such a key anyway. What a lease leaves unspent
// was counted with what was admitted, and a key below its limit would be
// refused for it, but for the give-back (giveback.go). Its requests are
// counted in two phases: the second minute, when the window first holds a
// whole minute of the key's traffic, with the leases taken while it
// filled (rising), and the third (steady). Pooled over the cases, leases
// may refuse at most 0.1% of the requests of either phase more than exact
// decisions did, and must still answer at least a fifth of them. (The
// give-backs are sent in the background: a seed replays its arrivals,
// not always its exact figures.)
//
// Before give-backs, leases sized at the expected demand refused
// 0.49-1.45% of the requests of keys at 80-95% here (four seeds); half a
// deviation below it, 0-0.16%, but keys at 95-99% still had 1-3% of their
// requests refused. Keeping a tenth of every limit free of leases took
// the steady phase to within 0.02% of exact decisions, and left 0.01-0.48%
// more in the rising one, with 8-38% of requests leased. With
// give-backs and no tenth kept, both phases came within 0.005% of exact
// decisions over six seeds, with 41-70% leased.
func TestLeasesRefuseLittleBelowTheLimit(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	rng := invariantRNG(t, 97)
	// Per phase (rising, steady), pooled: requests, refused by the
	// leasing fleet and by the exact one, leased, admitted by a round trip.
	var requests, refused, exactRefused, leased, trips [2]int64
	for c := range 10 {
		replicas := 1 + rng.IntN(3)
		limit := 600 + rng.Int64N(5400)
		frac := 0.8 + rng.Float64()*0.19
		p := Policy{Name: "near", Windows: []Window{{Limit: limit, Period: time.Minute}}}
		rate := float64(limit) / 60 * frac // a second
		// The arrivals: the gap before each, and its replica.
		var gaps []time.Duration
		var to []int
		for el := time.Duration(0); el < 180*time.Second; {
			gap := time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			el += gap
			gaps, to = append(gaps, gap), append(to, rng.IntN(replicas))
		}
		// run sends them to ls, on clk, and counts, per phase, the
		// requests, those refused, those leased and those admitted by a
		// round trip.
		run := func(ls []*Limiter, clk *fakeClock) (n, r, l, tr [2]int64) {
			for i, gap := range gaps {
				clk.Add(gap)
				d, err := ls[to[i]%len(ls)].Allow(context.Background(), "k", p)
				if err != nil || d.Degraded {
					t.Fatalf("case %d: %+v, %v", c, d, err)
				}
				el := clk.Now().Sub(epoch)
				if el < time.Minute {
					continue
				}
				ph := 0
				if el >= 2*time.Minute {
					ph = 1
				}
				n[ph]++
				switch {
				case !d.Allowed():
					r[ph]++
				case d.Leased:
					l[ph]++
				default:
					tr[ph]++
				}
			}
			return n, r, l, tr
		}
		f := newFixture(t, Options{Replicas: replicas})
		n, r, l, tr := run(f.fleet(t, replicas), f.clk)
		// Exact decisions, by the same algorithm in process: the same
		// for any number of replicas sharing one state.
		clk := &fakeClock{}
		clk.Set(epoch)
		exact, err := newLimiter(nil, Options{}, hooks{clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = exact.Close() })
		_, er, _, _ := run([]*Limiter{exact}, clk)
		t.Logf("case %d: %d replicas, %d a minute at %.1f%%: refused %d of %d rising (exact %d), %d of %d steady (exact %d); %.2f of the steady leased",
			c, replicas, limit, 100*frac, r[0], n[0], er[0], r[1], n[1], er[1], float64(l[1])/float64(n[1]))
		for ph := range 2 {
			requests[ph] += n[ph]
			refused[ph] += r[ph]
			exactRefused[ph] += er[ph]
			leased[ph] += l[ph]
			trips[ph] += tr[ph]
		}
	}
	for ph, name := range []string{"rising", "steady"} {
		t.Logf("pooled, %s: %d of %d requests refused (%.3f%%; exact %.3f%%); %.3f leased, %.3f admitted by a round trip",
			name, refused[ph], requests[ph], 100*float64(refused[ph])/float64(requests[ph]), 100*float64(exactRefused[ph])/float64(requests[ph]),
			float64(leased[ph])/float64(requests[ph]), float64(trips[ph])/float64(requests[ph]))
	}
	for ph, name := range []string{"rising", "steady"} {
		if (refused[ph]-exactRefused[ph])*1000 > requests[ph] {
			t.Errorf("pooled, %s: %d of %d requests refused at 80-99%% of their limit, %d by exact decisions: want at most 0.1%% more",
				name, refused[ph], requests[ph], exactRefused[ph])
		}
		if leased[ph]*5 < requests[ph] {
			t.Errorf("pooled, %s: %d of %d requests leased, want at least a fifth", name, leased[ph], requests[ph])
		}
	}
}

// TestRecordNamesFollowTheKeysPlan: a key that moves to another plan is
// decided on the records of that plan's windows. Over generated pairs of
// plans with small limits, a key is admitted a few times under the first,
// then under the second until refused, on a frozen clock: the second
// admits exactly what its windows leave, a window sharing the first's
// period (and so its record) counting the first's admissions too, and once
// it admits, its records exist under their names. Names kept from the
// first plan would decide the second on the first's records.
func TestRecordNamesFollowTheKeysPlan(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 71)
	small := func(ws []Window) []Window {
		out := make([]Window, len(ws))
		for i, w := range ws {
			out[i] = Window{Limit: 1 + rng.Int64N(12), Period: w.Period}
		}
		return out
	}
	for c := range testenv.Cases(t, 10, *invariantCases) {
		a := Policy{Name: "a", Windows: small(genPolicies(rng, 30*24*time.Hour)[0].Windows)}
		b := Policy{Name: "b", Windows: small(genPolicies(rng, 30*24*time.Hour)[0].Windows)}
		if rng.IntN(2) == 0 {
			// A window of the first plan's period, with another limit.
			w := a.Windows[rng.IntN(len(a.Windows))]
			if !slices.ContainsFunc(b.Windows, func(x Window) bool { return x.Period == w.Period }) {
				b.Windows = append(b.Windows, Window{Limit: 1 + rng.Int64N(12), Period: w.Period})
			}
		}
		f := newFixture(t, Options{})
		key := fmt.Sprint("k", c)
		first := rng.Int64N(1 + slices.MinFunc(a.Windows, func(x, y Window) int { return cmp.Compare(x.Limit, y.Limit) }).Limit)
		for i := range first {
			if d := f.allow(t, key, a); !d.Allowed() {
				t.Fatalf("case %d: request %d of %d under %v refused: %+v", c, i+1, first, a.Windows, d)
			}
		}
		want := int64(math.MaxInt64)
		for _, w := range b.Windows {
			left := w.Limit
			if slices.ContainsFunc(a.Windows, func(x Window) bool { return x.Period == w.Period }) {
				left -= first
			}
			want = min(want, max(left, 0))
		}
		var got int64
		for got <= want {
			if !f.allow(t, key, b).Allowed() {
				break
			}
			got++
		}
		if got != want {
			t.Fatalf("case %d: %d admitted under %v after %d under %v; want %d", c, got, b.Windows, first, a.Windows, want)
		}
		pl := compile(b, DefaultBuckets, DefaultStrikeBuckets)
		for i := range pl.windows {
			if got == 0 {
				break // a refusal writes no window
			}
			if name := windowKey(f.l.opts.Prefix, key, &pl.windows[i]); !f.mini.Exists(name) {
				t.Fatalf("case %d: no record %s after deciding under %v (records %v)", c, name, b.Windows, f.mini.Keys())
			}
		}
	}
}

// TestLeaseTableCountsKeysItHasNoRoomFor: a key whose shard is full gets no
// entry (so no lease or block) and is counted as untracked; the sweep
// reports the keys it keeps and frees idle ones.
func TestLeaseTableCountsKeysItHasNoRoomFor(t *testing.T) {
	t.Parallel()
	lt := newLeaseTable(64, func() int64 { return 1 })
	lt.maxPerShard = 1
	pl := compile(perMinute(1000), DefaultBuckets, DefaultStrikeBuckets)
	full := map[*leaseShard]bool{}
	tracked, untracked := 0, 0
	var d Decision
	for i := 0; untracked < 5; i++ {
		k := fmt.Sprint("k", i)
		sh := lt.shard(k)
		served, _, _ := lt.take(k, pl, epoch, true, &d)
		_, entry := sh.keys[k]
		switch {
		case served:
			t.Fatalf("%s served with no lease granted", k)
		case full[sh] && entry:
			t.Fatalf("%s given an entry in a full shard", k)
		case full[sh]:
			untracked++
		case !entry:
			t.Fatalf("%s refused an entry in an empty shard", k)
		default:
			full[sh] = true
			tracked++
		}
	}
	if got := lt.untracked.Load(); got != int64(untracked) {
		t.Errorf("untracked %d, want %d", got, untracked)
	}
	if kept := lt.sweep(epoch); kept != tracked {
		t.Errorf("the sweep kept %d keys, want the %d tracked", kept, tracked)
	}
	if kept := lt.sweep(epoch.Add(time.Hour)); kept != 0 {
		t.Errorf("the sweep kept %d keys idle for an hour", kept)
	}
}

// TestTrackedKeysReported: the sweep publishes the lease table's size and
// the requests it had no room for.
func TestTrackedKeysReported(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := perMinute(1000)
	for i := range 3 {
		if d := f.allow(t, fmt.Sprint("k", i), p); !d.Allowed() {
			t.Fatalf("k%d: %+v", i, d)
		}
	}
	// Stands in for requests a full table turned away (two keys' worth).
	f.l.lease.untracked.Add(2)
	f.l.sweep(f.clk.Now())
	if got := testenv.MetricValue(t, f.l.met.trackedKeys); got != 3 {
		t.Errorf("petstore_ratelimit_tracked_keys %v, want 3", got)
	}
	if got := testenv.CounterSum(t, f.reg, "petstore_ratelimit_untracked_total", nil); got != 2 {
		t.Errorf("petstore_ratelimit_untracked_total %v, want 2", got)
	}
}
