package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// genRequest draws one request under plan pl: mostly a plain decision,
// sometimes a lease, a peek, admissions to add, extra strikes, or (under a
// plan of short and long windows) an ask for a block.
func genRequest(rng *rand.Rand, pl *plan) input {
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
		// Asked for a block of the long windows (lua/blocksize.lua), now
		// and then with admissions to add.
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

// TestShortReplyTellsWhatAPeekTells checks the decision code's short
// replies (redisdecider.go: a request admitted alone, under a plan with no
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
				in = genRequest(rng, pl)
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
