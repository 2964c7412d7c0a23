package ratelimit

import (
	"cmp"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// The promises of the README, checked directly on the decision script
// (the Decider: no lease table, rejection cache or batcher in between),
// over plans generated across the whole accepted configuration space:
//
//   - no interval of length W ever holds more than L admissions of a window
//     (L, W), by Redis time, whatever the limit (with extra weight at the
//     internal boundaries: 127-256, 65 535 ± 1, MaxLimit), the period (from
//     MinPeriod to MaxPeriod), the number of windows, and replicas that
//     disagree on the plan (each admission is held to the limits of the
//     plan it was decided under, counting every admission of every plan
//     that has a window of that period);
//   - Retry-After is never short: a client that waits exactly Retry-After
//     is admitted on its first retry, absent other traffic; and it is
//     never long: any request before it, under the same plan, is refused;
//   - for a limited request, Retry-After exceeds the wait of an ideal
//     sliding window (computed here from the admission log alone) by at
//     most one bucket (plus the offset unit), so the whole seconds the
//     HTTP layer sends are at most 1 s long.
//
// make test runs a fixed seed on a short budget; make fuzz runs more cases
// with a random seed:
//
//	go test ./ratelimit -run Invariant -invariant.cases 2000 -invariant.seed 0
var (
	invariantCases = flag.Int("invariant.cases", 40, "plans generated per invariant test")
	invariantSeed  = flag.Uint64("invariant.seed", 1, "seed of the invariant tests (0: random)")
)

func invariantRNG(t *testing.T, stream uint64) *rand.Rand {
	seed := *invariantSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -invariant.seed %d)", seed, seed)
	return rand.New(rand.NewPCG(seed, stream))
}

// boundaryLimits are the limits around every internal boundary that a
// limit-dependent width would have: byte widths, and the largest limit.
var boundaryLimits = []int64{1, 2, 3, 127, 128, 129, 199, 200, 201, 254, 255, 256, 257,
	65_534, 65_535, 65_536, 65_537, 16_777_215, 16_777_216, MaxLimit - 1, MaxLimit}

// genLimit draws a limit: half the time at a boundary, else small or
// anywhere in the accepted range.
func genLimit(rng *rand.Rand) int64 {
	switch r := rng.IntN(10); {
	case r < 5:
		return boundaryLimits[rng.IntN(len(boundaryLimits))]
	case r < 8:
		return 1 + rng.Int64N(300)
	default:
		return 1 + rng.Int64N(MaxLimit)
	}
}

// genPeriod draws a period from MinPeriod to maxPeriod: the extremes,
// common ones, and any in between.
func genPeriod(rng *rand.Rand, maxPeriod time.Duration) time.Duration {
	fixed := []time.Duration{MinPeriod, MinPeriod + time.Microsecond, 2 * time.Millisecond, 7 * time.Millisecond,
		50 * time.Millisecond, 1013 * time.Millisecond, 10 * time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, MaxPeriod}
	var d time.Duration
	if rng.IntN(2) == 0 {
		d = fixed[rng.IntN(len(fixed))]
	} else {
		// Log-uniform between the bounds.
		lo, hi := float64(MinPeriod), float64(maxPeriod)
		d = time.Duration(lo * math.Pow(hi/lo, rng.Float64()))
		d = d.Truncate(time.Microsecond)
	}
	return min(max(d, MinPeriod), maxPeriod)
}

// genPolicies draws the plans one key is decided under: 1-3 replicas'
// views, sharing some windows (same period, maybe another limit) and
// differing in others, with the same ban rules.
func genPolicies(rng *rand.Rand, maxPeriod time.Duration) []Policy {
	nw := 1 + rng.IntN(4)
	var base []Window
	seen := map[time.Duration]bool{}
	for len(base) < nw {
		p := genPeriod(rng, maxPeriod)
		if !seen[p] {
			seen[p] = true
			base = append(base, Window{Limit: genLimit(rng), Period: p})
		}
	}
	var ban BanPolicy
	if rng.IntN(2) == 0 {
		sw := genPeriod(rng, min(maxPeriod, time.Hour))
		ban = BanPolicy{Threshold: 1 + rng.Int64N(5), StrikeWindow: sw, Base: time.Duration(1+rng.Int64N(int64(2*sw))) + time.Microsecond,
			Multiplier: 1 + rng.Float64()*2, Memory: 3 * sw}
	}
	policies := []Policy{{Name: "p0", Windows: base, Ban: ban}}
	for i := 1; i < 1+rng.IntN(3); i++ {
		ws := slices.Clone(base)
		for j := range ws {
			if rng.IntN(3) == 0 {
				ws[j].Limit = genLimit(rng)
			}
		}
		if len(ws) > 1 && rng.IntN(3) == 0 {
			k := rng.IntN(len(ws))
			ws = append(ws[:k], ws[k+1:]...)
		}
		if len(ws) < 4 && rng.IntN(3) == 0 {
			if p := genPeriod(rng, maxPeriod); !slices.ContainsFunc(ws, func(w Window) bool { return w.Period == p }) {
				ws = append(ws, Window{Limit: genLimit(rng), Period: p})
			}
		}
		policies = append(policies, Policy{Name: fmt.Sprint("p", i), Windows: ws, Ban: ban})
	}
	return policies
}

// span is one decision's admissions: k of them, spent within [start, end]
// by Redis time (a single admission: start = end; a lease: until its end).
type span struct {
	start, end, k int64
	periods       []int64 // the window periods (µs) that counted them
	limits        []int64 // the limits of those windows in the plan that decided them
}

// admissionLog checks the window promise and computes ideal waits from
// the admissions alone.
type admissionLog struct{ spans []span }

// count returns the admissions counted by a window of period p within
// (x-p, x]: those of spans that overlap it.
func (a *admissionLog) count(p, x int64) int64 {
	var c int64
	for _, s := range a.spans {
		if s.start <= x && s.end > x-p && slices.Contains(s.periods, p) {
			c += s.k
		}
	}
	return c
}

// admit logs one admission at x under plan pl and returns the first of
// pl's windows that now holds more than its limit within (x-period, x]
// (counting every plan's admissions that share it), with that count;
// nil when none does.
func (a *admissionLog) admit(pl *plan, x int64) (over *ring, n int64) {
	s := span{start: x, end: x, k: 1}
	for _, w := range pl.windows {
		s.periods = append(s.periods, w.period)
	}
	a.spans = append(a.spans, s)
	for i := range pl.windows {
		w := &pl.windows[i]
		if n := a.count(w.period, x); n > w.limit {
			return w, n
		}
	}
	return nil, 0
}

