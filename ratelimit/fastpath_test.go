package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// takesFastPath reports whether the decision code decides a request
// under pl, asked in, by its fast path (lua/fast.lua) rather than by
// decide: a plan of one to three windows, with a ban rule or none, and no
// candidate windows, asked only to decide, with no strikes to count (under
// a ban rule) and nothing to add or seed, and admitted (a banned key is
// refused). A plan with blocks (plan.blk) has it when one window, its
// first, has a coarse record. TestFastPathTaken checks this against the
// code's own counts.
func takesFastPath(pl *plan, in input, admitted bool) bool {
	return admitted && (!pl.ban.on || in.extra == 0) && !pl.cban.on && len(pl.candidates) == 0 &&
		len(pl.windows) <= 3 && len(pl.coarse) <= 1 &&
		!in.peek && in.seed == nil && !slices.ContainsFunc(in.add, func(a int64) bool { return a != 0 })
}

// generalOnlyCore is the decision code with its fast path switched off:
// every decision by decide.
func generalOnlyCore(t testing.TB) string {
	t.Helper()
	const on = "fast = not cban and"
	if strings.Count(decideCore, on) != 1 {
		t.Fatalf("the decision code no longer says %q once: update generalOnlyCore", on)
	}
	return strings.Replace(decideCore, on, "fast = false and not cban and", 1)
}

// pathLibrary is the decision code loaded as a Function library of its
// own (a name unique to the test), beside a function that reports how
// many decisions each of its paths made: fast, then decide.
type pathLibrary struct {
	rdb          *redis.Client
	src, fn, cnt string
}

func loadPathLibrary(t testing.TB, rdb *redis.Client) *pathLibrary {
	t.Helper()
	// randomPrefix is "test:HEX:"; a library name takes letters, digits
	// and underscores.
	lib := "petstore_ratelimit_paths_" + strings.Trim(strings.TrimPrefix(randomPrefix(t), "test:"), ":")
	p := &pathLibrary{rdb: rdb, fn: lib + "_decide", cnt: lib + "_paths"}
	src := decideLibrary(lib, p.fn) +
		"redis.register_function{function_name='" + p.cnt + "', callback=function() return {PATHS[1] - PATHS[2], PATHS[2]} end, flags={'no-writes'}}\n"
	p.src = src
	ctx := context.Background()
	if err := rdb.FunctionLoad(ctx, src).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.FunctionDelete(context.Background(), lib).Err() })
	return p
}

// script is the library as a redisDecider calls it.
func (p *pathLibrary) script() script { return script{library: p.src, fn: p.fn} }

func (p *pathLibrary) decide(ctx context.Context, ds []decision) ([]any, error) {
	return p.decideAt(ctx, ds, 0)
}

// decideAt is decide on a replica that finalized records at fin (µs; 0:
// not finalized).
func (p *pathLibrary) decideAt(ctx context.Context, ds []decision, fin int64) ([]any, error) {
	keys, args := batchCommandAt(ds, fin)
	reply, err := p.rdb.FCall(ctx, p.fn, keys, args...).Result()
	if err != nil {
		return nil, err
	}
	return batchReplies(reply, len(ds))
}

// paths returns how many decisions the fast path and decide have made
// since the library loaded.
func (p *pathLibrary) paths(t testing.TB) (fast, general int64) {
	t.Helper()
	v, err := p.rdb.FCallRO(context.Background(), p.cnt, nil).Int64Slice()
	if err != nil || len(v) != 2 {
		t.Fatalf("paths: %v %v", v, err)
	}
	return v[0], v[1]
}

