package ratelimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// The block promise, checked on the script itself: replicas holding
// blocks spend them without Redis, at any time before their end, and no
// interval of any window's period ever holds more admissions, counted at
// the times they were spent, than the limit of the plan that admitted
// each; a refusal's Retry-After is the true wait for the counts Redis
// holds (refused a microsecond before it, admitted at it) and never
// shorter than, nor more than a coarse bucket past, the wait of a window
// that counts each grant until its own end.

// blockReplica is one replica of a block case: the plan it decides under
// and what it holds to spend without Redis (a block or a lease): left
// admissions before end (µs, Redis time), under plan held.
type blockReplica struct {
	plan, held int
	left, end  int64
}

// blockSpan is what one decision put in the windows: k admissions between
// start and end, under plan p; spends lists when those of a block or a
// lease were spent, each counted as one at its own time.
type blockSpan struct {
	p          int
	start, end int64
	k          int64
}

type blockDriver struct {
	t        *testing.T
	rng      *rand.Rand
	rdb      *redis.Client
	mini     *miniredis.Miniredis
	plans    []*plan
	keys     [][]string
	replicas []blockReplica
	now      int64
	// spent: every admission at the time it was spent, with its plan;
	// spans: every grant, as a window counting it until its end would.
	spent []blockSpan
	spans []blockSpan
	// stats: allShort counts the blocks granted under plans of short
	// windows alone.
	stats        struct{ calls, admitted, refused, blocks, allShort, fromBlocks, leases, exact int }
	singleLimits bool
}

func (d *blockDriver) describe() string {
	s := ""
	for _, pl := range d.plans {
		s += fmt.Sprintf("%v ban %+v; ", pl.policy.Windows, pl.policy.Ban)
	}
	return s + fmt.Sprintf("%d replicas", len(d.replicas))
}

func (d *blockDriver) clock() int64 {
	if d.mini != nil {
		return d.now
	}
	return time.Now().UnixMicro()
}

// windows holds every window of plan p to its limit at x, counting
// admissions by their spend times, and returns the first that is over.
func (d *blockDriver) checkWindows(p int, x int64) {
	t := d.t
	t.Helper()
	for _, w := range d.plans[p].windows {
		var n int64
		for _, s := range d.spent {
			if s.start <= x && s.start > x-w.period && slices.ContainsFunc(d.plans[s.p].windows, func(r ring) bool { return r.period == w.period }) {
				n += s.k
			}
		}
		if n > w.limit {
			t.Fatalf("%s\nwindow %d/%dµs of plan %d holds %d admissions in (%d, %d]", d.describe(), w.limit, w.period, p, n, x-w.period, x)
		}
	}
}

// coarseLate is how much longer than a period after its end a coarse
// bucket of short window w's blocks counts: the period rounded up to
// whole coarse buckets, less the period (blockRing; untl in lua/ring.lua).
// None where the coarse bucket divides the period, as blockLife divides
// a minute; under a coarse bucket otherwise: a 32 s period has buckets of
// 10,666,666 µs and counts a bucket for four of them past its end, 10.7 s
// more than the period.
func coarseLate(w ring) int64 {
	cr := blockRing(w)
	return (cr.n-1)*cr.gran - w.period
}

// spanWait is how long after x a request under plan p would wait were
// each grant counted in each window from its start until its end: the
// least a Retry-After may say; and slack, how much more it may say: the
// widest bucket of the plan's records, a coarse one's with its period's
// rounding (coarseLate).
func (d *blockDriver) spanWait(p int, x int64) (wait int64, slack int64) {
	for i, w := range d.plans[p].windows {
		var in []blockSpan
		var c int64
		for _, s := range d.spans {
			if s.start <= x && s.end > x-w.period && slices.ContainsFunc(d.plans[s.p].windows, func(r ring) bool { return r.period == w.period }) {
				in = append(in, s)
				c += s.k
			}
		}
		g := w.gran
		if pl := d.plans[p].blk; i < len(pl.coarse) {
			g = pl.coarse[i].gran + coarseLate(w)
		}
		slack = max(slack, g)
		if c < w.limit {
			continue
		}
		sort.Slice(in, func(a, b int) bool { return in[a].end < in[b].end })
		excess, acc := c-w.limit+1, int64(0)
		for _, s := range in {
			acc += s.k
			if acc >= excess {
				wait = max(wait, s.end+w.period-x)
				break
			}
		}
	}
	return wait, slack
}

func (d *blockDriver) call(p int, in input) verdict {
	t := d.t
	t.Helper()
	if d.mini != nil {
		d.mini.SetTime(time.UnixMicro(d.now))
	}
	pl := d.plans[p]
	ctx := context.Background()
	nums := scriptNums(pl, in)
	if in.block != nil {
		shortenBlock(d.rng, nums)
	}
	ds := []decision{{keys: d.keys[p], pl: pl.blk, nums: nums}}
	var replies []any
	var err error
	if d.mini != nil {
		replies, err = evalBatch(ctx, d.rdb, ds)
	} else {
		replies, err = fcallBatch(ctx, d.rdb, ds)
	}
	if err != nil {
		t.Fatalf("%s: %v", d.describe(), err)
	}
	v, err := decode(pl, replies[0])
	if err != nil {
		t.Fatal(err)
	}
	if d.mini != nil && v.now != d.now {
		t.Fatalf("script time %d, clock %d", v.now, d.now)
	}
	return v
}