// mustAdmit logs one admission at x under plan pl, and fails the test,
// naming the case (what) and the admission (who), when one of pl's
// windows then holds more than its limit.
func (a *admissionLog) mustAdmit(t testing.TB, pl *plan, x int64, what, who string) {
	t.Helper()
	if w, n := a.admit(pl, x); w != nil {
		t.Fatalf("%s: %s at %d finds %d admissions within %s, past its limit %d", what, who, x, n, time.Duration(w.period)*time.Microsecond, w.limit)
	}
}

// idealWait returns how long after x a request would wait for window
// (limit, p) under an exact sliding window over the logged admissions.
func (a *admissionLog) idealWait(limit, p, x int64) int64 {
	var in []span
	var c int64
	for _, s := range a.spans {
		if s.start <= x && s.end > x-p && slices.Contains(s.periods, p) {
			in = append(in, s)
			c += s.k
		}
	}
	if c < limit {
		return 0
	}
	sort.Slice(in, func(i, j int) bool { return in[i].end < in[j].end })
	excess, acc := c-limit+1, int64(0)
	for _, s := range in {
		acc += s.k
		if acc >= excess {
			return s.end + p - x
		}
	}
	panic("unreachable")
}

// refusal is the last refusal under one plan.
type refusal struct {
	at, retry int64
	ok        bool
	// seq numbers the decision: a retry must be admitted at Retry-After
	// only when no decision came after the refusal (under other plans,
	// or later in the same batch).
	seq int
}

// invariantDriver runs one generated case against a decider: the
// decision code on Redis or miniredis, or the same algorithm in process.
type invariantDriver struct {
	t        *testing.T
	rng      *rand.Rand
	rdb      *redis.Client        // nil: no Redis, local decides
	mini     *miniredis.Miniredis // nil: real Redis, real time, or none
	local    *localDecider        // with no Redis, the decider, on the test's clock
	prefix   string
	keys     [][]string
	plans    []*plan
	policies []Policy
	log      admissionLog
	refused  []refusal
	now      int64 // µs, the clock the test sets (miniredis)
	last     int64 // the previous decision's Redis time
	stats    [3]int
	seq      int // decisions checked
	leases   int
	honoured int
	// The ban promise's own account: the strikes since the last ban
	// (times, µs), the ban in force, the offences remembered and the
	// last one's time.
	strikes             []int64
	banUntil            int64
	offences, offenceAt int64
	bans                int
	// finAt is when the case's records were finalized (µs; 0: never),
	// and older whether replicas of the release before finalizing
	// decide too, until then (finalize.go): a rolling upgrade, then the
	// operator's step. Of the decisions after finAt, some are made by
	// replicas that have not yet read the mark. compact: of those made
	// finalized, three in four write compact records,
	// in cases that never roll back (Unfinalize converts them back first:
	// TestCompactRecordsComeWithFinalizing). calls counts the calls made
	// finalized, not yet knowing it, by the older release, and compact.
	finAt      int64
	compact    bool
	finalizeAt int
	older      bool
	rollback   [2]int
	rolledBack bool
	tight      int
	calls      [4]int
}

// finalizeCase draws how the case's replicas write records, over its
// steps: never finalized (a third of cases), finalized from the start,
// or at a step drawn (finalizeAt), with replicas of the release before
// finalizing deciding beside this one's until then in half of the cases
// not finalized from the start. Half of the cases finalized at a step
// then roll back without undoing the mark (rollback: from the first step
// to the second, one to four steps on, the older release decides again, and this release's
// replicas, counting it in the census, do not write as finalized), and
// forward again.
func (d *invariantDriver) finalizeCase(steps int) {
	d.finalizeAt, d.rollback = -1, [2]int{-1, -1}
	switch d.rng.IntN(3) {
	case 1:
		d.finAt = 1
	case 2:
		d.finalizeAt = 1 + d.rng.IntN(steps-1)
		if left := steps - d.finalizeAt; left > 2 && d.rng.IntN(3) > 0 {
			from := d.finalizeAt + 1 + d.rng.IntN(left-2)
			d.rollback = [2]int{from, from + 1 + d.rng.IntN(min(steps-from-1, 4))}
		}
	}
	d.older = d.finAt == 0 && d.rng.IntN(2) == 0
	d.compact = d.rollback[0] < 0 && d.rng.IntN(3) > 0
}

// stepTo is called before each step: the operator finalizes at step
// finalizeAt, once the older release is gone; a rollback begins and ends
// at the steps of rollback.
func (d *invariantDriver) stepTo(step int) {
	switch step {
	case d.finalizeAt:
		d.finAt = d.clock() + 1
	case d.rollback[0]:
		// Steps of a bucket or less from here until a few after it ends,
		// so that writes on both sides of it share epochs.
		d.rolledBack, d.tight = true, d.rollback[1]-d.rollback[0]+10
	case d.rollback[1]:
		d.rolledBack = false
	}
}

// clock is the time a call is made at: the test's on miniredis, the
// server's (this machine's) on a real Redis.
func (d *invariantDriver) clock() int64 {
	if d.setsClock() {
		return d.now
	}
	return time.Now().UnixMicro()
}

// setsClock reports whether the test sets the decider's clock
// (miniredis, or no Redis), rather than real time passing.
func (d *invariantDriver) setsClock() bool { return d.mini != nil || d.local != nil }

func newInvariantDriver(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, policies []Policy) *invariantDriver {
	d := &invariantDriver{t: t, rng: rng, rdb: rdb, mini: mini, policies: policies, prefix: randomPrefix(t)}
	if rdb == nil {
		d.local = newLocalDecider(func() time.Time { return time.UnixMicro(d.now) })
	}
	for _, p := range policies {
		pl := compile(p, DefaultBuckets, DefaultStrikeBuckets)
		d.plans = append(d.plans, pl)
		d.keys = append(d.keys, stateKeys(d.prefix, "k", pl))
	}
	d.refused = make([]refusal, len(policies))
	return d
}

func (d *invariantDriver) describe() string {
	var b strings.Builder
	for _, p := range d.policies {
		fmt.Fprintf(&b, "%s %v ban %+v; ", p.Name, p.Windows, p.Ban)
	}
	return b.String()
}