// genFastPlans draws the plans replicas decide one key under
// (genPolicies), most of them plans the fast path serves: of one to three
// windows, without ban rules half the time (genPolicies gives the other
// half theirs half the time).
func genFastPlans(rng *rand.Rand, maxPeriod time.Duration) []*plan {
	policies := genPolicies(rng, maxPeriod)
	noBan := rng.IntN(2) != 0
	var plans []*plan
	for _, p := range policies {
		if noBan {
			p.Ban = BanPolicy{}
		}
		if len(p.Windows) > 3 && rng.IntN(4) != 0 {
			p.Windows = p.Windows[:1+rng.IntN(3)]
		}
		pl := compile(p, DefaultBuckets, DefaultStrikeBuckets)
		pl.split()
		plans = append(plans, pl)
	}
	return plans
}

// genFastInput draws one request under plan pl: mostly a plain decision,
// sometimes a lease, a peek, admissions to add, extra strikes, or (under a
// plan of short and long windows) an ask to reserve.
func genFastInput(rng *rand.Rand, pl *plan) input {
	in := input{lease: noLease}
	switch r := rng.IntN(20); {
	case r < 3:
		want := 2 + rng.Int64N(min(pl.windows[0].limit, 1<<20))
		need := want
		if rng.IntN(2) == 0 {
			need = want * 2
		}
		in.lease = leaseAsk{want: want, need: need, life: 1 + rng.Int64N(2_000_000)}
	case r < 5:
		in.peek = true
	case r < 7:
		in.add = make([]int64, len(pl.windows))
		for i := range in.add {
			in.add[i] = rng.Int64N(3)
		}
	case r < 8:
		in.extra = 1 + rng.Int64N(3)
	case r < 12 && pl.nShort > 0 && !pl.allShort:
		// Asked for a block of the long windows (lua/reserve.lua: as the
		// release before reserved them), now and then with admissions to
		// add.
		in.block = &blockAsk{max: 1 + rng.Int64N(64), replicas: 1 + rng.Int64N(3), rtt: rng.Int64N(2000)}
		if rng.IntN(4) == 0 {
			in.add = make([]int64, len(pl.windows))
			for i := range in.add {
				in.add[i] = rng.Int64N(3)
			}
		}
	}
	return in
}

// genAdvance draws how far the clock moves before the next batch: not at
// all, within a bucket, about a bucket, up to a period, or a period or
// more, of one of the plan's windows.
func genAdvance(rng *rand.Rand, pl *plan) int64 {
	w := pl.windows[rng.IntN(len(pl.windows))]
	switch rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return rng.Int64N(w.gran)
	case 2:
		return w.gran - 1 + rng.Int64N(3)
	case 3:
		return rng.Int64N(w.period)
	case 4:
		return w.period
	default:
		return w.period + rng.Int64N(3*w.period)
	}
}