// request is one request reaching replica r at the driver's clock.
func (d *blockDriver) request(r int) {
	t := d.t
	t.Helper()
	rep := &d.replicas[r]
	x := d.clock()
	if rep.left > 0 && rep.held == rep.plan && x < rep.end-d.margin() {
		// One request, or a burst that spends all of it at once.
		k := int64(1)
		if d.rng.IntN(4) == 0 {
			k = rep.left
		}
		rep.left -= k
		d.spent = append(d.spent, blockSpan{p: rep.held, start: x, k: k})
		d.stats.fromBlocks += int(k)
		d.checkWindows(rep.held, x)
		return
	}
	// What it held is let go (its plan changed, it ended, it is spent).
	rep.left = 0
	var in input
	switch k := d.rng.IntN(10); {
	case k < 6:
		in.block = &blockAsk{max: 2 + d.rng.Int64N(300), replicas: int64(len(d.replicas)), rtt: d.rng.Int64N(3000)}
	case k < 8:
		want := 2 + d.rng.Int64N(64)
		if d.rng.IntN(4) == 0 {
			want = 2 + d.rng.Int64N(70_000)
		}
		in.lease = leaseAsk{want: want, need: want, life: 1 + d.rng.Int64N(2_000_000)}
	}
	v := d.call(rep.plan, in)
	d.stats.calls++
	x = v.now
	if v.outcome != Allowed {
		d.stats.refused++
		d.checkRetry(rep.plan, x, v)
		return
	}
	d.stats.admitted++
	d.spent = append(d.spent, blockSpan{p: rep.plan, start: x, k: 1})
	d.spans = append(d.spans, blockSpan{p: rep.plan, start: x, end: x, k: 1})
	d.checkWindows(rep.plan, x)
	if v.granted > 1 {
		if in.block != nil {
			d.stats.blocks++
			if d.plans[rep.plan].allShort {
				d.stats.allShort++
			}
		} else {
			d.stats.leases++
		}
		if v.leaseEnd <= x || v.leaseEnd > x+blockLife.Microseconds() {
			t.Fatalf("%s\na grant of %d at %d ends at %d", d.describe(), v.granted, x, v.leaseEnd)
		}
		// A grant leaves every window, both records summed, margin times
		// its size times the replicas.
		k := v.granted - 1
		need := k * (leaseMargin*int64(len(d.replicas)) - 1)
		if in.block == nil {
			need = 0
		}
		for i, w := range d.plans[rep.plan].windows {
			if left := w.limit - v.win[i].used; left < need {
				t.Fatalf("%s\na grant of %d at %d leaves window %d/%dµs %d (used %d), less than the %d the margin keeps", d.describe(), k, x, w.limit, w.period, left, v.win[i].used, need)
			}
		}
		rep.held, rep.left, rep.end = rep.plan, v.granted-1, v.leaseEnd
		d.spans = append(d.spans, blockSpan{p: rep.plan, start: x, end: v.leaseEnd, k: v.granted - 1})
	}
}

// margin is how long before a grant's end a replica stops spending it:
// none where the test sets the clock, a millisecond by real time (the
// replica's clock is read before the spend is logged).
func (d *blockDriver) margin() int64 {
	if d.mini != nil {
		return 0
	}
	return 1000
}

// checkRetry holds a refusal at x under plan p to its promise: no shorter
// than a window counting each grant until its end would wait (for a plan
// without a ban rule: a ban's wait is its own), at most a coarse bucket
// and the period's rounding up to whole ones (coarseLate) past it when
// only one plan decides, and, where the clock can be set,
// exact: a peek a microsecond before it is refused, one at it admitted.
func (d *blockDriver) checkRetry(p int, x int64, v verdict) {
	t := d.t
	t.Helper()
	if v.retry <= 0 {
		t.Fatalf("%s\nrefused at %d with Retry-After %d", d.describe(), x, v.retry)
	}
	if !d.plans[p].ban.on {
		ideal, slack := d.spanWait(p, x)
		if v.retry < ideal {
			t.Fatalf("%s\nrefused at %d: Retry-After %dµs, short of the %dµs its grants' ends need", d.describe(), x, v.retry, ideal)
		}
		if d.singleLimits && v.retry > ideal+slack+1 {
			t.Fatalf("%s\nrefused at %d: Retry-After %dµs, more than a coarse bucket and its period's rounding (%dµs) past the %dµs its grants' ends need", d.describe(), x, v.retry, slack, ideal)
		}
	}
	if d.mini == nil || d.rng.IntN(3) > 0 {
		return
	}
	// Nothing reaches Redis in between: blocks spent meanwhile change
	// nothing there.
	d.now = x + v.retry - 1
	if pv := d.call(p, input{peek: true}); pv.outcome == Allowed {
		t.Fatalf("%s\nrefused at %d with Retry-After %dµs, admitted a microsecond before it", d.describe(), x, v.retry)
	}
	d.now++
	if pv := d.call(p, input{peek: true}); pv.outcome != Allowed {
		t.Fatalf("%s\nrefused at %d with Retry-After %dµs, still refused at it (%v, %dµs more)", d.describe(), x, v.retry, pv.outcome, pv.retry)
	}
	d.stats.exact++
}

