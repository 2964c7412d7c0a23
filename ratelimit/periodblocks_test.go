package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// The promise of a plan edit that changes periods, with blocks in force
// (lease.go): the windows of the new plan start from the counts the
// key's records of other periods hold, coarse records included, so no
// key gets a fresh quota. For each window (L, W) of the new plan, every
// interval of length W ending at an admission from the key's first
// decision under the new plan, T, on, ending at one the new plan decided,
// holds at most L admissions, counted
// at the times they were spent, plus those made before T less the
// source's period (periodChecker's allowance) and those spent after T
// from blocks granted before it (a block still being spent when the edit
// lands counts in the new window until its coarse bucket's end, not its
// spends' own times plus W). Checked by Redis time over generated plans
// of short and long windows, edits of a short window's period (and
// limit) or a long one's, and replicas spending blocks, on miniredis and
// on a real Redis.

// genBlockEdit draws a plan of short and long windows and an edit of it
// that changes one window's period, most often a short one's, and maybe
// its limit, or (a quarter of the time) drops its long windows; the
// edited plan reads coarse records too.
func genBlockEdit(rng *rand.Rand) (*plan, *plan) {
	for {
		op := genBlockPlans(rng)[0].policy
		if rng.IntN(4) > 0 {
			// Long windows that the traffic leaves room in, so that the
			// replicas hold blocks when the edit lands.
			for i := range op.Windows {
				if op.Windows[i].Period/time.Duration(DefaultBuckets) >= blockLife {
					op.Windows[i].Limit = 1_000_000
				}
			}
		}
		old := compile(op, DefaultBuckets, DefaultStrikeBuckets)
		old.split()
		ws := slices.Clone(old.policy.Windows)
		if old.nShort > 0 && !old.allShort && rng.IntN(4) == 0 {
			// The long windows dropped: the short ones keep their
			// periods and records, where the blocks counted.
			edited := compile(Policy{Name: old.policy.Name, Windows: ws[:len(old.blk.coarse)], Ban: old.policy.Ban}, DefaultBuckets, DefaultStrikeBuckets)
			edited.split()
			return old, edited
		}
		k := rng.IntN(len(ws))
		if rng.IntN(3) > 0 {
			k = 0
		}
		for {
			p := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, time.Hour, 24 * time.Hour}[rng.IntN(9)] + time.Duration(rng.IntN(5))*time.Millisecond
			if !slices.ContainsFunc(ws, func(w Window) bool { return w.Period == p }) {
				ws[k].Period = p
				break
			}
		}
		if rng.IntN(2) == 0 {
			ws[k].Limit = 1 + rng.Int64N(400)
		}
		slices.SortFunc(ws, func(a, b Window) int { return int(a.Period - b.Period) })
		edited := compile(Policy{Name: old.policy.Name, Windows: ws, Ban: old.policy.Ban}, DefaultBuckets, DefaultStrikeBuckets)
		edited.split()
		if old.nShort > 0 && !old.allShort && edited.blk != nil {
			return old, edited
		}
	}
}

// blockEditSpend is one admission at its spend time; early marks one
// spent after the edit from a block granted before it.
type blockEditSpend struct {
	at    int64
	early bool
}