// call decides one request under plan i, at the driver's clock on
// miniredis, asking for a lease of want admissions when want > 1.
func (d *invariantDriver) call(i int, want int64) verdict {
	t := d.t
	t.Helper()
	if d.mini != nil {
		d.mini.SetTime(time.UnixMicro(d.now))
	}
	ask := noLease
	if want > 1 && d.local == nil {
		ask = leaseAsk{want: want, need: want, life: 1 + d.rng.Int64N(2_000_000)}
	}
	v := d.decide([]request{{key: "k", pl: d.plans[i], in: input{lease: ask}}})[0]
	if d.setsClock() && v.now != d.now {
		t.Fatalf("script time %d, clock %d", v.now, d.now)
	}
	if v.now < d.last {
		t.Fatalf("Redis time went back from %d to %d", d.last, v.now)
	}
	d.last = v.now
	d.check(i, v)
	return v
}

// decide decides reqs in one batch, through a decider: on a real Redis
// the Function the limiter calls there (FCALL), on miniredis the script
// (EVAL), its fallback, and with no Redis the same algorithm in process.
//
// Before finAt (or with none) a third of the calls are the older
// release's when the case has one, and half during a rollback; after it
// a quarter are made by replicas that have not read the mark yet.
func (d *invariantDriver) decide(reqs []request) []verdict {
	out := make([]verdict, len(reqs))
	var dec decider = d.local
	if d.rdb != nil {
		// -1: the older release; 0: not finalized; 1: finalized.
		fin := 1
		if d.finAt == 0 || d.rolledBack {
			fin = 0
			if d.older && d.rng.IntN(3) == 0 || d.rolledBack && d.rng.IntN(2) == 0 {
				fin = -1
			}
		} else if d.rng.IntN(4) == 0 {
			fin = 0
		}
		arg := notFinalized
		switch {
		case fin < 0:
			d.calls[2]++
		case fin == 0:
			d.calls[1]++
		default:
			d.calls[0]++
			if d.compact && d.rng.IntN(4) > 0 {
				d.calls[3]++
				arg = compactRecords
			}
		}
		r := &redisDecider{rdb: d.rdb, prefix: d.prefix, sc: decisionScript(), log: discardLogger,
			finalized: func() any { return arg }}
		switch {
		case fin < 0:
			dec = olderDecider{r}
		case d.mini != nil:
			r.noFunctions.Store(true)
		}
		if fin >= 0 {
			dec = r
		}
	}
	if err := dec.decide(context.Background(), reqs, out); err != nil {
		d.t.Fatalf("%s: decide: %v", d.describe(), err)
	}
	return out
}

// batch decides one request under each plan is[j], asking for wants[j]
// admissions, in one script call (with decisions for another key between
// them), and checks every verdict in order.
func (d *invariantDriver) batch(is []int, wants []int64) {
	t := d.t
	t.Helper()
	if d.mini != nil {
		d.mini.SetTime(time.UnixMicro(d.now))
	}
	var reqs []request
	var mine []int // index in reqs of each of is
	for j, i := range is {
		if d.rng.IntN(3) == 0 {
			pl := d.plans[d.rng.IntN(len(d.plans))]
			reqs = append(reqs, request{key: "n", pl: pl, in: input{lease: noLease}})
		}
		ask := noLease
		if wants[j] > 1 && d.local == nil {
			ask = leaseAsk{want: wants[j], need: wants[j], life: 1 + d.rng.Int64N(2_000_000)}
		}
		mine = append(mine, len(reqs))
		reqs = append(reqs, request{key: "k", pl: d.plans[i], in: input{lease: ask}})
	}
	vs := d.decide(reqs)
	var at int64
	for j, i := range is {
		v := vs[mine[j]]
		if j == 0 {
			at = v.now
		}
		if v.now != at || (d.setsClock() && v.now != d.now) || v.now < d.last {
			t.Fatalf("decision %d of a batch at %d, the batch's first at %d, the clock at %d, the last decision at %d", j, v.now, at, d.now, d.last)
		}
		d.last = v.now
		d.check(i, v)
	}
}

// check holds verdict v of a decision under plan i to every promise.
func (d *invariantDriver) check(i int, v verdict) {
	t := d.t
	t.Helper()
	pl := d.plans[i]
	x := v.now
	d.stats[v.outcome]++
	d.seq++
	d.checkRecordsOutlive(i)
	d.checkBan(i, v)
	if v.outcome == Allowed {
		if r := d.refused[i]; r.ok && x < r.at+r.retry {
			t.Fatalf("%s\nplan %d admitted at %d, before the Retry-After of its refusal at %d (%d µs)", d.describe(), i, x, r.at, r.retry)
		}
		if v.granted < 1 {
			t.Fatalf("admitted with %d granted", v.granted)
		}
		s := span{start: x, end: x, k: v.granted}
		if v.granted > 1 {
			s.end = v.leaseEnd
			d.leases++
		}
		for _, r := range pl.windows {
			s.periods = append(s.periods, r.period)
			s.limits = append(s.limits, r.limit)
		}
		d.log.spans = append(d.log.spans, s)
		for _, r := range pl.windows {
			if c := d.log.count(r.period, x); c > r.limit {
				t.Fatalf("%s\nplan %d: %d admissions within %s ending at %d µs, limit %d", d.describe(), i, c, time.Duration(r.period)*time.Microsecond, x, r.limit)
			}
		}
		// A lease of another plan may still be spent: its admissions are
		// held to its plan's limits when spent, so no admission may take a
		// window they count in past them.
		for _, o := range d.log.spans {
			if o.k < 2 || o.start > x || o.end <= x {
				continue
			}
			for j, p := range o.periods {
				if !slices.ContainsFunc(pl.windows, func(r ring) bool { return r.period == p }) {
					continue
				}
				if c := d.log.count(p, x); c > o.limits[j] {
					t.Fatalf("%s\nplan %d: %d admissions within %s ending at %d µs, past the limit %d of a lease being spent until %d µs",
						d.describe(), i, c, time.Duration(p)*time.Microsecond, x, o.limits[j], o.end)
				}
			}
		}
		d.refused[i].ok = false
		return
	}
	if v.retry <= 0 {
		t.Fatalf("%s\nrefused (%v) with Retry-After %d", d.describe(), v.outcome, v.retry)
	}
	var ideal, slack int64
	for _, r := range pl.windows {
		ideal = max(ideal, d.log.idealWait(r.limit, r.period, x))
		slack = max(slack, r.gran+r.unit)
	}
	if v.retry < ideal {
		t.Fatalf("%s\nplan %d refused at %d with Retry-After %d µs, shorter than the exact window's %d", d.describe(), i, x, v.retry, ideal)
	}
	if v.outcome == Limited && v.retry > ideal+slack {
		t.Fatalf("%s\nplan %d limited at %d with Retry-After %d µs, more than a bucket (%d) past the exact window's %d", d.describe(), i, x, v.retry, slack, ideal)
	}
	d.refused[i] = refusal{at: x, retry: v.retry, ok: true, seq: d.seq}
}