// TestFastPathDecidesAsDecide checks that the fast path is a shortcut and
// not a second algorithm: over generated plans (around the limits' byte
// widths, periods from the shortest to the longest) and traffic (bursts
// to the limit and past it, leases, peeks, adds, plan changes between
// replicas, batches), the decision code and the same code with its fast
// path switched off give the same reply to every request and leave the
// same bytes and TTLs in every record, at the same miniredis clock. A
// supplement: the windows' promise itself is checked on both paths by
// the invariant tests.
func TestFastPathDecidesAsDecide(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	fastSrc, generalSrc := decideLua, generalOnlyCore(t)+"\nreturn run(_G.KEYS, _G.ARGV)\n"
	rng := invariantRNG(t, 7)
	// Each case starts in 2031 on an empty server. Its clock stays before
	// 2200: the decision code's times are µs held exactly in Lua's
	// doubles, below 2^53 (the year 2255). Carried over 400 cases, with
	// periods up to a year, the clock once passed 2^53 and the rounding
	// read past a record's end.
	start, end := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro(), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	var fastTaken, decisions, fastBlocks, blocked int
	for c := range testenv.Cases(t, 10, max(*invariantCases, 40)) {
		plans := genFastPlans(rng, MaxPeriod)
		// Half the cases with blocks in force: plans of short and long
		// windows decide with their coarse records (plan.blk), their
		// reservations blocks.
		blocks := rng.IntN(2) == 0
		key := fmt.Sprint("k", c)
		m.FlushAll()
		now := start
		for range 120 {
			i := rng.IntN(len(plans))
			if now += genAdvance(rng, plans[i]); now >= end {
				break
			}
			m.SetTime(time.UnixMicro(now))
			var ds [2][]decision
			var ins []input
			for range 1 + rng.IntN(3) {
				if rng.IntN(4) == 0 {
					i = rng.IntN(len(plans))
				}
				// Most requests plain: bursts reach the limits.
				in := input{lease: noLease}
				if rng.IntN(3) == 0 {
					in = genFastInput(rng, plans[i])
				}
				if blocks && plans[i].nShort > 0 && !plans[i].allShort && rng.IntN(3) == 0 {
					// Blocks large and small, so that they fill the
					// short windows' coarse records.
					in = input{lease: noLease, block: &blockAsk{max: 1 + rng.Int64N(min(plans[i].windows[0].limit, 4096)), replicas: 1 + rng.Int64N(3), rtt: rng.Int64N(2000)}}
				}
				cp := plans[i]
				if blocks && cp.blk != nil {
					cp = cp.blk
				}
				for side, prefix := range [2]string{"a:", "b:"} {
					ds[side] = append(ds[side], decision{keys: stateKeys(prefix, key, cp), pl: cp, nums: scriptNums(plans[i], in)})
				}
				ins = append(ins, in)
			}
			var replies [2][]any
			for side, src := range [2]string{fastSrc, generalSrc} {
				keys, args := batchCommand(ds[side])
				reply, err := rdb.Eval(ctx, src, keys, args...).Result()
				if err != nil {
					t.Fatalf("case %d: %v", c, err)
				}
				if replies[side], err = batchReplies(reply, len(ds[side])); err != nil {
					t.Fatal(err)
				}
			}
			for j := range replies[0] {
				if replies[0][j] != replies[1][j] {
					t.Fatalf("case %d, %s, request %d %+v at %d: with the fast path %q, without %q",
						c, ds[0][j].pl.given.Windows, j, ins[j], now, replies[0][j], replies[1][j])
				}
				v, err := decode(ds[0][j].pl, replies[0][j])
				if err != nil {
					t.Fatalf("case %d, windows %+v, ban %+v, request %d %+v at %d: %v", c, ds[0][j].pl.windows, ds[0][j].pl.ban, j, ins[j], now, err)
				}
				decisions++
				if takesFastPath(ds[0][j].pl, ins[j], v.outcome == Allowed) {
					fastTaken++
					if len(ds[0][j].pl.coarse) > 0 {
						fastBlocks++
						if ins[j].block != nil && v.granted > 1 {
							blocked++
						}
					}
				}
			}
			for _, k := range m.Keys() {
				b, ok := strings.CutPrefix(k, "a:")
				if !ok {
					continue
				}
				va, _ := m.Get(k)
				vb, err := m.Get("b:" + b)
				if err != nil || va != vb || m.TTL(k) != m.TTL("b:"+b) {
					t.Fatalf("case %d at %d: record %s differs: with the fast path %x (TTL %v), without %x (TTL %v)",
						c, now, b, va, m.TTL(k), vb, m.TTL("b:"+b))
				}
			}
		}
	}
	t.Logf("%d decisions, %d of them by the fast path, %d of those with coarse records, %d of those granted blocks", decisions, fastTaken, fastBlocks, blocked)
	if fastTaken < decisions/10 || fastTaken > decisions*9/10 {
		t.Fatalf("the generated traffic took the fast path %d times in %d decisions: both paths should be well exercised", fastTaken, decisions)
	}
	if fastBlocks < fastTaken/10 || blocked < 20 {
		t.Fatalf("the fast path made %d decisions with coarse records (%d granting blocks) of %d: blocks should be well exercised", fastBlocks, blocked, fastTaken)
	}
}