// runBlockEdit drives one key through an edit (genBlockEdit): replicas
// decide under the old plan, asking for blocks, then under the new one,
// spending what they still hold; with spread, the old plan and the new
// one in turn after the edit, as while an edit spreads over the
// replicas, each enforcing the other's periods beside its own.
func runBlockEdit(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, spread bool) (admitted, fromBlocks, carried int) {
	t.Helper()
	po, pn := genBlockEdit(rng)
	what := fmt.Sprintf("old %v, new %v", po.policy.Windows, pn.policy.Windows)
	prefix := randomPrefix(t)
	sd := newSeeding(pn, otherPeriods(pn, po, spread), youngPeriods(pn, po))
	// The old plan's, while it spreads: the new plan's periods in use.
	sdOld := newSeeding(po, otherPeriods(po, pn, true), nil)
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	clock := func() int64 {
		if mini != nil {
			return now
		}
		return time.Now().UnixMicro()
	}
	// A block is spent only within its end (less a millisecond's margin
	// against a real Redis's clock).
	var margin int64
	if mini == nil {
		margin = 1000
	}
	var edit int64 // T: the first decision under the new plan
	call := func(underNew bool, in input) verdict {
		t.Helper()
		if mini != nil {
			mini.SetTime(time.UnixMicro(now))
		}
		pl, cp, keys := po, po.blk, stateKeys(prefix, "k", po.blk)
		if !underNew && spread && edit > 0 {
			keys, in.seed = seedKeys(prefix, "k", sdOld, keys), sdOld
		}
		if underNew {
			// (As Limiter.callPlan: with its coarse records where it has
			// them.)
			cp = pn
			if pn.blk != nil {
				cp = pn.blk
			}
			pl, keys, in.seed = pn, seedKeys(prefix, "k", sd, stateKeys(prefix, "k", cp)), sd
		}
		return decideOne(t, rdb, mini, decision{keys: keys, pl: cp, nums: scriptNums(pl, in)}, pl, what)
	}
	type replica struct {
		left, end int64
		old       bool // its block was granted under the old plan
	}
	reps := make([]replica, 1+rng.IntN(3))
	var spent []blockEditSpend
	// after returns how many of spent (in time order) lie at or before v.
	after := func(v int64) int64 {
		i, _ := slices.BinarySearchFunc(spent, v+1, func(s blockEditSpend, v int64) int { return cmp.Compare(s.at, v) })
		return int64(i)
	}
	// note keeps spent in time order (a real Redis's clock and this
	// process's may disagree by a little).
	note := func(s blockEditSpend) {
		spent = slices.Insert(spent, int(after(s.at)), s)
	}
	check := func(x int64, v verdict, underNew bool) {
		t.Helper()
		for i, r := range slices.Concat(pn.windows, po.windows) {
			if i >= len(pn.windows) && (!spread || slices.ContainsFunc(pn.windows, func(w ring) bool { return w.period == r.period })) {
				// The old plan's windows: while it spreads, every admission
				// of either plan fits them too.
				continue
			}
			known := knownSince(&r, po, edit)
			if i >= len(pn.windows) {
				known = 0
			}
			// The admissions in (x-W, x] and, of them, those at or
			// before known.
			from := after(x - r.period)
			in := after(x) - from
			allowed := max(after(min(known, x))-from, 0)
			if v.outcome == Allowed && in > r.limit+allowed {
				t.Fatalf("%s\nafter the edit at %d: %d admissions within %s ending at %d, limit %d (%d of them older than the records knew)",
					what, edit, in, time.Duration(r.period)*time.Microsecond, x, r.limit, allowed)
			}
			// What makes it so: the window's count is never below the
			// admissions it must hold (a count short of them admits past
			// the limit as soon as traffic fills the rest).
			if underNew && i < len(v.win) && v.win[i].used < in-allowed {
				t.Fatalf("%s\nafter the edit at %d: the window of %s counts %d at %d, where %d admissions lie within it (%d of them older than the records knew)",
					what, edit, time.Duration(r.period)*time.Microsecond, v.win[i].used, x, in, allowed)
			}
		}
	}
	step := func(underNew bool, r int) {
		t.Helper()
		if r < 0 {
			r = rng.IntN(len(reps))
		}
		rp := &reps[r]
		x := clock()
		if rp.left > 0 && x < rp.end-margin {
			rp.left--
			early := underNew && rp.old
			note(blockEditSpend{at: x, early: early})
			fromBlocks++
			admitted++
			if early {
				carried++
			}
			// (A block granted under the old plan is spent under it: the
			// new plan's windows are checked at its own admissions.)
			return
		}
		rp.left = 0
		in := input{lease: noLease}
		if !underNew && edit == 0 && rng.IntN(3) > 0 {
			// Asked for a block: one of every window (none while an
			// edit spreads: Limiter.decide).
			in.block = &blockAsk{max: 2 + rng.Int64N(300), replicas: int64(len(reps)), rtt: rng.Int64N(3000)}
		}
		v := call(underNew, in)
		if underNew && edit == 0 {
			edit = v.now
		}
		if v.outcome != Allowed {
			if edit > 0 {
				check(v.now, v, underNew)
			}
			return
		}
		admitted++
		note(blockEditSpend{at: v.now})
		if v.granted > 1 {
			rp.left, rp.end, rp.old = v.granted-1, v.leaseEnd, !underNew
		}
		if edit > 0 {
			check(v.now, v, underNew)
		}
	}
	advance := func() {
		var dt int64
		switch rng.IntN(6) {
		case 0:
		case 1, 2:
			dt = rng.Int64N(pn.windows[0].gran + 1)
		case 3:
			dt = rng.Int64N(blockLife.Microseconds())
		default:
			dt = rng.Int64N(min(po.windows[0].period, pn.windows[0].period)/4 + 1)
		}
		now += dt
		sleepShort(mini, dt)
	}
	for range 60 {
		advance()
		for range 1 + rng.IntN(6) {
			step(false, -1)
		}
	}
	small := func() {
		dt := rng.Int64N(blockLife.Microseconds() / 20)
		now += dt
		sleepShort(mini, dt)
	}
	// Seconds of steady traffic before the edit, so that the replicas
	// hold blocks when it lands.
	for range 20 {
		small()
		for r := range reps {
			step(false, r)
		}
	}

	// After the edit: the blocks granted before it spent over the next
	// seconds beside the new plan's decisions, then, a window's period
	// after the edit, the new plan's decisions again while those spends
	// leave that window (where a block counted until its coarse bucket's
	// end rather than its own would have left too early).
	for k := range 60 {
		if k < 20 || k >= 40 {
			small()
		} else {
			advance()
		}
		if k == 40 && mini != nil && edit > 0 {
			// A short window's period after the edit, about when what the
			// blocks spent just after it would leave a window counting them
			// too early.
			w := pn.windows[0]
			if at := edit + w.period - blockLife.Microseconds()/10 + rng.Int64N(blockLife.Microseconds()/2); at > now {
				now = at
			}
		}
		burst := 1 + rng.IntN(12)
		if k >= 40 && rng.IntN(2) == 0 {
			// Bursts that fill the new plan's windows.
			burst = 1 + int(min(minLimit(pn.windows), 60))
		}
		if spread && k < 20 && rng.IntN(2) == 0 {
			// While it spreads, bursts that fill the old plan's windows,
			// where the blocks granted before the edit count: the new
			// plan's admissions stop where they are full (transition
			// windows), blocks included.
			burst = 1 + int(min(minLimit(po.windows), 60))
		}
		for range burst {
			step(!spread || rng.IntN(2) == 0, -1)
		}
	}
	return admitted, fromBlocks, carried
}

