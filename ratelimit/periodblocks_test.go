package ratelimit

import (
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
// (blocks.go): the windows of the new plan start from the counts the
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
// its limit; the edited plan keeps short and long windows, so that it
// has blocks too.
func genBlockEdit(rng *rand.Rand) (*plan, *plan) {
	for {
		old := genBlockPlans(rng)[0]
		ws := slices.Clone(old.policy.Windows)
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
		if old.blk != nil && edited.blk != nil {
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

func runBlockEdit(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis) (admitted, fromBlocks, carried int) {
	t.Helper()
	po, pn := genBlockEdit(rng)
	what := fmt.Sprintf("old %v, new %v", po.policy.Windows, pn.policy.Windows)
	prefix := randomPrefix(t)
	sd := newSeeding(pn, otherPeriods(pn, po, false), youngPeriods(pn, po))
	ctx := context.Background()
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
	call := func(underNew bool, in input) verdict {
		t.Helper()
		if mini != nil {
			mini.SetTime(time.UnixMicro(now))
		}
		pl, cp, keys := po, po.blk, stateKeys(prefix, "k", po.blk)
		if underNew {
			pl, cp, keys, in.seed = pn, pn.blk, seedKeys(prefix, "k", sd, stateKeys(prefix, "k", pn.blk)), sd
		}
		ds := []decision{{keys: keys, pl: cp, nums: scriptNums(pl, in)}}
		var replies []any
		var err error
		if mini != nil {
			replies, err = evalBatchAt(ctx, rdb, ds, 0)
		} else {
			replies, err = fcallBatchAt(ctx, rdb, ds, 0)
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
	type replica struct {
		left, end int64
		old       bool // its block was granted under the old plan
	}
	reps := make([]replica, 1+rng.IntN(3))
	var spent []blockEditSpend
	var edit int64 // T
	check := func(x int64) {
		t.Helper()
		for i := range pn.windows {
			r := &pn.windows[i]
			known := knownSince(r, po, edit)
			var in, allowed int64
			for _, s := range spent {
				if s.at > x-r.period && s.at <= x {
					in++
					if s.at <= known || s.early {
						allowed++
					}
				}
			}
			if in > r.limit+allowed {
				t.Fatalf("%s\nafter the edit at %d: %d admissions within %s ending at %d, limit %d (%d of them older than the records knew or spent from blocks granted before)",
					what, edit, in, time.Duration(r.period)*time.Microsecond, x, r.limit, allowed)
			}
		}
	}
	step := func(underNew bool) {
		t.Helper()
		rp := &reps[rng.IntN(len(reps))]
		x := clock()
		if rp.left > 0 && x < rp.end-margin {
			rp.left--
			early := underNew && rp.old
			spent = append(spent, blockEditSpend{at: x, early: early})
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
		if !underNew && rng.IntN(3) > 0 {
			// Asked to reserve: a block of every window.
			in.reserve = &reserveAsk{max: 2 + rng.Int64N(300), replicas: int64(len(reps)), rtt: rng.Int64N(3000)}
		}
		v := call(underNew, in)
		if underNew && edit == 0 {
			edit = v.now
		}
		if v.outcome != Allowed {
			return
		}
		admitted++
		spent = append(spent, blockEditSpend{at: v.now})
		if v.granted > 1 {
			rp.left, rp.end, rp.old = v.granted-1, v.leaseEnd, !underNew
		}
		if underNew {
			check(v.now)
		}
	}
	advance := func() {
		var dt int64
		switch rng.IntN(6) {
		case 0:
		case 1, 2:
			dt = rng.Int64N(pn.windows[0].gran + 1)
		case 3:
			dt = rng.Int64N(reserveLife.Microseconds())
		default:
			dt = rng.Int64N(min(po.windows[0].period, pn.windows[0].period)/4 + 1)
		}
		if mini != nil {
			now += dt
		} else if dt <= 20_000 {
			time.Sleep(time.Duration(dt) * time.Microsecond)
		}
	}
	for range 60 {
		advance()
		for range 1 + rng.IntN(6) {
			step(false)
		}
	}
	for range 60 {
		advance()
		for range 1 + rng.IntN(6) {
			step(true)
		}
	}
	return admitted, fromBlocks, carried
}

func TestPeriodEditWithBlocksKeepsCountsMiniredis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 31)
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var admitted, fromBlocks, carried int
	for range max(*invariantCases/2, 40) {
		m.FlushAll()
		a, b, c := runBlockEdit(t, rng, rdb, m)
		admitted, fromBlocks, carried = admitted+a, fromBlocks+b, carried+c
	}
	t.Logf("%d admissions, %d of them from blocks, %d spent after the edit from blocks granted before it", admitted, fromBlocks, carried)
	if fromBlocks < admitted/10 {
		t.Fatalf("%d of %d admissions from blocks: the edits should meet blocks", fromBlocks, admitted)
	}
}

func TestPeriodEditWithBlocksKeepsCountsRedis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 32)
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	var admitted, fromBlocks int
	for range max(*invariantCases/4, 15) {
		a, b, _ := runBlockEdit(t, rng, rdb, nil)
		admitted, fromBlocks = admitted+a, fromBlocks+b
	}
	t.Logf("%d admissions, %d of them from blocks", admitted, fromBlocks)
	if fromBlocks < admitted/10 {
		t.Fatalf("%d of %d admissions from blocks: the edits should meet blocks", fromBlocks, admitted)
	}
}