// checkBan holds verdict v of a decision under plan i to the ban
// promise, kept from the outcomes alone: a key is banned from the
// rejection that makes more than Threshold strikes within StrikeWindow
// (never later; never earlier than the strike window's bucket and offset
// granularity allows), for Base·Multiplier^(n-1) capped at Max, n
// counting the offences each within Memory of the one before; during a
// ban every request is refused as banned, and is no strike; strikes start
// over with each ban. Every plan of a case has the same ban rule.
func (d *invariantDriver) checkBan(i int, v verdict) {
	t := d.t
	t.Helper()
	rule := &d.plans[i].ban
	if !rule.on {
		return
	}
	b, x := d.policies[i].Ban, v.now
	// The refusal that begins a ban is answered as banned.
	if banned := x < d.banUntil; banned != (v.outcome == Banned && !v.newBan) || v.newBan && v.outcome != Banned {
		t.Fatalf("%s\nplan %d answered %v (a ban begun: %v) at %d µs; the key's ban (by its strikes) ends at %d µs", d.describe(), i, v.outcome, v.newBan, x, d.banUntil)
	}
	if v.outcome == Allowed || x < d.banUntil {
		return
	}
	d.strikes = append(d.strikes, x)
	sw, slack := rule.strikes.period, rule.strikes.gran+rule.strikes.unit
	var exact, loose int64
	for _, s := range d.strikes {
		if s > x-sw {
			exact++
		}
		if s > x-sw-slack {
			loose++
		}
	}
	if !v.newBan {
		if exact > b.Threshold {
			t.Fatalf("%s\nplan %d: no ban at %d µs with %d strikes within %s, threshold %d", d.describe(), i, x, exact, b.StrikeWindow, b.Threshold)
		}
		if v.strikes < exact || v.strikes > loose {
			t.Fatalf("%s\nplan %d at %d µs counts %d strikes; %d fell within %s, %d within a bucket more", d.describe(), i, x, v.strikes, exact, b.StrikeWindow, loose)
		}
		return
	}
	if loose <= b.Threshold {
		t.Fatalf("%s\nplan %d: a ban began at %d µs with %d strikes within %s and a bucket, threshold %d", d.describe(), i, x, loose, b.StrikeWindow, b.Threshold)
	}
	n := int64(1)
	if d.offences > 0 && d.offenceAt+rule.memory > x {
		n = d.offences + 1
	}
	// Base·Multiplier^(n-1), capped at Max, in µs: the script works in
	// whole µs, so its base may be short of Base by under 1 µs, times
	// the multiplier's growth.
	grow := math.Pow(max(b.Multiplier, 1), float64(n-1))
	want := float64(b.Base) / float64(time.Microsecond) * grow
	if b.Max > 0 {
		want = min(want, float64(b.Max)/float64(time.Microsecond))
	}
	if got := float64(v.banUntil - x); math.Abs(got-want) > grow+1 {
		t.Fatalf("%s\nplan %d: offence %d at %d µs banned for %.0f µs, want %.0f", d.describe(), i, n, x, got, want)
	}
	if v.retry < v.banUntil-x {
		t.Fatalf("%s\nplan %d: banned at %d µs until %d with Retry-After %d µs", d.describe(), i, x, v.banUntil, v.retry)
	}
	d.banUntil, d.offences, d.offenceAt, d.strikes = v.banUntil, n, x, nil
	d.bans++
}

// checkRecordsOutlive fails unless every window record of plan i (its
// windows and candidate windows) lives at least until its newest events
// stop counting: a period after the end of its head bucket, (head+1)·g +
// period. A record that expired sooner would take admissions that still
// count with it. So for its ban record: the ban's end, the last offence's
// memory, its newest strikes. Heads and times are read from the records,
// the expiry with PEXPIRETIME (ms since the epoch). Every record also
// has the layout format.go gives it, which releases that read it share:
// its version byte, and a window record's length (its slots are read at
// fixed positions).
func (d *invariantDriver) checkRecordsOutlive(i int) {
	t := d.t
	t.Helper()
	if d.rdb == nil {
		return // no records
	}
	pl := d.plans[i]
	rings := slices.Concat(pl.windows, pl.candidates)
	ctx := context.Background()
	// One transaction: a record that expires meanwhile is gone from every
	// read of it, not from some.
	pipe := d.rdb.TxPipeline()
	heads := make([]*redis.StringCmd, len(rings))
	exps := make([]*redis.DurationCmd, len(rings))
	lens := make([]*redis.IntCmd, len(rings))
	for j := range rings {
		heads[j] = pipe.GetRange(ctx, d.keys[i][1+j], 0, 8)
		exps[j] = pipe.PExpireTime(ctx, d.keys[i][1+j])
		lens[j] = pipe.StrLen(ctx, d.keys[i][1+j])
	}
	var ban *redis.StringCmd
	var banExp *redis.DurationCmd
	if pl.ban.on {
		// Version, ban end, offences, last offence, strike period and
		// bucket width, then the strike ring's head and total.
		ban, banExp = pipe.GetRange(ctx, d.keys[i][0], 0, 48), pipe.PExpireTime(ctx, d.keys[i][0])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("reading the records: %v", err)
	}
	if ban != nil && len(ban.Val()) >= 49 {
		b := []byte(ban.Val())
		if b[0] != formatVersion {
			t.Fatalf("%s\nban record %s has version %d, not %d", d.describe(), d.keys[i][0], b[0], formatVersion)
		}
		// The ban record outlives the ban, the memory of its last
		// offence and its newest strikes.
		be := binary.BigEndian
		until, offences, offenceAt := int64(be.Uint64(b[1:])), be.Uint32(b[9:]), int64(be.Uint64(b[13:]))
		sp, sg, head, total := int64(be.Uint64(b[21:])), int64(be.Uint64(b[29:])), int64(be.Uint64(b[37:])), be.Uint32(b[45:])
		need := until
		if offences > 0 {
			need = max(need, offenceAt+pl.ban.memory)
		}
		if total > 0 {
			need = max(need, (head+1)*sg+sp)
		}
		if exp := banExp.Val(); exp < 0 || exp.Milliseconds()*1000 < need {
			t.Fatalf("%s\nban record %s (ban until %d, %d offences, the last at %d, strike head %d of %d µs, period %d µs, %d strikes) expires at %v, before %d µs",
				d.describe(), d.keys[i][0], until, offences, offenceAt, head, sg, sp, total, exp, need)
		}
	}
	for j, r := range rings {
		h := heads[j].Val()
		if len(h) < 9 {
			continue // never written (refused since created, or not yet), or expired
		}
		// The ring, then (once a lease was granted on it) the lease cap;
		// or, a window record, compact: the ring's header, its entries and
		// the cap while one holds.
		size := lens[j].Val()
		if j < len(pl.windows) && h[0] == compactVersion {
			if _, _, ok := compactShape(size); !ok {
				t.Fatalf("%s\ncompact record %s has %d bytes: not a header and at most %d entries", d.describe(), d.keys[i][1+j], size, compactMaxEntries)
			}
		} else if want := 1 + ringSize(r.n); h[0] != formatVersion || (size != want && size != want+leaseCapBytes) {
			t.Fatalf("%s\nrecord %s has version %d and %d bytes, not %d and %d or %d", d.describe(), d.keys[i][1+j], h[0], size, formatVersion, want, want+leaseCapBytes)
		}
		head := int64(binary.BigEndian.Uint64([]byte(h[1:])))
		exp := exps[j].Val()
		if exp < 0 {
			t.Fatalf("%s\nrecord %s has no expiry (%v)", d.describe(), d.keys[i][1+j], exp)
		}
		if need := (head+1)*r.gran + r.period; exp.Milliseconds()*1000 < need {
			t.Fatalf("%s\nrecord %s (head bucket %d of %d µs, period %d µs) expires at %d ms, before its newest events stop counting at %d µs",
				d.describe(), d.keys[i][1+j], head, r.gran, r.period, exp.Milliseconds(), need)
		}
	}
}