// decideOne runs decision d under plan pl (whose reply it decodes) in one
// call: by EVAL on miniredis (mini), by FCALL on a real Redis; what names
// the case in a failure.
func decideOne(t *testing.T, rdb *redis.Client, mini *miniredis.Miniredis, d decision, pl *plan, what string) verdict {
	t.Helper()
	var replies []any
	var err error
	if mini != nil {
		replies, err = evalBatch(context.Background(), rdb, []decision{d})
	} else {
		replies, err = fcallBatch(context.Background(), rdb, []decision{d})
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	v, err := decode(pl, replies[0])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// minLimit returns the smallest limit of windows ws.
func minLimit(ws []ring) int64 {
	return slices.MinFunc(ws, func(a, b ring) int { return cmp.Compare(a.limit, b.limit) }).limit
}

func TestPeriodEditWithBlocksKeepsCountsMiniredis(t *testing.T) {
	t.Parallel()
	if carried := runBlockEditsMiniredis(t, invariantRNG(t, 31), false, testenv.Cases(t, 8, max(*invariantCases/4, 20))); carried < 30 {
		t.Fatalf("%d admissions spent after the edit from blocks granted before it: the edits should meet blocks being spent", carried)
	}
}

// runBlockEditsMiniredis runs cases of runBlockEdit on a miniredis, checks
// that blocks were met, and returns how many admissions were spent after
// an edit from blocks granted before it.
func runBlockEditsMiniredis(t *testing.T, rng *rand.Rand, spread bool, cases int) int {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var admitted, fromBlocks, carried int
	for range cases {
		m.FlushAll()
		a, b, c := runBlockEdit(t, rng, rdb, m, spread)
		admitted, fromBlocks, carried = admitted+a, fromBlocks+b, carried+c
	}
	t.Logf("%d admissions, %d of them from blocks, %d spent after the edit from blocks granted before it", admitted, fromBlocks, carried)
	if fromBlocks < admitted/20 {
		t.Fatalf("%d of %d admissions from blocks: the edits should meet blocks", fromBlocks, admitted)
	}
	return carried
}

func TestPeriodEditWithBlocksKeepsCountsRedis(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	rng := invariantRNG(t, 32)
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	var admitted, fromBlocks int
	for range max(*invariantCases/4, 15) {
		a, b, _ := runBlockEdit(t, rng, rdb, nil, false)
		admitted, fromBlocks = admitted+a, fromBlocks+b
	}
	t.Logf("%d admissions, %d of them from blocks", admitted, fromBlocks)
	if fromBlocks < admitted/20 {
		t.Fatalf("%d of %d admissions from blocks: the edits should meet blocks", fromBlocks, admitted)
	}
}

// TestPeriodEditCountsBlocksStillBeingSpent: a block granted before a
// period edit and spent after it counts in the new window a whole period
// after each spend. The key sends 20 requests a second under a 10-second
// window and a day, is granted a block, and the edit to a 20-second
// window lands; the block is spent over the next seconds (its end lies
// ahead: its count, carried from the day's record at the block's end,
// goes to the new window's coarse record, not the head bucket of its own,
// which a window of 20 seconds ends 20.1 seconds later). A peek a window's
// period after the edit must count every spend still within it.
func TestPeriodEditCountsBlocksStillBeingSpent(t *testing.T) {
	t.Parallel()
	r := newEditRig(t, Window{Limit: 200, Period: 10 * time.Second}, Window{Limit: 200, Period: 20 * time.Second}, false)
	call := r.call
	for range 60 {
		r.now += 50_000
		if v := call(false, input{lease: noLease}); v.outcome != Allowed {
			t.Fatalf("refused: %+v", v)
		}
	}
	var left, end int64
	for range 40 {
		r.now += 200_000
		v := call(false, input{lease: noLease, block: &blockAsk{max: 300, replicas: 1}})
		if v.granted > 1 {
			left, end = v.granted-1, v.leaseEnd
			break
		}
	}
	if left < 10 {
		t.Fatalf("no block worth the test: %d", left)
	}
	edit := r.now + 1
	r.now = edit
	if v := call(true, input{lease: noLease}); v.outcome != Allowed {
		t.Fatalf("refused at the edit: %+v", v)
	}
	// The block spent over the next 3 seconds, within its end.
	var spends []int64
	for ; left > 0 && r.now+90_000 < end; left-- {
		r.now += 90_000
		spends = append(spends, r.now)
	}
	for _, x := range []int64{edit + 20_000_000 + 600_000, edit + 20_000_000 + 2_000_000} {
		r.now = x
		var in int64
		for _, s := range spends {
			if s > x-20_000_000 {
				in++
			}
		}
		if v := call(true, input{lease: noLease, peek: true}); v.win[0].used < in {
			t.Fatalf("%d s after the edit the 20-second window counts %d, where %d admissions spent from the block lie within it", (x-edit)/1_000_000, v.win[0].used, in)
		}
	}
}

// TestPeriodEditWithBlocksWhileItSpreads: the old plan and the new one
// decide in turn after the edit, each enforcing the other's periods
// (transition windows) beside its own, their coarse records included:
// every admission fits every window of both plans (the new plan's to
// within what its records did not know), blocks granted before the edit
// being spent throughout.
func TestPeriodEditWithBlocksWhileItSpreads(t *testing.T) {
	t.Parallel()
	runBlockEditsMiniredis(t, invariantRNG(t, 33), true, testenv.Cases(t, 8, max(*invariantCases/4, 20)))
}

// TestTransitionWindowsCountBlocks: while an edit spreads, the new plan
// enforces the old plan's windows beside its own (transition windows),
// and a block granted under the old plan counts there too. The key is
// granted a block under a 10-second window of 100 and a day; the edit
// raises the window to 20 seconds and 300; the new plan's admissions in
// the next seconds stop where the old window, its blocks included, is
// full.
func TestTransitionWindowsCountBlocks(t *testing.T) {
	t.Parallel()
	// The new plan while the old one is still in use somewhere.
	r := newEditRig(t, Window{Limit: 100, Period: 10 * time.Second}, Window{Limit: 300, Period: 20 * time.Second}, true)
	call := r.call
	admitted := 0
	for range 30 {
		r.now += 100_000
		if call(false, input{lease: noLease}).outcome == Allowed {
			admitted++
		}
	}
	var block int64
	for range 20 {
		r.now += 100_000
		v := call(false, input{lease: noLease, block: &blockAsk{max: 300, replicas: 1}})
		if v.outcome == Allowed {
			admitted++
		}
		if v.granted > 1 {
			block = v.granted - 1
			break
		}
	}
	if block < 5 {
		t.Fatalf("no block worth the test: %d", block)
	}
	// All of it counts in the old window for the next 10 seconds, spent
	// or not: the new plan admits what is left of 100 within them.
	counted := int64(admitted) + block
	var fresh int64
	for range 200 {
		r.now += 10_000
		if call(true, input{lease: noLease}).outcome == Allowed {
			fresh++
		}
	}
	if counted+fresh > 100 {
		t.Fatalf("the old 10-second window holds %d admissions and a block of %d; the new plan admitted %d more within 2 s", admitted, block, fresh)
	}
}

// editRig decides one key on a miniredis of its own under an old plan of
// a short window and a day, or its edit (with its seeding: inUse, while
// the old plan is still in use), at the rig's clock (µs).
type editRig struct {
	t      *testing.T
	m      *miniredis.Miniredis
	rdb    *redis.Client
	po, pn *plan
	sd     *seeding
	now    int64
}

func newEditRig(t *testing.T, old, edited Window, inUse bool) *editRig {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	day := Window{Limit: 1_000_000, Period: 24 * time.Hour}
	po := compile(Policy{Name: "p", Windows: []Window{old, day}}, DefaultBuckets, DefaultStrikeBuckets)
	pn := compile(Policy{Name: "p", Windows: []Window{edited, day}}, DefaultBuckets, DefaultStrikeBuckets)
	po.split()
	pn.split()
	return &editRig{t: t, m: m, rdb: rdb, po: po, pn: pn, sd: newSeeding(pn, otherPeriods(pn, po, inUse), youngPeriods(pn, po)),
		now: time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()}
}

func (r *editRig) call(underNew bool, in input) verdict {
	r.t.Helper()
	r.m.SetTime(time.UnixMicro(r.now))
	pl, cp, keys := r.po, r.po.blk, stateKeys("e:", "k", r.po.blk)
	if underNew {
		pl, cp, keys, in.seed = r.pn, r.pn.blk, seedKeys("e:", "k", r.sd, stateKeys("e:", "k", r.pn.blk)), r.sd
	}
	rs, err := evalBatch(context.Background(), r.rdb, []decision{{keys: keys, pl: cp, nums: scriptNums(pl, in)}})
	if err != nil {
		r.t.Fatal(err)
	}
	v, err := decode(pl, rs[0])
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// The lease cap holds transition windows too: while an edit spreads, a
// replica on the new plan enforces the old plan's periods beside its own
// at the largest limit the registry lists for them (registry.go), and a
// block taken under a third plan with a lower limit on one of those
// periods (replicas on three versions of a plan, or two plans of a key)
// is still being spent in that period's coarse record. Every admission
// of that third plan, its block's spends included, must find the window
// within its own limit, so the new plan's admissions there are held to
// the block's limit until the block ends (readCap on the transition
// window's coarse record, lua/window.lua). Generated periods and limits: the
// old plan's limit on the shared period at least twice the third plan's,
// and the new plan's own window never the one that binds.
func TestTransitionWindowsHoldToABlocksCap(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	runTransitionCaps(t, invariantRNG(t, 101), rdb, m, testenv.Cases(t, 8, max(*invariantCases/4, 40)), capCase{})
}

// TestDisagreeingPlanHoldsToABlocksCap: the same with no edit, the other
// plan deciding on the same period (replicas that disagree on a key's
// plan): a block taken under the plan with the lower limit holds the
// other plan's window there to that limit until it ends (readCap on the
// window's coarse record, lua/window.lua). Then with the other plan asking for
// blocks of its own, sized within what the cap leaves (the caps in
// blockSize's room, in decide): beside the third plan's
// block, and beside its lease, whose day window, half the time, is the
// one that binds.
func TestDisagreeingPlanHoldsToABlocksCap(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, 103)
	for _, cc := range []capCase{{own: true}, {own: true, block: true}, {own: true, lease: true, block: true}} {
		runTransitionCaps(t, rng, rdb, m, testenv.Cases(t, 8, max(*invariantCases/4, 40)), cc)
	}
}

// TestBlockAndLeaseCapsHoldOnRedis plays the cases of the tests
// above and below on a real Redis by real time: periods of one and three
// seconds for blocks, of a minute for leases (a lease ends with its
// window's bucket, a 200th of the period).
func TestBlockAndLeaseCapsHoldOnRedis(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, 102)
	// (Not a lease beside the other plan's blocks: on periods long enough
	// for a lease to be filled by real time, blocks sized on the key's
	// demand over the period are too small to form reliably.)
	for _, cc := range []capCase{{}, {own: true}, {lease: true}, {own: true, block: true}} {
		runTransitionCaps(t, rng, rdb, nil, max(*invariantCases/24, 6), cc)
	}
}

// TestTransitionWindowsHoldToALeasesCap: the same for a lease, whose cap
// is written in the records of its plan's windows (the old plan's period
// among them), not in a coarse record.
func TestTransitionWindowsHoldToALeasesCap(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	runTransitionCaps(t, invariantRNG(t, 104), rdb, m, testenv.Cases(t, 8, max(*invariantCases/4, 40)), capCase{lease: true})
}

// capCase is what runTransitionCap plays: with own, the other plan is
// the old plan itself (no edit); with lease, the third plan holds a lease
// (counted in its windows' own records, the cap written there) instead of
// a block; with block (and own: no block is asked while an edit
// spreads), the other plan asks for blocks too and spends them, each
// sized within what the cap leaves.
type capCase struct{ own, lease, block bool }

func runTransitionCaps(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, cases int, cc capCase) {
	t.Helper()
	capped, oblocks, played := 0, 0, 0
	for range cases {
		if mini != nil {
			mini.FlushAll()
		}
		c, ob, ok := runTransitionCap(t, rng, rdb, mini, cc)
		if c {
			capped++
		}
		if ok {
			played++
		}
		oblocks += ob
	}
	t.Logf("%+v: %d cases of %d had the third plan hold a block or lease, %d refused the other plan by the cap; it was granted %d blocks", cc, played, cases, capped, oblocks)
	if played < cases/2 {
		t.Fatalf("the third plan held a block or lease in %d cases of %d", played, cases)
	}
	if cc.block && oblocks < cases/2 {
		t.Fatalf("the other plan was granted %d blocks in %d cases: the cases should have it size blocks beside the cap", oblocks, cases)
	}
	if capped < played/2 {
		t.Fatalf("%d cases of %d refused the other plan below its own limit: the cases should exercise the cap", capped, played)
	}
}

// runTransitionCap plays one case of TestTransitionWindowsHoldToABlocksCap
// and reports whether the new plan was refused where only the block's cap
// refuses it: its window of the shared period holding, with the block's
// unspent admissions, less than halfway from the third plan's limit to
// the old plan's.
func runTransitionCap(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, cc capCase) (capped bool, oblocks int, played bool) {
	t.Helper()
	day := Window{Limit: 1_000_000, Period: 24 * time.Hour}
	periods := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute}
	switch {
	case mini == nil && cc.lease:
		// A lease ends with its window's bucket (a 200th of the
		// period): long enough to fill by real time.
		periods = periods[4:]
	case mini == nil:
		periods = periods[:2]
	}
	p := periods[rng.IntN(len(periods))] + time.Duration(rng.IntN(3))*time.Millisecond
	lc := 8 + rng.Int64N(60)
	la := 2*lc + rng.Int64N(400)
	var pn2 time.Duration
	for pn2 == 0 || pn2 == p {
		pn2 = []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second, 2 * time.Minute}[rng.IntN(4)]
	}
	// With block, a third of the time a second short window of plenty
	// (two coarse records), and a third of the time a second long window
	// of plenty, an hour, so that the day is window 3; and, with a
	// lease, half the time the third plan's day window below its short
	// window's limit: its cap, written in the day's record too, is then
	// the one that binds, below the other plan's day limit.
	var second []Window
	cday := day
	if cc.block {
		switch rng.IntN(3) {
		case 0:
			second = []Window{{Limit: 1_000_000, Period: 2 * p}}
		case 1:
			second = []Window{{Limit: 1_000_000, Period: time.Hour}}
		}
		if cc.lease && rng.IntN(2) == 0 {
			cday.Limit = lc/2 + rng.Int64N(lc/2)
		}
	}
	mk := func(w, d Window) *plan {
		pl := compile(Policy{Name: "p", Windows: slices.Concat([]Window{w}, second, []Window{d})}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		return pl
	}
	po, pc, pn := mk(Window{Limit: la, Period: p}, day), mk(Window{Limit: lc, Period: p}, cday), mk(Window{Limit: la + 1 + rng.Int64N(1000), Period: pn2}, day)
	what := fmt.Sprintf("old %v, third %v, new %v", po.policy.Windows, pc.policy.Windows, pn.policy.Windows)
	// The new plan, while the old one is in use somewhere: the old
	// plan's period enforced beside its own at the old plan's limit.
	sd := newSeeding(pn, otherPeriods(pn, po, true), youngPeriods(pn, po))
	if cc.own {
		// No edit: the old plan itself decides beside the third.
		pn, sd = po, nil
		what = fmt.Sprintf("%v beside %v", po.policy.Windows, pc.policy.Windows)
	}
	prefix := randomPrefix(t)
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	clock, wait := func() int64 { return now }, func(dt int64) { now += dt }
	// A block is spent only within its end (less a millisecond's margin
	// against a real Redis's clock).
	var margin int64
	if mini == nil {
		clock, wait = func() int64 { return time.Now().UnixMicro() }, func(dt int64) { time.Sleep(time.Duration(dt) * time.Microsecond) }
		margin = 1000
	}
	call := func(underNew bool, in input) verdict {
		t.Helper()
		pl, keys := pc, stateKeys(prefix, "k", pc.blk)
		if underNew {
			pl, keys = pn, stateKeys(prefix, "k", pn.blk)
			if sd != nil {
				keys, in.seed = seedKeys(prefix, "k", sd, keys), sd
			}
		}
		if mini != nil {
			mini.SetTime(time.UnixMicro(now))
		}
		return decideOne(t, rdb, mini, decision{keys: keys, pl: pl.blk, nums: scriptNums(pl, in)}, pl, what)
	}
	// Admissions by time (Redis's for decisions, this process's for
	// spends), each under the windows it must fit: the third plan's own,
	// or for the other plan the old plan's (its own with no edit; while
	// an edit spreads, the new plan's admissions fit the old plan's too).
	var log admissionLog
	pw := p.Microseconds()
	admit := func(pl *plan, x int64, who string) { t.Helper(); log.mustAdmit(t, pl, x, what, who) }
	spend := func(x int64) { t.Helper(); admit(pc, x, "a spend from the third plan's block or lease") }

	// The third plan's steady traffic, a fifth of its limit a period,
	// then asks for a block until one is granted. Or, for a lease, a fifth
	// of its limit at once, then a lease asked just after its window's
	// bucket begins (a lease ends with it).
	gap, first := pw/(lc/5*4), lc/5
	if cc.lease {
		gap = 1000
		if mini == nil {
			// Half its limit: the other plan then has less to fill in
			// the lease's short life, by real time.
			first = lc / 2
		}
	}
	var left, end int64
	for range first {
		wait(gap)
		if v := call(false, input{lease: noLease}); v.outcome == Allowed {
			admit(pc, v.now, "the third plan's admission")
		}
	}
	for range 4 * lc {
		if cc.lease {
			g := pc.windows[0].gran
			wait((clock()/g+1)*g + 200 - clock())
			want := max((min(lc, cday.Limit)-first)/(leaseMargin+1), 2)
			v := call(false, input{lease: leaseAsk{want: want, need: want * leaseMargin, life: leaseLife.Microseconds()}})
			if v.outcome == Allowed {
				admit(pc, v.now, "the third plan's admission")
				left, end = v.granted-1, v.leaseEnd-margin
			}
			break
		}
		wait(gap)
		v := call(false, input{lease: noLease, block: &blockAsk{max: lc, replicas: 1}})
		if v.outcome != Allowed {
			break
		}
		admit(pc, v.now, "the third plan's admission")
		if v.granted > 1 {
			left, end = v.granted-1, v.leaseEnd-margin
			break
		}
	}
	if left == 0 {
		return false, 0, false
	}
	// Until the block ends: the new plan sends, the third plan spends
	// its block between; the new plan's requests, twice the third
	// plan's limit, would pass it by far without the cap.
	step := max((end-clock())/(2*lc+left+1), 1)
	spendEvery := max((end-clock())/(left+1), 1)
	next := clock() + spendEvery
	var oleft, oend int64 // the other plan's block
	retried := false
	// (By a schedule: by real time, a slow call is not followed by a
	// whole step's sleep.)
	tick := clock()
	for clock()+step < end {
		tick += step
		if d := tick - clock(); d > 0 {
			wait(d)
		}
		if x := clock(); x >= next && left > 0 {
			left--
			next += spendEvery
			spend(x)
			continue
		}
		if x := clock(); oleft > 0 && x < oend {
			oleft--
			admit(po, x, "a spend from the other plan's block")
			continue
		}
		in := input{lease: noLease}
		if cc.block {
			in.block = &blockAsk{max: 4 * la, replicas: 1}
		}
		v := call(true, in)
		if v.granted > 1 {
			oleft, oend, oblocks = v.granted-1, v.leaseEnd-margin, oblocks+1
		}
		if v.outcome != Allowed {
			if log.count(pw, v.now)+left < (lc+la)/2 {
				capped = true
			}
			if mini != nil && !retried {
				// Its Retry-After is exact, the cap's end included: a
				// microsecond before it the request is still refused,
				// at it admitted (peeks: nothing recorded).
				retried = true
				at := now
				now = v.now + v.retry - 1
				before := call(true, input{lease: noLease, peek: true})
				now = v.now + v.retry
				then := call(true, input{lease: noLease, peek: true})
				now = at
				if before.outcome == Allowed || then.outcome != Allowed {
					t.Fatalf("%s: refused at %d with Retry-After %d µs; 1 µs before it %v, at it %v", what, v.now, v.retry, before.outcome, then.outcome)
				}
			}
			continue
		}
		admit(po, v.now, "the other plan's admission")
	}
	// The rest of the block, spent as it ends.
	for x := clock(); left > 0 && x < end; left-- {
		spend(x)
	}
	return capped, oblocks, true
}