// shortenBlock gives a third of the asks for a block (nums, scriptNums) a
// life shorter than blockLife, as a replica whose plan has other long
// windows (ending their buckets sooner) would: blocks then end out of the
// order they were granted in, and one may end in a coarse bucket before
// the head (blockWrite in lua/window.lua).
func shortenBlock(rng *rand.Rand, nums []byte) {
	if rng.IntN(3) == 0 {
		binary.BigEndian.PutUint64(nums[32:40], uint64(1+rng.Int64N(blockLife.Microseconds())))
	}
}

// genBlockPlans draws a plan of short and long windows (in a quarter of
// the cases, short ones alone) and, in half the
// cases, a second plan of the same periods with other limits (replicas
// that disagree on the key's plan share its records, coarse ones too).
func genBlockPlans(rng *rand.Rand) []*plan {
	pl, ns := genBlockPlan(rng)
	if rng.IntN(2) == 0 {
		// Short windows whose blocks are large against their limits: a
		// block's life is most of such a period, or longer.
		for i := range ns {
			// (32 s: a period blockLife does not divide, whose coarse
			// buckets count longer: coarseLate.)
			pl.policy.Windows[i].Period = []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, 32 * time.Second, time.Minute}[rng.IntN(6)] + time.Duration(i)*time.Millisecond
		}
	}
	if rng.IntN(4) == 0 {
		// Short windows alone (a minute only, say): blocks asked on the
		// whole decision, no long window to count them in.
		pl.policy.Windows = pl.policy.Windows[:ns]
	}
	for i := range pl.policy.Windows {
		if rng.IntN(3) > 0 {
			// Limits a few replicas' traffic fills.
			pl.policy.Windows[i].Limit = 1 + rng.Int64N(400)
		}
	}
	if rng.IntN(2) == 0 {
		pl.policy.Ban = BanPolicy{}
	}
	plans := []*plan{compile(pl.policy, DefaultBuckets, DefaultStrikeBuckets)}
	if rng.IntN(2) == 0 {
		p2 := pl.policy.clone()
		for i := range p2.Windows {
			if rng.IntN(2) == 0 {
				p2.Windows[i].Limit = max(1, p2.Windows[i].Limit/int64(2+rng.IntN(4)))
			}
		}
		plans = append(plans, compile(p2, DefaultBuckets, DefaultStrikeBuckets))
	}
	for _, p := range plans {
		p.split()
	}
	return plans
}

func runBlockCase(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, steps int) *blockDriver {
	d := &blockDriver{t: t, rng: rng, rdb: rdb, mini: mini, plans: genBlockPlans(rng)}
	for !slices.ContainsFunc(d.plans, func(pl *plan) bool { return pl.blk != nil }) {
		d.plans = genBlockPlans(rng)
	}
	d.singleLimits = len(d.plans) == 1
	prefix := randomPrefix(t)
	for _, pl := range d.plans {
		d.keys = append(d.keys, stateKeys(prefix, "k", pl.blk))
	}
	n := 1 + rng.IntN(4)
	for range n {
		d.replicas = append(d.replicas, blockReplica{plan: rng.IntN(len(d.plans)), held: -1})
	}
	d.now = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(1e9)
	short := d.plans[0].windows[0].period
	for range steps {
		if mini != nil {
			// Steps from a microsecond to past a coarse bucket, some to
			// just before a replica's grant ends.
			switch k := rng.IntN(20); {
			case k == 0:
				d.now += blockLife.Microseconds() + rng.Int64N(short+1)
			case k < 3:
				r := &d.replicas[rng.IntN(n)]
				if r.left > 0 && r.end > d.now {
					d.now = r.end - 1 - rng.Int64N(min(r.end-d.now, 3))
				}
			case k < 10:
				d.now += 1 + rng.Int64N(max(short/50, 2))
			default:
				d.now += 1 + rng.Int64N(1000)
			}
		} else if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.Int64N(3000)) * time.Microsecond)
		}
		if len(d.plans) > 1 && rng.IntN(40) == 0 {
			r := &d.replicas[rng.IntN(n)]
			r.plan = rng.IntN(len(d.plans))
		}
		d.request(rng.IntN(n))
	}
	return d
}

func TestBlocksHoldEveryWindowMiniredis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 70)
	var total blockDriver
	for c := range testenv.Cases(t, 16, max(*invariantCases, 60)) {
		mini, rdb := newMini(t, time.Now())
		d := runBlockCase(t, rng, rdb, mini, 400)
		total.stats.calls += d.stats.calls
		total.stats.blocks += d.stats.blocks
		total.stats.allShort += d.stats.allShort
		total.stats.fromBlocks += d.stats.fromBlocks
		total.stats.refused += d.stats.refused
		total.stats.exact += d.stats.exact
		total.stats.leases += d.stats.leases
		mini.Close()
		_ = c
	}
	s := total.stats
	t.Logf("%d calls, %d refused (%d retried exactly at Retry-After), %d blocks granted (%d under plans of short windows alone), %d admissions spent from blocks or leases, %d leases",
		s.calls, s.refused, s.exact, s.blocks, s.allShort, s.fromBlocks, s.leases)
	if s.blocks == 0 || s.allShort == 0 || s.refused == 0 || s.exact == 0 {
		t.Fatal("the cases granted no block (or none under a plan of short windows alone), refused nothing or checked no Retry-After exactly")
	}
}

func TestBlocksHoldEveryWindowRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, 71)
	blocks, refused := 0, 0
	for range 8 {
		d := runBlockCase(t, rng, rdb, nil, 300)
		blocks += d.stats.blocks
		refused += d.stats.refused
	}
	t.Logf("%d blocks granted, %d refused", blocks, refused)
	if blocks == 0 {
		t.Fatal("no block granted")
	}
}

// TestBanReachesBlockHolders: a key banned on one replica is let go by
// another that holds a block for it, through the announcement, so that
// its next request there is refused as banned rather than spent from the
// block for up to its life; what the block left is given back.
func TestBanReachesBlockHolders(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, Options{Replicas: 2}, hooks{blocks: true})
	ls := f.fleet(t, 2)
	holder, other := ls[0], ls[1]
	p := Policy{Name: "banning", Windows: []Window{{Limit: 400, Period: time.Minute}, {Limit: 100_000, Period: 24 * time.Hour}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 1, Memory: time.Hour}}
	ctx := context.Background()
	f.clk.Set(epoch.Truncate(432 * time.Second).Add(432 * time.Second))
	for i := 0; blockLeft(holder, "k") < 2; i++ {
		if i == 60 {
			t.Fatal("no block for a key sending 4 requests/s")
		}
		if _, err := holder.Allow(ctx, "k", p); err != nil {
			t.Fatal(err)
		}
		f.clk.Add(250 * time.Millisecond)
	}
	held := blockLeft(holder, "k")
	// Subscriptions are set up asynchronously; give them a moment.
	time.Sleep(100 * time.Millisecond)
	banned := false
	for i := 0; i < 2000 && !banned; i++ {
		d, err := other.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		banned = d.Outcome == Banned
	}
	if !banned {
		t.Fatal("the other replica never banned the key")
	}
	deadline := time.Now().Add(2 * time.Second)
	for blockLeft(holder, "k") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of a block's %d admissions still held 2 s after a ban elsewhere", blockLeft(holder, "k"), held)
		}
		time.Sleep(5 * time.Millisecond)
	}
	d, err := holder.Allow(ctx, "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != Banned || d.Leased {
		t.Fatalf("the block's holder after the ban: %+v, want refused as banned", d)
	}
}