// step draws the next request: which plan, when, and how many admissions.
func (d *invariantDriver) step(lastPlan int) int {
	rng := d.rng
	i := lastPlan
	if rng.IntN(8) == 0 {
		i = rng.IntN(len(d.plans))
	}
	pl := d.plans[i]
	r := d.refused[i]
	// Honour a Retry-After exactly, or come back 1 µs early (miniredis,
	// whose clock the test sets).
	if r.ok && d.setsClock() && d.last == r.at && r.seq == d.seq {
		switch rng.IntN(10) {
		case 0, 1, 2:
			d.now = r.at + r.retry
			if v := d.call(i, 1); v.outcome != Allowed {
				d.t.Fatalf("%s\nplan %d refused at %d with Retry-After %d, then %v on the retry exactly then: %+v", d.describe(), i, r.at, r.retry, v.outcome, v)
			}
			d.honoured++
			return i
		case 3:
			d.now = r.at + r.retry - 1
			if v := d.call(i, 1); v.outcome == Allowed {
				d.t.Fatalf("%s\nplan %d admitted 1 µs before its Retry-After", d.describe(), i)
			}
			return i
		}
	}
	// Time: none, a little, a bucket, exactly a period (± 1 µs), or more.
	w := pl.windows[rng.IntN(len(pl.windows))]
	var dt int64
	switch rng.IntN(10) {
	case 0, 1:
	case 2, 3:
		dt = 1 + rng.Int64N(w.gran)
	case 4:
		dt = w.gran
	case 5, 6:
		dt = w.period + rng.Int64N(3) - 1
	case 7:
		dt = rng.Int64N(w.period)
	default:
		dt = rng.Int64N(2 * w.period)
	}
	if d.tight > 0 {
		d.tight--
		dt = 1 + rng.Int64N(w.gran)
	}
	if !d.setsClock() {
		// Real time: sleep only for short periods.
		if dt <= int64(20*time.Millisecond/time.Microsecond) {
			time.Sleep(time.Duration(dt) * time.Microsecond)
		}
	} else {
		d.now += max(dt, 0)
	}
	// A burst (at one instant), a lease of many, or one request.
	minLimit := pl.windows[0].limit
	for _, r := range pl.windows {
		minLimit = min(minLimit, r.limit)
	}
	switch k := rng.IntN(10); {
	case k < 1:
		for range 1 + rng.IntN(int(min(minLimit+3, 40))) {
			d.call(i, 1)
		}
	case k < 2:
		// The same burst in one script call, as the batcher sends
		// concurrent requests, mixed with other replicas' plans, leases
		// and another key's decisions.
		var is []int
		var wants []int64
		for range 1 + rng.IntN(int(min(minLimit+3, 40))) {
			j, want := i, int64(1)
			if rng.IntN(4) == 0 {
				j = rng.IntN(len(d.plans))
			}
			if rng.IntN(6) == 0 {
				want = 2 + rng.Int64N(min(minLimit, 1<<20))
			}
			is, wants = append(is, j), append(wants, want)
		}
		d.batch(is, wants)
	case k < 4:
		want := []int64{minLimit, minLimit - 1, minLimit + 1, minLimit / 2, 2 + rng.Int64N(min(minLimit, 1<<40))}[rng.IntN(5)]
		d.call(i, max(want, 2))
	default:
		d.call(i, 1)
	}
	return i
}

func runInvariantCase(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, policies []Policy, steps int) *invariantDriver {
	d := newInvariantDriver(t, rng, rdb, mini, policies)
	d.now = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	d.finalizeCase(steps)
	plan := 0
	for i := range steps {
		d.stepTo(i)
		plan = d.step(plan)
	}
	return d
}

// TestInvariantWindowsAndRetryAfterMiniredis drives generated plans on
// miniredis, whose clock the test sets: bursts, gaps of exactly one period,
// honoured and early retries, leases of up to a whole limit (so counts
// reach 2·MaxLimit), and replicas on different plans for one key.
func TestInvariantWindowsAndRetryAfterMiniredis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 1)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := playInvariantCases(t, rng, rdb, m, testenv.Cases(t, 10, *invariantCases))
	if t.Failed() {
		return
	}
	t.Logf("%s; calls %d finalized (%d compact), %d not, %d by the release before", s, s.calls[0], s.calls[3], s.calls[1], s.calls[2])
	if !s.reachedAll(true) || s.calls[0] == 0 || s.calls[1] == 0 || s.calls[2] == 0 || s.calls[3] == 0 {
		t.Fatalf("the generated traffic did not reach every outcome: %s, calls %v", s, s.calls)
	}
}