// TestLeaseEndsWithTheTransitionWindowsBucket: a lease granted while an
// edit spreads counts in the old plan's windows too (transition windows),
// in their current bucket, so it must end with that bucket, as with the
// plan's own windows': a lease spent past it would leave the old window
// while its spends still lie within it. The new plan's window is twenty
// times the old one's, so its buckets outlast the old window's: the lease
// is spent to its end, then the new plan sends a period later, as the
// lease's bucket leaves the old window; every admission finds the old
// window, by its spends' times, within its limit.
func TestLeaseEndsWithTheTransitionWindowsBucket(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 105)
	cases, played := testenv.Cases(t, 5, max(*invariantCases/4, 20)), 0
	for range cases {
		la := 8 + rng.Int64N(60)
		p := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second}[rng.IntN(3)]
		r := newEditRig(t, Window{Limit: la, Period: p}, Window{Limit: 1_000_000, Period: 20 * p}, true)
		r.now += rng.Int64N(p.Microseconds())
		pw := p.Microseconds()
		// Every admission, the new plan's too, fits the old plan's
		// windows.
		var log admissionLog
		admit := func(x int64) {
			if w, n := log.admit(r.po, x); w != nil {
				t.Fatalf("old [%d/%s], new [1000000/%s]: %d admissions within %s ending at %d, past the old plan's %d", la, p, 20*p, n, time.Duration(w.period)*time.Microsecond, x, w.limit)
			}
		}
		// The old plan's admission first: the key has a record of its
		// window, which the new plan then enforces and counts in.
		if v := r.call(false, input{lease: noLease}); v.outcome == Allowed {
			admit(v.now)
		}
		r.now += 1 + rng.Int64N(pw/DefaultBuckets)
		want := max(la/5, 2)
		v := r.call(true, input{lease: leaseAsk{want: want, need: want * leaseMargin, life: leaseLife.Microseconds()}})
		if v.outcome != Allowed || v.granted <= 1 {
			continue
		}
		played++
		admit(v.now)
		start, end := v.now, v.leaseEnd
		// The lease spent evenly to its end.
		for i := int64(1); i < v.granted; i++ {
			admit(start + (end-1-start)*i/(v.granted-1))
		}
		// A period on, the new plan sends through the time the lease's
		// spends leave the old window.
		step := max((end-start+pw/DefaultBuckets)/(2*la), 1)
		for r.now = start + pw; r.now <= end+pw+pw/DefaultBuckets; r.now += step {
			if v := r.call(true, input{lease: noLease}); v.outcome == Allowed {
				admit(v.now)
			}
		}
	}
	t.Logf("%d cases of %d were granted a lease", played, cases)
	if played < cases/2 {
		t.Fatalf("%d cases of %d were granted a lease", played, cases)
	}
}