// TestFastPathTaken checks, on a real Redis, which path the decision code
// takes for each of generated requests (its own counts, read after each
// batch), against takesFastPath: the fast path serves exactly the
// admissions of the plans it covers, and hands the rest (refusals, peeks,
// adds, strikes to count, banned keys, candidate windows, four windows)
// to decide.
func TestFastPathTaken(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	lib := loadPathLibrary(t, rdb)
	ctx := context.Background()
	rng := invariantRNG(t, 8)
	prefix := randomPrefix(t)
	withCandidate := compile(Policy{Name: "cand", Windows: []Window{{Limit: 5, Period: time.Minute}},
		Candidate: []Window{{Limit: 3, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	var fastSeen, generalSeen, blockSeen int64
	for c := range 30 {
		// Short periods, so that real time moves buckets and windows; every
		// other case with blocks in force, its plans of short and long
		// windows (whose long windows are too long to move) deciding with
		// their coarse records.
		blocks := c%2 == 1
		maxPeriod := 50 * time.Millisecond
		if blocks {
			maxPeriod = MaxPeriod
		}
		plans := genFastPlans(rng, maxPeriod)
		if c%5 == 0 {
			plans = append(plans, withCandidate)
		}
		key := fmt.Sprint("k", c)
		for range 60 {
			var ds []decision
			var ins []input
			for range 1 + rng.IntN(3) {
				pl := plans[rng.IntN(len(plans))]
				in := input{lease: noLease}
				if rng.IntN(3) == 0 {
					in = genFastInput(rng, pl)
				}
				cp := pl
				if blocks && pl.blk != nil {
					cp = pl.blk
				}
				ds = append(ds, decision{keys: stateKeys(prefix, key, cp), pl: cp, nums: scriptNums(pl, in)})
				ins = append(ins, in)
			}
			f0, g0 := lib.paths(t)
			replies, err := lib.decide(ctx, ds)
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			for j, r := range replies {
				v, err := decode(ds[j].pl, r)
				if err != nil {
					t.Fatal(err)
				}
				if takesFastPath(ds[j].pl, ins[j], v.outcome == Allowed) {
					want++
					if len(ds[j].pl.coarse) > 0 {
						blockSeen++
					}
				}
			}
			f1, g1 := lib.paths(t)
			if f1-f0 != want || (f1-f0)+(g1-g0) != int64(len(ds)) {
				t.Fatalf("case %d: %d requests (%+v), %d for the fast path: it made %d, decide %d", c, len(ds), ins, want, f1-f0, g1-g0)
			}
			fastSeen, generalSeen = fastSeen+f1-f0, generalSeen+g1-g0
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}
	t.Logf("fast path %d decisions (%d with coarse records), decide %d", fastSeen, blockSeen, generalSeen)
	if fastSeen == 0 || generalSeen == 0 || blockSeen == 0 {
		t.Fatalf("a path never ran: fast %d (with coarse records %d), decide %d", fastSeen, blockSeen, generalSeen)
	}
}

// TestShortReplyTellsWhatAPeekTells checks the decision code's short
// replies (script.go: a request admitted alone, under a plan with no
// candidate windows) against its whole reply, from the other side of the
// code: over generated plans (with and without ban rules, up to four
// windows, some with candidate windows) and requests (plain, leases,
// admissions to add, extra strikes that may begin a ban, peeks), each
// request is followed in the same call, at the same instant, by a peek,
// whose reply is always whole. A request admitted alone must be answered
// in a short form, bare when the ban rule has nothing to report, and
// decode to what the peek tells: the time, each window's used and reset,
// the strikes, the ban and the offences. Every other request must be
// answered in the whole form.
func TestShortReplyTellsWhatAPeekTells(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
	m, rdb := newMini(t, time.UnixMicro(now))
	ctx := context.Background()
	rng := invariantRNG(t, 9)
	withCandidate := compile(Policy{Name: "cand", Windows: []Window{{Limit: 5, Period: time.Minute}},
		Candidate: []Window{{Limit: 3, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	var short, whole, withBan int
	for c := range testenv.Cases(t, 10, max(*invariantCases, 40)) {
		var plans []*plan
		for _, p := range genPolicies(rng, MaxPeriod) {
			plans = append(plans, compile(p, DefaultBuckets, DefaultStrikeBuckets))
		}
		if c%5 == 0 {
			plans = append(plans, withCandidate)
		}
		key := fmt.Sprint("k", c)
		m.FlushAll()
		for range 80 {
			pl := plans[rng.IntN(len(plans))]
			now += genAdvance(rng, pl) % (24 * time.Hour).Microseconds()
			m.SetTime(time.UnixMicro(now))
			in := input{lease: noLease}
			if rng.IntN(3) == 0 {
				in = genFastInput(rng, pl)
			}
			if pl.ban.on && rng.IntN(4) == 0 {
				// Strikes answered locally: enough of them begin a ban,
				// even on a request the windows admit.
				in.extra += 1 + rng.Int64N(3)
			}
			ds := []decision{
				{keys: stateKeys("s:", key, pl), pl: pl, nums: scriptNums(pl, in)},
				{keys: stateKeys("s:", key, pl), pl: pl, nums: scriptNums(pl, input{peek: true, lease: noLease})},
			}
			keys, args := batchCommand(ds)
			reply, err := rdb.Eval(ctx, decideLua, keys, args...).Result()
			if err != nil {
				t.Fatalf("case %d: %v", c, err)
			}
			rs, err := batchReplies(reply, 2)
			if err != nil {
				t.Fatal(err)
			}
			v, err := decode(pl, rs[0])
			if err != nil {
				t.Fatalf("case %d, %+v, request %+v: %v", c, pl.given, in, err)
			}
			p, err := decode(pl, rs[1])
			if err != nil || len(rs[1].(string)) != 8*pl.replyFields() {
				t.Fatalf("case %d: the peek's reply %q: %v", c, rs[1], err)
			}
			// (A ban the request's strikes began, the peek sees.)
			alone := !in.peek && v.outcome == Allowed && v.granted == 1 && len(pl.candidates) == 0 && p.outcome != Banned
			got, banFields := pl.shortReply(len(rs[0].(string)))
			if got != alone {
				t.Fatalf("case %d, %+v, request %+v, verdict %+v: short reply %v, want %v", c, pl.given, in, v, got, alone)
			}
			// The bare form when the ban rule has nothing to report.
			if got && banFields != (p.strikes != 0 || p.banUntil != 0 || p.offences != 0) {
				t.Fatalf("case %d, %+v, request %+v: the ban's fields sent %v, the peek %+v", c, pl.given, in, banFields, p)
			}
			if banFields {
				withBan++
			}
			if !alone {
				whole++
				continue
			}
			short++
			if v.now != p.now || v.retry != 0 || v.leaseEnd != 0 || v.newBan ||
				v.strikes != p.strikes || v.banUntil != p.banUntil || v.offences != p.offences {
				t.Fatalf("case %d, %+v, request %+v: the short reply says %+v, the peek %+v", c, pl.given, in, v, p)
			}
			for i := range v.win {
				if v.win[i] != p.win[i] {
					t.Fatalf("case %d, %+v, request %+v: window %d: the short reply says %+v, the peek %+v", c, pl.given, in, i, v.win[i], p.win[i])
				}
			}
		}
	}
	t.Logf("%d short replies (%d with the ban rule's fields), %d whole", short, withBan, whole)
	if short < whole/4 || whole < short/20 || withBan < short/50 || withBan > short/2 {
		t.Fatalf("%d short replies (%d with the ban rule's fields), %d whole: every form should be well exercised", short, withBan, whole)
	}
}