// TestInvariantWindowsAndRetryAfterRedis drives generated plans on a real
// Redis (the struct codec, real TIME): short periods let real time move
// buckets and whole windows; long ones accumulate; clients that honour
// Retry-After sleep it and must be admitted.
func TestInvariantWindowsAndRetryAfterRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, 2)
	cases := max(*invariantCases/4, 6)
	var (
		mu       sync.Mutex
		total    [3]int
		calls    [4]int
		honoured int
	)
	for c := range cases {
		// Periods up to 50 ms half the time, so that real time moves them.
		maxPeriod := MaxPeriod
		if c%2 == 0 {
			maxPeriod = 50 * time.Millisecond
		}
		policies := genPolicies(rng, maxPeriod)
		seed := rng.Uint64()
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 3))
			d := newInvariantDriver(t, rng, rdb, nil, policies)
			d.finalizeCase(120)
			plan := 0
			for i := range 120 {
				d.stepTo(i)
				plan = d.step(plan)
				// Honour the last Retry-After by sleeping it, when short.
				if r := d.refused[plan]; r.ok && r.seq == d.seq && r.retry < int64(30*time.Millisecond/time.Microsecond) && rng.IntN(3) == 0 {
					time.Sleep(time.Duration(r.retry) * time.Microsecond)
					if v := d.call(plan, 1); v.outcome != Allowed {
						t.Fatalf("%s\nrefused at %d with Retry-After %d µs, then %v after sleeping it: %+v", d.describe(), r.at, r.retry, v.outcome, v)
					}
					mu.Lock()
					honoured++
					mu.Unlock()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range total {
				total[i] += d.stats[i]
			}
			for i := range calls {
				calls[i] += d.calls[i]
			}
		})
	}
	t.Cleanup(func() {
		t.Logf("decisions: %d allowed, %d limited, %d banned; %d retries after sleeping Retry-After; calls %d finalized (%d compact), %d not, %d by the release before",
			total[0], total[1], total[2], honoured, calls[0], calls[3], calls[1], calls[2])
		if calls[0] == 0 || calls[1] == 0 || calls[2] == 0 || calls[3] == 0 {
			t.Errorf("the generated traffic left a path unchecked: calls %v", calls)
		}
	})
}

// TestInvariantWindowsAndRetryAfterLocal holds the decider in process
// (state.go: a limiter without Redis, the simulator, the fallback) to the
// same promises as the decision code, through the same driver: one
// property test of the decider seam, two implementations. It is asked
// for no leases: a process deciding alone has no replica to lease from,
// and its state keeps no lease cap (a lease under one plan holding the
// key's other plans to its limit, format.go), which only replicas on
// different plans need; nor for one key under several plans at once.
func TestInvariantWindowsAndRetryAfterLocal(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 3)
	// In process a case takes milliseconds: ten times the cases.
	s := playInvariantCases(t, rng, nil, nil, testenv.Cases(t, 40, 10**invariantCases))
	if t.Failed() {
		return
	}
	t.Logf("%s", s)
	if !s.reachedAll(false) {
		t.Fatalf("the generated traffic did not reach every outcome: %s", s)
	}
}

// invariantTally sums what a test's generated cases reached.
type invariantTally struct {
	total                  [3]int
	calls                  [4]int
	leases, honoured, bans int
}

func (s invariantTally) String() string {
	return fmt.Sprintf("decisions: %d allowed, %d limited, %d banned; %d leases; %d retries at exactly Retry-After; %d bans begun",
		s.total[0], s.total[1], s.total[2], s.leases, s.honoured, s.bans)
}

// reachedAll reports whether the cases refused, banned, were retried at
// exactly Retry-After and, when they asked for leases, leased.
func (s invariantTally) reachedAll(leases bool) bool {
	return s.total[Limited] > 0 && s.total[Banned] > 0 && (s.leases > 0 || !leases) && s.honoured > 0 && s.bans > 0
}

// playInvariantCases plays n generated cases of 150 steps each on rdb
// (miniredis m, whose clock the cases set; rdb nil: the decider in
// process) and sums what they reached; it stops at the first that fails.
func playInvariantCases(t *testing.T, rng *rand.Rand, rdb *redis.Client, m *miniredis.Miniredis, n int) (s invariantTally) {
	for c := range n {
		policies := genPolicies(rng, MaxPeriod)
		if rdb == nil {
			// A process deciding alone holds one plan for a key, not
			// replicas on several; and its state takes a new period's
			// past from the key's other periods (seedFrom: a plan edit
			// keeps counts), which the admission log, counting only the
			// plans that share a period, would call early refusals.
			policies = policies[:1]
		}
		var d *invariantDriver
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			d = runInvariantCase(t, rng, rdb, m, policies, 150)
		})
		if t.Failed() {
			return s
		}
		for i := range s.total {
			s.total[i] += d.stats[i]
		}
		for i := range s.calls {
			s.calls[i] += d.calls[i]
		}
		s.leases, s.honoured, s.bans = s.leases+d.leases, s.honoured+d.honoured, s.bans+d.bans
	}
	return s
}

// atLeastAMinute lengthens p's windows to a minute or more (300 ms
// buckets or longer, distinct periods), so that buckets last long enough
// for leases to form at the rates of the limiter-level tests; false when
// the result is not a valid policy.
func atLeastAMinute(p Policy) (Policy, bool) {
	p.Windows = slices.Clone(p.Windows)
	for j := range p.Windows {
		p.Windows[j].Period = max(p.Windows[j].Period, time.Minute+time.Duration(j)*time.Second)
	}
	return p, p.Validate() == nil
}

// disagreeingPolicies derives from p the plans of replicas that disagree
// on a key's limits where a lease matters: p's limits are drawn low
// enough for the traffic of one case to reach them yet high enough for
// leases to form (8 to 208), and one or two other plans allow more (up
// to ten times as much, or anything accepted) on some or all of the same
// windows, with the same ban rule.
func disagreeingPolicies(rng *rand.Rand, p Policy) []Policy {
	low := Policy{Name: "low", Windows: slices.Clone(p.Windows), Ban: p.Ban}
	for j := range low.Windows {
		low.Windows[j].Limit = 8 + rng.Int64N(201)
	}
	policies := []Policy{low}
	for i := range 1 + rng.IntN(2) {
		high := Policy{Name: fmt.Sprint("high", i), Windows: slices.Clone(low.Windows), Ban: p.Ban}
		for j := range high.Windows {
			switch rng.IntN(4) {
			case 0: // the same limit
			case 1:
				high.Windows[j].Limit = 1 + rng.Int64N(MaxLimit)
			default:
				l := high.Windows[j].Limit
				high.Windows[j].Limit = min(l+1+rng.Int64N(10*l), MaxLimit)
			}
		}
		policies = append(policies, high)
	}
	return policies
}