// TestNewLongWindowCountsABlockToItsEnd: a plan edit that gives a window
// a new long period (one without a coarse record: buckets of blockLife
// or more) starts its record from the key's record of another period,
// and a block granted before the edit and spent after it counts there
// until a period past the block's end, even when that end lies past the
// new record's current bucket, as it may when the edit lands in the last
// seconds of a bucket. The case: the old plan a short window and an hour
// of plenty; the new one the same short window and a long window of 40
// to 130 minutes (buckets of 12 to 39 s, which do not all end with one of
// the hour's, where a block would end too) whose limit is what the
// block spends after the edit; the block asked under the old plan just
// before B, the end of the new window's bucket, and ending past it; the
// edit between; the block spent after B; then a decision under the new
// plan a period past B, before a period past the block's end: the window
// must count those spends, and so refuse it. Drawn over short periods of
// 1 s to a minute, long periods, limits and moments.
func TestNewLongWindowCountsABlockToItsEnd(t *testing.T) {
	t.Parallel()
	playOnMiniredis(t, 105, runNewLongWindowBlock, testenv.Cases(t, 8, max(*invariantCases/2, 30)))
}

// runNewLongWindowBlock plays one case of
// TestNewLongWindowCountsABlockToItsEnd on miniredis and reports whether
// the block was granted where and with the room the case needs.
func runNewLongWindowBlock(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) bool {
	t.Helper()
	p := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute}[rng.IntN(5)] +
		time.Duration(rng.IntN(20))*time.Millisecond
	long := []time.Duration{40 * time.Minute, 50 * time.Minute, 70 * time.Minute, 100 * time.Minute, 130 * time.Minute}[rng.IntN(5)]
	m := 20 + rng.Int64N(30) // admissions in the period before the block
	short := Window{Limit: 2*m + 20 + rng.Int64N(m), Period: p}
	mk := func(ws ...Window) *plan {
		pl := compile(Policy{Name: "p", Windows: ws}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		return pl
	}
	po := mk(short, Window{Limit: 1_000_000, Period: time.Hour})
	clock, waitUntil, _ := caseTime(rng, mini)
	pw, g := p.Microseconds(), blockRing(po.windows[0]).gran
	hourG, span := po.windows[1].gran, min(g, blockLife.Microseconds())
	newG := mk(short, Window{Limit: 1, Period: long}).windows[1].gran

	// B, the end of a bucket of the new window with no end of the hour's
	// buckets just before or at it (where the block would end first);
	// the block asked at t1 within half a coarse bucket (and a block's
	// life) before B, so that it ends past B; the edit at T, between.
	B := (clock()/newG + 2) * newG
	for range 100 {
		if (B-span)/hourG == (B+1)/hourG {
			break
		}
		B += newG
	}
	if (B-span)/hourG != (B+1)/hourG {
		return false // every bucket of the new window ends with one of the hour's
	}
	t1 := B - 1 - rng.Int64N(span/2)
	T := t1 + 1 + rng.Int64N(B-t1-1)
	prefix := randomPrefix(t)
	what := fmt.Sprintf("old %v, new long window %v (B %d)", po.policy.Windows, long, B)
	callOld := func(in input) verdict {
		t.Helper()
		return decideOne(t, rdb, mini, decision{keys: stateKeys(prefix, "k", po.blk), pl: po.blk, nums: scriptNums(po, in)}, po, what)
	}
	var log admissionLog
	for i := range m {
		waitUntil(t1 - pw + 1 + (pw-2)*i/m)
		if v := callOld(input{lease: noLease}); v.outcome == Allowed {
			log.mustAdmit(t, po, v.now, what, "an admission before the block")
		}
	}
	waitUntil(t1)
	a := callOld(input{lease: noLease, block: &blockAsk{max: m, replicas: 1}})
	if a.outcome != Allowed {
		t.Fatalf("%s: the block request at %d refused", what, t1)
	}
	if a.granted < 3 {
		return false
	}
	if a.leaseEnd <= B+1 {
		t.Fatalf("%s: the block granted at %d ends at %d, not past B", what, t1, a.leaseEnd)
	}
	// The new plan: its long window's limit what the block spends after B.
	spends := a.granted - 1
	pn := mk(short, Window{Limit: spends, Period: long})
	sd := newSeeding(pn, otherPeriods(pn, po, false), youngPeriods(pn, po))
	callNew := func() verdict {
		t.Helper()
		in := input{lease: noLease, seed: sd}
		return decideOne(t, rdb, mini, decision{keys: seedKeys(prefix, "k", sd, stateKeys(prefix, "k", pn.blk)), pl: pn.blk, nums: scriptNums(pn, in)}, pn, what)
	}
	waitUntil(T)
	callNew() // the edit: the new window's record starts from the hour's
	// The block spent after B, in its last microsecond; then, a period
	// later, the new plan decides while those spends are within it.
	x := B + long.Microseconds() + 1 + rng.Int64N(a.leaseEnd-1-B-1)
	waitUntil(x)
	v := callNew()
	if v.win[1].used < spends {
		t.Fatalf("%s: the new window counts %d at %d, where the block's %d spends at %d lie within it (%s)", what, v.win[1].used, x, spends, a.leaseEnd-1, time.Duration(x-(a.leaseEnd-1))*time.Microsecond)
	}
	if v.outcome == Allowed {
		t.Fatalf("%s: admitted at %d, where the block's %d spends at %d fill the new window (limit %d)", what, x, spends, a.leaseEnd-1, spends)
	}
	return true
}