// TestBlockLifeAsTheReplicaWorksItOut: the life a replica sizes its ask
// for with blocks in force (blockRest) is the life the script grants a
// block, at every instant of a coarse bucket, over generated plans: a
// replica that worked out less (the current coarse bucket's end, say)
// would ask for blocks half as large as they could be, and a key sending a
// request or two a second would seldom qualify.
func TestBlockLifeAsTheReplicaWorksItOut(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 74)
	granted := 0
	for c := range testenv.Cases(t, 10, max(*invariantCases, 40)) {
		pl, _ := genBlockPlan(rng)
		for i := range pl.policy.Windows {
			pl.policy.Windows[i].Limit = MaxLimit
		}
		pl = compile(pl.policy, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		mini, rdb := newMini(t, time.Now())
		keys := stateKeys(randomPrefix(t), "k", pl.blk)
		now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		for range 40 {
			now = now.Add(time.Duration(1 + rng.Int64N(int64(3*time.Second))))
			mini.SetTime(now)
			in := input{block: &blockAsk{max: 1 << 20, replicas: 1}}
			rs, err := evalBatch(context.Background(), rdb, []decision{{keys: keys, pl: pl.blk, nums: scriptNums(pl, in)}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := decode(pl, rs[0])
			if err != nil {
				t.Fatal(err)
			}
			if v.granted <= 1 {
				continue
			}
			granted++
			if want := blockRest(pl, v.now, 0); v.leaseEnd-v.now != want {
				t.Fatalf("case %d, %v at %d: a block of %d granted for %d µs, the replica works out %d", c, pl.policy.Windows, v.now, v.granted-1, v.leaseEnd-v.now, want)
			}
		}
		mini.Close()
	}
	if granted == 0 {
		t.Fatal("no block granted")
	}
}

// TestBlockCapKeepsTheLaterEnd: a block's cap written over another's in
// force keeps the lower limit until the later of their ends. With two
// plans on one short period whose long windows differ, a block granted
// later may end earlier: plan A (a higher short limit and a day) is
// granted a block that ends after H, the end of an hour's bucket; plan B
// (a lower short limit and an hour) is then granted one ending at H. After
// H, before A's block ends, plan C (a short limit above A's, and a day)
// sends until refused, and A's block is spent, half then, half in its
// last microsecond: the window must hold no more than A's limit at
// either, so the cap must not end with B's block. Drawn over short
// periods of 1 s to a minute (coarse buckets of 1 s to 10 s), limits and
// the moment of each grant; every admission fits its plan's windows by
// its spend time.
func TestBlockCapKeepsTheLaterEnd(t *testing.T) {
	t.Parallel()
	playOnMiniredis(t, 74, runBlockCapLaterEnd, testenv.Cases(t, 8, max(*invariantCases/2, 30)))
}

// TestBlockCapKeepsTheLaterEndOnRedis plays the cases above on a real
// Redis by real time, on short periods of 1-3 s, with B's long window one
// of 2000-2400 s (buckets of 10-12 s) in place of the hour, so that H is
// seconds away.
func TestBlockCapKeepsTheLaterEndOnRedis(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	playOnRedis(t, 75, runBlockCapLaterEnd)
}

// runBlockCapLaterEnd plays one case of TestBlockCapKeepsTheLaterEnd, on
// miniredis (mini) by its clock or on a real Redis by real time, and
// reports whether both blocks were granted where and with the room the
// case needs (on a real Redis, a late call may miss its mark).
func runBlockCapLaterEnd(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) bool {
	t.Helper()
	p := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute}[rng.IntN(5)]
	bLong := time.Hour
	if mini == nil {
		p = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}[rng.IntN(3)]
		bLong = 2000*time.Second + time.Duration(rng.IntN(400))*time.Second
	}
	p += time.Duration(rng.IntN(20)) * time.Millisecond
	m := 20 + rng.Int64N(30) // plan A's admissions in the period before its block
	lb := 2*m + 30 + rng.Int64N(m)
	la := lb + 10 + rng.Int64N(m)
	lc := 2*la + rng.Int64N(la)
	mk := func(short int64, long time.Duration) *plan {
		pl := compile(Policy{Name: "p", Windows: []Window{{Limit: short, Period: p}, {Limit: 1_000_000, Period: long}}}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		return pl
	}
	pa, pb, pc := mk(la, 24*time.Hour), mk(lb, bLong), mk(lc, 24*time.Hour)
	what := fmt.Sprintf("A %v, B %v, C %v", pa.policy.Windows, pb.policy.Windows, pc.policy.Windows)
	pw, g := p.Microseconds(), blockRing(pa.windows[0]).gran
	hourG, dayG := pb.windows[1].gran, pa.windows[1].gran

	clock, waitUntil, slack := caseTime(rng, mini)
	// H, an hour's bucket end with no day's bucket end near it; A's block
	// asked at t1, within a coarse bucket (and a block's life) before H,
	// so that it ends past H; B's at t3, between.
	H := (clock()/hourG + 2) * hourG
	for H/dayG != (H-2*pw-2*g)/dayG || H/dayG != (H+2*g)/dayG {
		H += hourG
	}
	span := min(g, blockLife.Microseconds())
	t1 := H - span/4 - rng.Int64N(span/2)
	t3 := t1 + slack + rng.Int64N(H-t1-2*slack)
	what += fmt.Sprintf(" (H %d)", H)

	prefix := randomPrefix(t)
	call := func(pl *plan, in input) verdict {
		t.Helper()
		return decideOne(t, rdb, mini, decision{keys: stateKeys(prefix, "k", pl.blk), pl: pl.blk, nums: scriptNums(pl, in)}, pl, what)
	}
	var log admissionLog
	admit := func(pl *plan, x int64, who string) { t.Helper(); log.mustAdmit(t, pl, x, what, who) }
	// misplaced reports a block or call that does not land where the
	// case needs it: a failure on miniredis, a missed mark by real time.
	misplaced := func(ok bool, format string, args ...any) bool {
		t.Helper()
		if !ok && mini != nil {
			t.Fatalf("%s: "+format, append([]any{what}, args...)...)
		}
		return !ok
	}

	// Plan A's traffic over the period before its block, then the block.
	for i := range m {
		waitUntil(t1 - pw + 1 + (pw-2*slack)*i/m)
		if v := call(pa, input{lease: noLease}); v.outcome == Allowed {
			admit(pa, v.now, "plan A's admission")
		}
	}
	block := func(pl *plan, at, most int64, name string) verdict {
		t.Helper()
		waitUntil(at)
		v := call(pl, input{lease: noLease, block: &blockAsk{max: most, replicas: 1}})
		if v.outcome != Allowed {
			t.Fatalf("%s: %s's block request at %d refused", what, name, v.now)
		}
		admit(pl, v.now, name+"'s block request")
		return v
	}
	a := block(pa, t1, m, "A")
	b := block(pb, t3, 2+rng.Int64N(4), "B")
	if a.granted < 2 || b.granted < 2 {
		return false
	}
	if misplaced(a.leaseEnd > H+2*slack && b.leaseEnd == H,
		"A's block granted at %d ends at %d, B's at %d ends at %d; want A's past H %d and B's at it", a.now, a.leaseEnd, b.now, b.leaseEnd, H) {
		return false
	}
	for range b.granted - 1 {
		admit(pb, b.now, "a spend from B's block")
	}
	// After B's block, before A's ends, plan C sends until refused.
	waitUntil(H + slack)
	var last int64
	for range lc + 1 {
		waitUntil(clock() + 1)
		v := call(pc, input{lease: noLease})
		if misplaced(v.now < a.leaseEnd-slack, "plan C not refused between %d and A's block's end %d", H, a.leaseEnd) {
			return false
		}
		if last = v.now; v.outcome != Allowed {
			break
		}
		admit(pc, v.now, "plan C's admission")
	}
	// Half of A's block spent as C is refused, when the window holds all
	// C was admitted (A's block may end more than a period after), the
	// rest in its last microsecond.
	for i := range a.granted - 1 {
		x := a.leaseEnd - max(slack/20, 1)
		if i < (a.granted-1)/2 {
			x = last
		}
		admit(pa, x, "a spend from A's block")
	}
	return true
}

// TestBlockEndingBeforeTheHeadKeepsItsBucketsLastEvent: a block ends
// with its long windows' current buckets when one of them ends before
// the coarse bucket would, so, with two plans on one short period whose
// long windows differ, a block granted later may end earlier than one
// granted before it, in a coarse bucket the head has already left
// (blockWrite's slot write). The bucket then keeps its latest event, not
// the later block's: otherwise the earlier block, spent at its end, would
// slide out of the window early, once the head is a period past it. The
// case, drawn over short periods (coarse buckets of 1 s to 15 s) and
// long windows whose buckets end inside a coarse bucket (an hour's 18 s,
// and others): plan A (the short window and a day) is granted block A1
// ending late in coarse bucket E and block A2 ending in E+1; plan B (the
// same short window and the long one) is granted block B, which ends
// with its long window's bucket, inside E, before A1's end. A1 is spent
// in its last microsecond. A period after B's end, before A1's, plan A
// is granted block A3, which moves the head a period past E, then fills
// its window. Every admission fits its plan's windows by its spend time.
func TestBlockEndingBeforeTheHeadKeepsItsBucketsLastEvent(t *testing.T) {
	t.Parallel()
	playOnMiniredis(t, 72, runBlockBeforeTheHead, testenv.Cases(t, 8, max(*invariantCases/2, 30)))
}

// TestBlockEndingBeforeTheHeadOnRedis plays the cases above on a real
// Redis by real time, on short periods of 1-3 s and long windows of
// buckets of 10-12 s.
func TestBlockEndingBeforeTheHeadOnRedis(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	playOnRedis(t, 73, runBlockBeforeTheHead)
}

// caseTime returns a case's clock (µs), a wait until a time on it, and
// how far the case's marks keep from the edges they must not cross: on
// miniredis (mini), its clock, which the wait moves, from a moment drawn
// in an hour of 2031, and a microsecond; on a real Redis, real time, on
// which a call lands a little after its mark, and 20 ms.
func caseTime(rng *rand.Rand, mini *miniredis.Miniredis) (clock func() int64, waitUntil func(int64), slack int64) {
	if mini == nil {
		clock = func() int64 { return time.Now().UnixMicro() }
		return clock, func(x int64) { time.Sleep(time.Duration(x-clock()) * time.Microsecond) }, 20_000
	}
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	waitUntil = func(x int64) { now = x; mini.SetTime(time.UnixMicro(x)) }
	waitUntil(now)
	return func() int64 { return now }, waitUntil, 1
}

// blockCase plays one drawn case on miniredis (mini) by its clock, or on
// a real Redis (mini nil) by real time, and reports whether it played as
// drawn (on a real Redis, a late call may miss its mark).
type blockCase func(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) bool

// playOnMiniredis plays cases of run drawn from seed, each on a miniredis
// of its own: half of them at least must play as drawn. The caller counts
// them (testenv.Cases, so that make test-long runs it whole).
func playOnMiniredis(t *testing.T, seed uint64, run blockCase, cases int) {
	t.Helper()
	rng := invariantRNG(t, seed)
	played := 0
	for range cases {
		mini, rdb := newMini(t, time.Now())
		if run(t, rng, rdb, mini) {
			played++
		}
		mini.Close()
	}
	t.Logf("%d cases of %d played as drawn", played, cases)
	if played < cases/2 {
		t.Fatalf("%d cases of %d played as drawn", played, cases)
	}
}

// playOnRedis plays three cases of run drawn from seed on a real Redis by
// real time: one at least must play as drawn.
func playOnRedis(t *testing.T, seed uint64, run blockCase) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, seed)
	cases, played := 3, 0
	for range cases {
		if run(t, rng, rdb, nil) {
			played++
		}
	}
	t.Logf("%d cases of %d played as drawn", played, cases)
	if played == 0 {
		t.Fatalf("no case of %d played as drawn", cases)
	}
}