// windowFieldsCheck checks, over a case's admissions, each admitted
// Decision's windows: that Binding is the one with the fewest remaining
// (the longer on a tie), that Reset is when the requests the window
// counts have all slid out (this admission a period on at the earliest,
// the end of the current bucket a period on at the latest), and that
// Remaining never tells the client of more room than its window has,
// beyond what was admitted since the count it reports was read from Redis
// other than through the same lease or block (README, Trade-offs): for
// each window, Remaining <= max(limit - admissions within (x-p, x], 0) +
// the admissions since that read not spent from that lease or block. The
// read is the decision's own round trip; the round trip that took the
// lease or block, for a leased one. Round trips
// over-count (unspent leases, buckets), so they never over-report. The
// admissions' times and windows are the admission log's spans, one per
// admission, in the same order.
type windowFieldsCheck struct {
	// blocks: blocks are in force, and a short window's newest counted
	// bucket may be its coarse record's (lease.go).
	blocks bool
	by     []int // each admission's replica, in the order admitted
	kind   []int // 0 a round trip, 1 leased
	trip   map[int]int
}

// admitted checks the admission d of replica l (r) under pl, logged last
// in log: its windows'
// Binding, Reset and Remaining.
func (c *windowFieldsCheck) admitted(t *testing.T, log *admissionLog, l *Limiter, r int, pl *plan, d Decision) {
	t.Helper()
	if c.trip == nil {
		c.trip = map[int]int{}
	}
	x := d.Time.UnixMicro()
	kind := 0
	if d.Leased {
		kind = 1
	}
	n := len(c.by)
	if len(log.spans) != n+1 {
		t.Fatalf("the admission log holds %d spans for %d admissions", len(log.spans), n+1)
	}
	c.by, c.kind = append(c.by, r), append(c.kind, kind)
	for i, w := range pl.windows {
		read := n // the admissions after read were not seen
		if d.Leased {
			read = c.trip[r]
		}
		var others int64
		for j := read + 1; j < n; j++ {
			own := c.by[j] == r && c.kind[j] == kind
			if sp := log.spans[j]; !own && sp.start > x-w.period && slices.Contains(sp.periods, w.period) {
				others++
			}
		}
		// Reset: when the requests the window counts have all slid out.
		// This admission is among them, and the newest any of them can
		// be is the end of the current bucket (a lease's or a
		// block's end, recorded as its bucket's last event,
		// rounded up to the record's unit).
		g, unit := w.gran, w.unit
		if c.blocks && w.gran < blockLife.Microseconds() {
			// A block is counted in the coarse bucket of its end, at most
			// the one after the current, until that bucket's end plus the
			// period rounded up to whole coarse buckets (lease.go).
			cr := blockRing(w)
			g, unit = 2*cr.gran+coarseLate(w), cr.unit
		}
		if reset, most := d.Windows[i].Reset.UnixMicro(), x+w.period+g+unit; reset < x+w.period || reset > most {
			t.Fatalf("replica %d (leased %v) at %d µs: the %s window's reset %d µs is not within [%d, %d] (x + period, plus a bucket of %d µs and a unit)",
				r, d.Leased, x, time.Duration(w.period)*time.Microsecond, reset, x+w.period, most, w.gran)
		}
		room := max(w.limit-log.count(w.period, x), 0)
		if got := d.Windows[i].Remaining; got > room+others {
			t.Fatalf("replica %d (leased %v) at %d µs: the %s window reports %d remaining; its limit %d leaves %d, and %d were admitted otherwise since its count was read",
				r, d.Leased, x, time.Duration(w.period)*time.Microsecond, got, w.limit, room, others)
		}
	}
	// Binding: the window with the fewest remaining, the longer on a tie
	// (Windows are ordered by period).
	bind := 0
	for i, w := range d.Windows {
		if w.Remaining <= d.Windows[bind].Remaining {
			bind = i
		}
	}
	if d.Binding != bind {
		t.Fatalf("replica %d at %d µs: binding window %d of %+v, want %d (the fewest remaining, the longer on a tie)", r, x, d.Binding, d.Windows, bind)
	}
	if kind == 0 {
		c.trip[r] = n
	}
}

// outliveProbe is an admission (at x, Redis time, µs) under plan plan
// whose windows checkWindowsOutlive looks at just before it leaves them.
type outliveProbe struct {
	x    int64
	plan int
}

// checkWindowsOutlive checks, through l.Usage, that a window's record
// never forgets an admission before it leaves the window by its own
// time: 1 µs before each probe's admission is a period old, each window
// of its plan still counts at least every admission of the log within
// that period (its own and those since, of every plan sharing the
// window). A leased admission is recorded when its lease is granted and
// spent later, so this holds only if a lease is spent before the time
// the script records as its end. The clock moves forward only: probes
// it has passed are skipped.
func checkWindowsOutlive(t *testing.T, f *fixture, l *Limiter, policies []Policy, probes []outliveProbe, log *admissionLog) {
	t.Helper()
	type at struct {
		t    int64
		plan int
	}
	var ats []at
	for _, p := range probes {
		for _, w := range policies[p.plan].Windows {
			ats = append(ats, at{p.x + w.Period.Microseconds() - 1, p.plan})
		}
	}
	slices.SortFunc(ats, func(a, b at) int { return cmp.Compare(a.t, b.t) })
	for _, a := range ats {
		if a.t < f.clk.Now().UnixMicro() {
			continue
		}
		f.clk.Set(time.UnixMicro(a.t))
		u, err := l.Usage(context.Background(), "k", policies[a.plan])
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range u.Windows {
			if n := log.count(w.Period.Microseconds(), a.t); w.Used < n {
				t.Fatalf("%v: at %d µs the %s window of plan %d counts %d admissions, short of the %d admitted within it",
					policies, a.t, w.Period, a.plan, w.Used, n)
			}
		}
	}
}