// TestSeedBesideALiveCoarseRecordCountsABlockToItsEnd: a short window's
// record and its coarse record (lease.go) expire apart, the coarse one
// up to a few seconds later (its buckets and its TTL's margin are
// longer). A key whose plan drops the window's period and takes it back
// within that gap has the coarse record and no window record, and the
// edit back seeds the window record (seed in lua/ring.lua) from the
// periods it has. A block the key is spending, granted under the plan in
// between, must count in the window until a period after its end, where
// it is spent: the window record's head moves a bucket at most, so the
// block goes to the coarse record, as it does when that is new too.
//
// Drawn over short periods, limits and moments, on miniredis: plan Y (a
// short period P2 and an hour) takes a block, so that P2's coarse record
// exists; plan X (another short period and the hour) is the key's while
// P2's window record expires and the coarse record lives (miniredis's
// clock moves no TTL: the record is deleted before X's first request,
// and the edit lands past its TTL and within the coarse record's); X
// grants a block that ends a couple of P2's buckets or more after the
// edit back to Y. A decision under Y a period after that block's last microsecond
// must find the block's spends within P2's window (its limit), and be
// refused.
func TestSeedBesideALiveCoarseRecordCountsABlockToItsEnd(t *testing.T) {
	t.Parallel()
	playOnMiniredis(t, 106, runSeedBesideALiveCoarseRecord, testenv.Cases(t, 8, max(*invariantCases/2, 30)))
}