// runBlockBeforeTheHead plays one case of
// TestBlockEndingBeforeTheHeadKeepsItsBucketsLastEvent, on miniredis
// (mini) by its clock or on a real Redis by real time, and reports
// whether its blocks were granted where the case needs them (on a real
// Redis, a late call may miss its mark).
func runBlockBeforeTheHead(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) bool {
	t.Helper()
	p := []time.Duration{time.Second, 3 * time.Second, 7 * time.Second, 10 * time.Second, 15 * time.Second, 20 * time.Second, 30 * time.Second, time.Minute}[rng.IntN(8)]
	if mini == nil {
		p = []time.Duration{time.Second, 1500 * time.Millisecond, 2 * time.Second, 3 * time.Second}[rng.IntN(4)]
	}
	p += time.Duration(rng.IntN(20)) * time.Millisecond
	m := 30 + rng.Int64N(40) // plan A's admissions in the period before A1
	short := Window{Limit: 3*m + rng.Int64N(3*m), Period: p}
	mk := func(ws ...Window) *plan {
		pl := compile(Policy{Name: "p", Windows: ws}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		return pl
	}
	pa := mk(short, Window{Limit: 1_000_000, Period: 24 * time.Hour})
	coarse := blockRing(pa.windows[0])
	pw, g, n := p.Microseconds(), coarse.gran, coarse.n
	dayG, life := pa.windows[1].gran, blockLife.Microseconds()

	clock, waitUntil, slack := caseTime(rng, mini)

	// H, the end of B's long window's bucket, inside coarse bucket E:
	// late enough that A2, granted after E begins, can end past E (with
	// coarse buckets longer than a block's life, only after E's first
	// g - life), early enough that A1 ends after it. All within one
	// bucket of the day, which would otherwise end a block first. By
	// real time, among the long window's next two bucket ends (its
	// period drawn again until one fits), so as not to wait long.
	lo := max(g-life, 0) + g/8 + 200_000
	hi := min(g, life) - g/8
	var H int64
	var pb *plan
	for draw := 0; H == 0 && draw < 200; draw++ {
		long := []time.Duration{time.Hour, 2 * time.Hour, 50 * time.Minute, 3*time.Hour + 7*time.Second}[rng.IntN(4)]
		tries := 1000
		if mini == nil {
			long, tries = 2000*time.Second+time.Duration(rng.IntN(400))*time.Second, 2
		}
		pb = mk(short, Window{Limit: 1_000_000, Period: long})
		h := pb.windows[1].gran
		x := ((clock()+pw+g)/h + 1) * h
		for range tries {
			if off := x % g; off > lo && off < hi && x/dayG == (x-2*pw-3*g)/dayG && x/dayG == (x+2*pw+3*g)/dayG {
				H = x
				break
			}
			x += h
		}
	}
	if H == 0 {
		return false // no bucket of the long window ends inside a coarse one
	}
	what := fmt.Sprintf("A %v, B %v", pa.policy.Windows, pb.policy.Windows)
	E := H / g
	t1 := E*g - slack - rng.Int64N(min(g, life)/16) // A1: the end of E, or within it past H
	t2 := max(E*g, (E+1)*g-life) + slack + rng.Int64N((H-max(E*g, (E+1)*g-life))/4)
	t3 := t2 + slack + rng.Int64N((H-t2)/4)
	if mini != nil {
		mini.FlushAll()
	}

	prefix := randomPrefix(t)
	call := func(pl *plan, in input) verdict {
		t.Helper()
		return decideOne(t, rdb, mini, decision{keys: stateKeys(prefix, "k", pl.blk), pl: pl.blk, nums: scriptNums(pl, in)}, pl, what)
	}
	what += fmt.Sprintf(" (E %d..%d, H %d)", E*g, (E+1)*g, H)
	var log admissionLog
	admit := func(pl *plan, x int64, who string) { t.Helper(); log.mustAdmit(t, pl, x, what, who) }
	block := func(pl *plan, at int64, most int64) verdict {
		t.Helper()
		waitUntil(at)
		v := call(pl, input{lease: noLease, block: &blockAsk{max: most, replicas: 1}})
		if v.outcome != Allowed {
			t.Fatalf("%s: a block's request at %d refused", what, v.now)
		}
		admit(pl, v.now, "a block's request")
		return v
	}
	// misplaced reports a block that does not end where the case needs
	// it: a failure on miniredis, a missed mark by real time.
	misplaced := func(name string, v verdict, ok bool, want string) bool {
		t.Helper()
		if !ok && mini != nil {
			t.Fatalf("%s: %s, granted at %d, ends at %d, not %s", what, name, v.now, v.leaseEnd, want)
		}
		return !ok
	}

	// Plan A's traffic over the period before A1.
	start := t1 - pw
	for i := range m {
		waitUntil(start + (pw-slack)*i/m)
		if v := call(pa, input{lease: noLease}); v.outcome == Allowed {
			admit(pa, v.now, "plan A's admission")
		}
	}
	a1 := block(pa, t1, m)
	a2 := block(pa, t2, 2+rng.Int64N(4))
	b := block(pb, t3, 2+rng.Int64N(4))
	if a1.granted < 3 || a2.granted < 3 || b.granted < 3 {
		return false
	}
	if misplaced("A1", a1, (a1.leaseEnd-1)/g == E && a1.leaseEnd > H, fmt.Sprintf("in coarse bucket %d after H %d", E, H)) ||
		misplaced("A2", a2, (a2.leaseEnd-1)/g == E+1, fmt.Sprintf("in coarse bucket %d", E+1)) ||
		misplaced("B", b, b.leaseEnd == H, fmt.Sprintf("with its long window's bucket at %d", H)) {
		return false
	}
	// A2 and B spent at once; A1 in its last microsecond (by real time,
	// its last millisecond).
	for range a2.granted - 1 {
		admit(pa, a2.now, "a spend from A2")
	}
	for range b.granted - 1 {
		admit(pb, b.now, "a spend from B")
	}
	for range a1.granted - 1 {
		admit(pa, a1.leaseEnd-max(slack/20, 1), "a spend from A1")
	}
	// A period after B's end, before A1's, plan A asks a block that ends
	// in the coarse bucket a period (n - 1 buckets) past E: the head is
	// then there, and E counts until its last event is a period old
	// (untl). (A block asked at x ends at min(x + life, the end of the
	// coarse bucket after x's).) Then plan A fills its window.
	from := max(H+pw, (E+n-1)*g, (E+n)*g-life) + slack
	to := min(a1.leaseEnd+pw, (E+n)*g) - slack
	if from >= to {
		return false
	}
	a3 := block(pa, from+rng.Int64N(to-from), 2)
	if a3.granted < 2 || misplaced("A3", a3, (a3.leaseEnd-1)/g == E+n, fmt.Sprintf("in coarse bucket %d", E+n)) {
		return false
	}
	for range a3.granted - 1 {
		admit(pa, a3.now, "a spend from A3")
	}
	for range short.Limit + 1 {
		v := call(pa, input{lease: noLease})
		if v.outcome != Allowed {
			return true
		}
		admit(pa, v.now, "plan A's admission after B's bucket left the window")
	}
	t.Fatalf("%s: plan A admitted %d requests from %d", what, short.Limit+1, a3.now)
	return true
}

// TestPlansOfShortWindowsAloneTakeBlocks: a plan of a minute window alone
// (no long window to count a block in) takes blocks, asked on its whole decision,
// so that its cold keys, too slow to lease, are decided in process: 100
// keys at five requests a second each, from 10 s to 30 s after they
// begin, send at most 4% of their decisions to Redis with blocks in force;
// without blocks, every one. Their windows holding is
// TestBlocksHoldEveryWindowMiniredis's (plans of short windows alone in a
// quarter of its cases) and TestBlocksHoldEveryWindowThroughTheLimiter's.
func TestPlansOfShortWindowsAloneTakeBlocks(t *testing.T) {
	t.Parallel()
	minute := Policy{Name: "minute", Windows: []Window{{Limit: 1000, Period: time.Minute}}}
	for _, blocks := range []bool{true, false} {
		ts, ds := youngKeys(t, newFixtureWith(t, Options{MaxLease: 64}, hooks{blocks: blocks}), minute)
		trips, decisions := ts[1], ds[1]
		t.Logf("blocks %v: %d of %d decisions from 10 s to 30 s went to Redis", blocks, trips, decisions)
		if blocks && trips*100 > decisions*4 {
			t.Fatalf("blocks in force: %d of %d decisions from 10 s to 30 s went to Redis (%.1f%%), want at most 4%%", trips, decisions, 100*float64(trips)/float64(decisions))
		}
		if !blocks && trips != decisions {
			t.Fatalf("no blocks: %d of %d decisions from 10 s to 30 s went to Redis, want every one (too slow to lease)", trips, decisions)
		}
	}
}

// TestNoBlockWithoutCoarseRecords: the script grants a plan with short
// windows (alone, or beside a long one) a block only where every short
// window has its coarse record to count it in. Asked for a block without
// them (no replica does: it asks only with blocks in force, when it calls
// the plan with them), it grants nothing, since no short window would
// count the grant; with them, it grants blocks to the same traffic.
func TestNoBlockWithoutCoarseRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rng := invariantRNG(t, 75)
	for c := range 20 {
		var ws []Window
		for i := range 1 + rng.IntN(2) {
			ws = append(ws, Window{Limit: 200 + rng.Int64N(2000), Period: []time.Duration{time.Second, 10 * time.Second, time.Minute}[i+rng.IntN(2)]})
		}
		if rng.IntN(2) == 0 {
			ws = append(ws, Window{Limit: 1_000_000, Period: 24 * time.Hour})
		}
		pl := compile(Policy{Name: "short", Windows: ws}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		if pl.shortWindows() == 0 {
			t.Fatalf("%v: no short window", ws)
		}
		granted := map[bool]int64{}
		for _, coarse := range []bool{false, true} {
			start := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(1e15)))
			mini, rdb := newMini(t, start)
			cp := pl
			if coarse {
				cp = pl.blk
			}
			keys := stateKeys(randomPrefix(t), "k", cp)
			// Five requests a second for 20 s, each asking for a block, as
			// though every one reached another replica.
			for i := range 100 {
				mini.SetTime(start.Add(time.Duration(i) * 200 * time.Millisecond))
				nums := scriptNums(pl, input{block: &blockAsk{max: 64, replicas: 1}})
				rs, err := evalBatch(ctx, rdb, []decision{{keys: keys, pl: cp, nums: nums}})
				if err != nil {
					t.Fatal(err)
				}
				v, err := decode(pl, rs[0])
				if err != nil {
					t.Fatal(err)
				}
				// (Blocks granted and never spent fill the windows: the
				// later requests may be refused.)
				if v.outcome == Allowed {
					granted[coarse] += v.granted - 1
				}
			}
			mini.Close()
		}
		if granted[false] != 0 || granted[true] == 0 {
			t.Fatalf("case %d (%v): granted %d beyond the requests without coarse records (want none), %d with them (want some)", c, ws, granted[false], granted[true])
		}
	}
}