// TestInvariantThroughTheLimiter checks the window promise through the
// whole Limiter (leases, the rejection cache, the batcher) with three
// replicas on one miniredis, each deciding the key under its own view of
// generated plans, with traffic dense enough for leases to form: every
// admission, leased or not, is held by its Decision.Time to the limits of
// the plan that decided it, counting the admissions of every plan that
// shares the window.
func TestInvariantThroughTheLimiter(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 4)
	leased, retried, gaveBack := 0, 0, 0
	// At least 40 cases: each takes about 0.15 s (about 1 s under -race), and
	// what this test alone can find needs several replicas, plans and
	// leases to meet (the lease cap's case took 1,000 plans to find).
	for c := range testenv.Cases(t, 5, max(*invariantCases/4, 40)) {
		var policies []Policy
		for _, p := range genPolicies(rng, 24*time.Hour) {
			if p, ok := atLeastAMinute(p); ok {
				policies = append(policies, p)
			}
		}
		if len(policies) == 0 {
			continue
		}
		// Half the cases put the replicas at odds where it matters most:
		// a plan whose limits a lease can reach within the case beside
		// plans that allow more on the same windows.
		// (A jump of up to a period every jumps steps, on average, lets
		// windows empty; the disagreeing plans need them to fill.)
		steps, jumps := 400, 50
		if c%2 == 1 {
			policies, steps, jumps = disagreeingPolicies(rng, policies[0]), 1000, 1000
		}
		// Whether the replicas disagree on the key's plan: then one may
		// admit where another's windows are full (a higher limit, or no
		// such window), and a cached refusal's Retry-After may be short
		// (README).
		disagree := false
		for _, p := range policies[1:] {
			disagree = disagree || !slices.Equal(p.Windows, policies[0].Windows)
		}
		// Each replica's share of the traffic, drawn again from time to
		// time (zero: silent), so that one may take a lease and fall
		// quiet while another fills the window.
		var weights [3]int
		reweigh := func() {
			for weights == [3]int{} {
				if rng.IntN(3) > 0 {
					weights[rng.IntN(3)] = 1
					continue
				}
				for i := range weights {
					if rng.IntN(2) == 0 {
						weights[i] = 1 + rng.IntN(4)
					}
				}
			}
		}
		reweigh()
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			f := newFixture(t, Options{})
			// The live replica count (which sizes leases) is drawn, not
			// heard from heartbeats on real time, and nothing runs on
			// real time in the background (inStep: give-backs are sent
			// where a block is let go, and the test sweeps), so that a
			// seed replays its case exactly.
			replicas := 1 + rng.IntN(3)
			var ls []*Limiter
			for range 3 {
				l, err := newLimiter(f.rdb, Options{Timeout: 2 * time.Second, Prefix: "petstore:rl:", Replicas: replicas}, hooks{clock: f.clk.Now, noHeartbeat: true, inStep: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				ls = append(ls, l)
			}
			plans := make([]*plan, len(policies))
			for i, p := range policies {
				plans[i] = compile(p, DefaultBuckets, DefaultStrikeBuckets)
			}
			var log admissionLog
			var probes []outliveProbe
			var fields windowFieldsCheck
			// applied counts the give-backs that took admissions off the
			// key's windows (giveback.go), and asked what it was before
			// the last ask: a give-back only ever makes room.
			var asked int64
			// learnt is, per replica, what applied was before its last
			// round trip that refused the key: what its rejection cache
			// answers was exact then.
			var learnt [3]int64
			applied := func() (n int64) {
				for _, l := range ls {
					n += l.back.applied.Load()
				}
				return n
			}
			// ask decides one request of replica r under plan pi, and
			// checks an admission against the windows of its plan.
			ask := func(r, pi int) Decision {
				asked = applied()
				d, err := ls[r].Allow(context.Background(), "k", policies[pi])
				if err != nil {
					t.Fatal(err)
				}
				// A block the request earned is taken before the
				// next request, at its time: a seed replays its case.
				if d.Degraded {
					t.Fatalf("degraded decision on miniredis: %+v", d)
				}
				if !d.Allowed() {
					if !d.Cached {
						learnt[r] = asked
					}
					return d
				}
				if d.Leased {
					leased++
				}
				x := d.Time.UnixMicro()
				if w, n := log.admit(plans[pi], x); w != nil {
					t.Fatalf("%v: replica %d (plan %d, leased %v): %d admissions within %s ending at %d, limit %d",
						policies, r, pi, d.Leased, n, time.Duration(w.period)*time.Microsecond, x, w.limit)
				}
				fields.admitted(t, &log, ls[r], r, plans[pi], d)
				// (Every third leased admission: a probe costs a round
				// trip.)
				if d.Leased && leased%3 == 0 {
					probes = append(probes, outliveProbe{x: x, plan: pi})
				}
				return d
			}
			for range steps {
				// (Whole microseconds, as Redis's clock reads: a replica's
				// clock finer than the server's would put its rejection
				// cache's end a fraction of a microsecond past the
				// server's, which a real round trip's latency rules out.)
				f.clk.Add(time.Duration(rng.Int64N(2000)) * time.Microsecond)
				if rng.IntN(jumps) == 0 {
					f.clk.Add(time.Duration(rng.Int64N(policies[0].Windows[0].Period.Microseconds())) * time.Microsecond)
				}
				if rng.IntN(60) == 0 {
					weights = [3]int{}
					reweigh()
				}
				// A replica sweeps now and then, as its loop does every
				// second: idle keys' leases and blocks go.
				if rng.IntN(25) == 0 {
					ls[rng.IntN(3)].sweep(f.clk.Now())
				}
				r := 0
				for x := rng.IntN(weights[0] + weights[1] + weights[2]); x >= weights[r]; r++ {
					x -= weights[r]
				}
				pi := r % len(policies)
				d := ask(r, pi)
				if d.Outcome != Limited || rng.IntN(4) > 0 {
					continue
				}
				// Retry-After is the exact wait, from this replica too
				// (its rejection cache answers until then): 1 µs before it
				// the key is refused with 1 µs to wait, and at it admitted,
				// unless the strike of the first retry began a ban. While
				// replicas disagree on the plan, a refusal from the cache,
				// or from the short windows alone under a block of
				// the long ones (which ends before the retry), may be
				// short by what the others admitted since the cache, or
				// the block, learnt the windows (README): it must
				// still never be long.
				// Unspent admissions given back since the refusal (for a
				// cached one, since Redis told it) may have made room
				// before it: then it was exact when told.
				retry := d.Time.Add(d.RetryAfter)
				before := asked
				if d.Cached {
					before = learnt[r]
				}
				f.clk.Set(retry.Add(-time.Microsecond))
				early := ask(r, pi)
				stale := d.Cached && disagree
				if applied() != before {
					gaveBack++
				} else if early.Allowed() || !stale && early.Outcome == Limited && early.RetryAfter != time.Microsecond {
					t.Fatalf("%v: replica %d (plan %d) refused at %d µs with Retry-After %s; 1 µs before it: %s, Retry-After %s",
						policies, r, pi, d.Time.UnixMicro(), d.RetryAfter, early.Outcome, early.RetryAfter)
				}
				f.clk.Set(retry)
				if late := ask(r, pi); early.Outcome == Limited && !late.Allowed() && !stale {
					t.Fatalf("%v: replica %d (plan %d) refused at %d µs with Retry-After %s; at it: %s, Retry-After %s",
						policies, r, pi, d.Time.UnixMicro(), d.RetryAfter, late.Outcome, late.RetryAfter)
				}
				retried++
			}
			checkWindowsOutlive(t, f, ls[0], policies, probes, &log)
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("%d admissions came from leases and blocks; %d refusals retried 1 µs before and at their Retry-After (%d of them 1 µs before after a give-back)", leased, retried, gaveBack)
}