// runSeedBesideALiveCoarseRecord plays one case of
// TestSeedBesideALiveCoarseRecordCountsABlockToItsEnd and reports whether
// it played as drawn (the records expire in that order, the blocks are
// granted with the room the case needs).
func runSeedBesideALiveCoarseRecord(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) bool {
	t.Helper()
	periods := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute}
	i1, i2 := rng.IntN(len(periods)), rng.IntN(len(periods)-1)
	if i2 >= i1 {
		i2++
	}
	jitter := func() time.Duration { return time.Duration(rng.IntN(20)) * time.Millisecond }
	p1, p2 := periods[i1]+jitter(), periods[i2]+jitter()
	// Admissions in the period before each block: a few a second at
	// least, so that the block is worth granting.
	m1 := 20 + rng.Int64N(30) + int64(p1/(2*time.Second))
	m2 := 20 + rng.Int64N(30) + int64(p2/(2*time.Second))
	hour := Window{Limit: 1_000_000, Period: time.Hour}
	mk := func(ws ...Window) *plan {
		pl := compile(Policy{Name: "p", Windows: ws}, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		return pl
	}
	px := mk(Window{Limit: 2*m1 + 20 + rng.Int64N(m1), Period: p1}, hour)
	py := mk(Window{Limit: 2*m2 + 20 + rng.Int64N(m2), Period: p2}, hour)
	if len(py.blk.coarse) == 0 || len(px.blk.coarse) == 0 {
		return false
	}
	clock, waitUntil, _ := caseTime(rng, mini)
	prefix := randomPrefix(t)
	what := fmt.Sprintf("X %v, Y %v", px.policy.Windows, py.policy.Windows)
	call := func(pl *plan, in input, sd *seeding) verdict {
		t.Helper()
		return decideOne(t, rdb, mini, decision{keys: seedKeys(prefix, "k", sd, stateKeys(prefix, "k", pl.blk)), pl: pl.blk, nums: scriptNums(pl, in)}, pl, what)
	}
	// block plays m admissions under pl over the period before t0 (from
	// the clock's time on, if later), then asks a block at t0.
	block := func(pl *plan, m, t0 int64, sd *seeding) verdict {
		from := max(t0-pl.windows[0].period+1, clock()+1)
		for i := range m {
			waitUntil(from + (t0-1-from)*i/m)
			call(pl, input{lease: noLease, seed: sd}, sd)
		}
		waitUntil(t0)
		return call(pl, input{lease: noLease, seed: sd, block: &blockAsk{max: m, replicas: 1}}, sd)
	}
	keys := stateKeys(prefix, "k", py.blk)
	wkey, ckey := keys[1], keys[len(keys)-1] // P2's window record, its coarse record
	ta := clock() + p2.Microseconds()
	if a := block(py, m2, ta, nil); a.outcome != Allowed || a.granted < 2 {
		return false
	}
	ttlW, ttlC := mini.TTL(wkey).Microseconds(), mini.TTL(ckey).Microseconds()
	if ttlW <= 0 || ttlC <= 0 {
		t.Fatalf("%s: P2's records without TTLs (%d, %d µs)", what, ttlW, ttlC)
	}
	// X's block is asked once P2's window record has expired, and the
	// edit back lands while the coarse record lives.
	lo, hi := ta+ttlW+1, ta+ttlC-1
	if hi-lo < 4 {
		return false // the coarse record expires first, or with it
	}
	sdx := newSeeding(px, otherPeriods(px, py, false), youngPeriods(px, py))
	// (Half the cases as early as they can: Y's block, counted in the
	// coarse record, then often counts still at the edit.)
	early := rng.IntN(2) == 0
	t1 := lo + rng.Int64N((hi-lo)/2)
	if early {
		t1 = lo + rng.Int64N(max((hi-lo)/16, 1))
	}
	mini.Del(wkey)
	b := block(px, m1, t1, sdx)
	if b.outcome != Allowed || b.granted < 3 {
		return false
	}
	// The edit back at T, at least two of P2's buckets before the block's
	// end: past the bucket the window record's head may move to.
	g2 := py.windows[0].gran
	latest := min(hi, b.leaseEnd-1-3*g2-2)
	if latest <= t1+1 {
		return false
	}
	T := t1 + 1 + rng.Int64N(latest-t1)
	if early {
		T = t1 + 1 + rng.Int64N(min(latest-t1, 4*g2))
	}
	if !mini.Exists(ckey) || mini.Exists(wkey) {
		t.Fatalf("%s: at the edit, P2's coarse record is gone or its window record back", what)
	}
	spends := b.granted - 1
	pn := mk(Window{Limit: spends, Period: p2}, hour)
	sdn := newSeeding(pn, otherPeriods(pn, px, false), youngPeriods(pn, px))
	waitUntil(T)
	cr := len(pn.windows)
	before := readBuckets(t, rdb, keys, pn.blk)[cr]
	oldRec, _ := mini.Get(ckey)
	call(pn, input{lease: noLease, seed: sdn}, sdn) // the edit: P2's record starts from X's
	// The coarse record, written again, keeps what it counted in every
	// bucket of its own that still counts (its last event less than a
	// period before the edit: what a window must still count), there or
	// in a later bucket (one whose last event lies on a bucket's end is
	// carried into the next, which counts it as long), and what follows
	// its ring.
	after := readBuckets(t, rdb, keys, pn.blk)[cr]
	newRec, _ := mini.Get(ckey)
	for bk := range before.count {
		var was, is int64
		for j, c := range before.count {
			if j >= bk && before.last[j]+p2.Microseconds() > T {
				was += c
			}
		}
		for j, c := range after.count {
			if j >= bk {
				is += c
			}
		}
		if is < was {
			t.Fatalf("%s: the edit at %d left P2's coarse record counting %d from bucket %d on, where it counted %d that still count (%v, now %v)", what, T, is, bk, was, before.count, after.count)
		}
	}
	ringEnd := windowRingAt - 1 + int(ringSize(pn.blk.coarse[0].n))
	if oldRec[ringEnd:] != newRec[ringEnd:] {
		t.Fatalf("%s: the edit at %d changed what follows P2's coarse record's ring from %x to %x", what, T, oldRec[ringEnd:], newRec[ringEnd:])
	}
	// The block spent in its last microsecond; a period later, past
	// where the window record's head may have moved to, the new plan
	// decides while those spends lie within P2's window.
	B := (T/g2 + 2) * g2
	x := B + p2.Microseconds() + 1 + rng.Int64N(b.leaseEnd-1-B-1)
	waitUntil(x)
	v := call(pn, input{lease: noLease, seed: sdn}, sdn)
	if v.win[0].used < spends {
		t.Fatalf("%s: P2's window counts %d at %d, where the block's %d spends at %d lie within it (%s before its end)", what, v.win[0].used, x, spends, b.leaseEnd-1, time.Duration(b.leaseEnd-1+p2.Microseconds()-x)*time.Microsecond)
	}
	if v.outcome == Allowed {
		t.Fatalf("%s: admitted at %d, where the block's %d spends at %d fill P2's window (limit %d)", what, x, spends, b.leaseEnd-1, spends)
	}
	return true
}
