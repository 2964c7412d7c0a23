package ratelimit

import (
	"context"
	"encoding/binary"
	"time"
)

// Blocks: admissions of every window of a plan counted in Redis ahead of
// a key's requests and spent in process, for a key too slow to lease (a
// few requests a second: fewer than two expected within the current
// bucket of its shortest window), which would otherwise make a round trip
// for every request. A round trip for such a key asks, should it admit
// the request, for a block of k more admissions (blockAsk; k worked out
// by the script from the counts that decision reads), and the key's next
// requests are spent from it, as a lease's are (lease.go).
//
// A block counted in a short window's own ring, whose buckets last a
// fraction of a second, could be spent only until its bucket ends, and no
// ring of today's can hold a count longer than a period after its bucket
// ends. So each short window of a plan that counts blocks has a second
// record, its coarse record: a ring of the same period whose buckets last
// blockLife (blockRing), where a block is counted whole in the bucket of
// its end (at most the one after the current: the record's head may run
// a bucket ahead of the clock), its end that bucket's last event. A long
// window (buckets of blockLife or more) counts it in its own ring, in the
// current bucket, its end that bucket's last event. The window counts the
// sum of both records, everywhere a decision reads it: its admissions,
// caps, Remaining, Reset and Retry-After (script.go, pairStanding). The
// argument that keeps a lease strict then holds for every window:
//
//   - each record is an upper bound of the events it was given in any
//     interval of the period that holds them: a block counts from its
//     grant (a reader at any time before its bucket begins sees the head
//     there, and counts it) until its bucket's last event, its end at the
//     latest, is a period old, and its spends lie between the two; so the
//     sum bounds the window's admissions in it;
//   - a block is granted only while every window, both records summed,
//     has leaseMargin·k·Replicas remaining, caps every record it counts
//     in while it runs (the lease cap), and is spent only under the plan
//     it was taken for, within its end on this process's monotonic clock
//     (converted from the round trip's start, so that latency and clock
//     skew can only shorten it);
//   - a request spent from it is decided in process, as a lease's is: no
//     round trip.
//
// What it costs: every decision of a key under such a plan reads the
// coarse records too (by fast where the plan's one short window has one,
// else by decide), and a block's
// admissions, spent early or not at all, count until the end of the
// coarse bucket of the block's end and a period after, rounded up to
// whole coarse buckets, where a lease's count until their own fine
// bucket's end (Retry-After is exact for the counts either way; against a
// window that counted each admission at its own time it is a coarse
// bucket late at most where the coarse bucket divides the period, as
// blockLife divides a minute, and up to one more where it does not: a
// 32 s period has buckets of 10,666,666 µs, and the period spans one more
// of them than three, so a bucket counts 42.7 s past its end). What a
// block leaves unspent is given back when the replica lets it go
// (giveback.go). A ban issued elsewhere is announced to a block's holder
// (announceBan), which lets the block go.
//
// A plan of short windows alone (a minute, say) takes blocks too
// (plan.allShort). A replica of the release before, which granted none
// for such a plan, read its coarse records all the same whenever blocks
// were in force, so the two share a fleet without a finalize level of
// their own.
//
// Blocks need every replica deciding a key to read the coarse records: a
// replica that does not would admit into a window without them. So does
// every plan with a short window, since another plan of the key, or its
// own before an edit, may have blocks counted in the records of its
// periods. So they come into force with finalizing's second level
// (finalize.go), once no replica of an older release runs; the blocks
// hook (hooks, limiter.go) forces them in tests and benchmarks. Until
// then, a key too slow to lease makes a round trip for every request.
//
// (Replicas of the release before also took reservations on unfinalized
// fleets: blocks of the long windows alone, spent beside a round trip for
// the short ones. Their script grants those; this release asks none.)

// blockLife is a block's longest life, and the bucket width of the coarse
// records: a window whose buckets last less is short.
const blockLife = 10 * time.Second

// blockRing returns the coarse record of short window w: the same period
// and limit, in buckets of blockLife (one, when the period is shorter),
// and one bucket more than the period spans: a block is counted in the
// bucket of its end (blockWrite in lua/window.lua), at most the one after the
// current, and the record still holds every bucket whose blocks count
// while that one is its head. (So a bucket's blocks count until its end
// plus the period: at most a bucket after their own end's.)
func blockRing(w ring) ring {
	r := newRing(w.limit, time.Duration(w.period)*time.Microsecond, int(max(w.period/blockLife.Microseconds(), 1)))
	r.n++
	// Kept a bucket longer too (newRing's ttlMS).
	r.ttlMS = (r.period+3*r.gran+999)/1000 + 1
	return r
}

// withBlocks returns pl with the coarse records of its first s windows,
// its short ones (plan.blk): pl compiled again, its script numbers
// followed by the coarse records' (lua/run.lua, planAt) and its record
// names by theirs (stateKeys). It serves a call's keys and numbers only:
// its counters are none.
func (pl *plan) withBlocks(s int) *plan {
	b := compile(pl.policy, pl.buckets, pl.strikeBuckets)
	b.coarse = make([]ring, s)
	nums := []int64{int64(s)}
	for i := range s {
		r := blockRing(pl.windows[i])
		b.coarse[i] = r
		nums = append(nums, int64(i+1), r.period, r.gran, r.n, r.unit, r.ttlMS)
	}
	b.packed = pl.packed + packNums(nums)
	b.argv = [3]any{b.packed, b.mult, b.cmult}
	b.backRings = append(append([]ring(nil), b.coarse...), pl.windows[s:]...)
	return b
}

// blocked keeps what Redis's verdict v granted a round trip for key under
// pl that asked for a block and started at sent: the
// admissions it counted beyond the request's own become the key's lease,
// a block (counted in every window), spent as a lease is until its end,
// and d's windows (the grant's held admissions added back, answered) are
// what it reports from.
func (t *leaseTable) blocked(key string, pl *plan, sent time.Time, v *verdict, d *Decision) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil || v.outcome != Allowed || v.granted <= 1 || d.Outcome != Allowed {
		return
	}
	t.hold(key, e, pl, sent, v, d)
	e.block = true
}

// blockTrip decides a request of a key too slow to lease under a plan
// with short windows, blocks in force: by a round trip asking for a block
// for the key's next requests when its last round trip showed the demand
// and none is being asked already. (A function of its own, so that
// allowShared's frame stays as small for every other request.)
func (l *Limiter) blockTrip(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, names []string, d *Decision) error {
	var v verdict
	var ask *blockAsk
	var asking, warm bool
	var born time.Time
	if l.reg.seeding(pl) == nil {
		rtt := l.lease.rtt.Load()
		var most int64
		if most, warm, born = l.lease.askBlock(key, pl, start, rtt); most > 0 {
			asking = true
			ask = &blockAsk{max: most, replicas: max(l.replicas.live(), 1), rtt: rtt}
		}
	}
	err := l.decide(ctx, key, pl, start, 0, noLease, budget, names, d, &v, ask)
	// The table is written only when this changes it: most cold keys show
	// no demand, decision after decision.
	if demand := err == nil && l.lease.demands(pl, d, start, born); demand != warm || asking {
		l.lease.noteDemand(key, demand, asking)
	}
	return err
}

// askBlock marks a block round trip in flight for key under pl at now and
// returns the largest block to ask (this replica's own demand, ownShare,
// at most MaxLease), or 0 when it asks none: the key's last decision
// showed no demand for one (noteDemand), one is in flight, the key has no
// entry (the table is full), or its own demand here is below the least
// granted. warm is what that last decision showed, born when the entry
// was made (zero without one).
func (t *leaseTable) askBlock(key string, pl *plan, now time.Time, rtt int64) (most int64, warm bool, born time.Time) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return 0, false, time.Time{}
	}
	if !e.warm || e.asking {
		return 0, e.warm, e.born
	}
	if most = min(e.ownShare(now, blockRest(pl, now.UnixMicro(), rtt)), t.maxLease); most < minBlock {
		return 0, true, e.born
	}
	e.asking = true
	return most, true, e.born
}

// ownShare returns what this replica can expect to spend of a block
// for the key over rest µs, on the evidence of its own requests for it
// since the start of the previous block period (of the current one
// while there is none): their count at their average rate over rest, m,
// less √(m·(1 + rest/span)), a standard deviation of the count to come
// and of its estimate, as both are under random arrivals (a Poisson
// count's variance is its mean; the estimate's, scaled, is m·rest/span;
// belowDemand). Sized at m, a block would be left partly unspent
// about half the time; a deviation below, seldom. The span is a blockLife at
// least, so that a new entry's first few requests do not read as a high
// rate. So a block leaves unspent, should the key stop, at most what
// the key itself sent this replica over the block's life at its
// recent rate; and what the replicas hold together stays within the
// key's demand, however a balancer spreads it.
func (e *leaseEntry) ownShare(now time.Time, rest int64) int64 {
	if rest <= 0 {
		return 0
	}
	from := e.ownStart
	if !e.ownPrevStart.IsZero() {
		from = e.ownPrevStart
	}
	span := max(now.Sub(from), blockLife).Microseconds()
	return belowDemand(float64(e.own+e.ownPrev), float64(rest)/float64(span), 1)
}

// blockRest returns the time, µs, a block asked at us (µs) could be
// spent: until the end of every long window of pl's current bucket and of
// every coarse record's next one, at most blockLife, less two round trips
// of rtt µs (the script works the same out on the server's clock).
func blockRest(pl *plan, us, rtt int64) int64 {
	rest := blockLife.Microseconds()
	for i := pl.shortWindows(); i < len(pl.windows); i++ {
		g := pl.windows[i].gran
		rest = min(rest, (us/g+1)*g-us)
	}
	// A block may end in the coarse bucket after the current one
	// (blockWrite in lua/window.lua).
	for _, r := range pl.blk.coarse {
		rest = min(rest, (us/r.gran+2)*r.gran-us)
	}
	return rest - 2*rtt
}

// minBlock is the smallest block granted: the work a block adds to the
// round trip it rides on (its windows' caps, the whole reply) is repaid by
// two requests spent in process, not by one.
const minBlock = 2

// blockAsk asks a round trip under a plan to count, should it admit the
// request, a block for this replica (the script's mode 2). The script
// works out the block's size from the counts that decision reads, so
// that it stands on the key's traffic up to that instant: the requests
// the plan's last short window counts with this one (all replicas' over
// a minute, for the common plan), at their rate over its period, or over
// the time since the oldest it counts for a key it has held for less
// (demandSpan in lua/reserve.lua), scaled to the time the block could be
// spent (blockRest; the script works it out on the server's clock); at
// most max, this replica's own share of that demand (ownShare), and at
// most what leaves every window leaseMargin·k·replicas remaining; none
// below minBlock. So what a block can leave unspent, should the key stop,
// is at most what the key itself sent this replica over the block's life
// at its recent rate, and what the replicas hold together stays within
// the key's demand: a quarter of it each on four replicas a balancer
// spreads the key over, all of it on the one replica a balancer by key
// sends it to. A burst does not take a block far beyond it, as an
// estimate from the last few hundred milliseconds would, nor does a size
// carried over from an earlier decision.
type blockAsk struct {
	max, replicas, rtt int64
}

// nums appends the ask's numbers for a decision under pl past the five
// every ask has (script.go): the replicas, the margin, the least granted,
// the round trips' allowance (µs) and how many of pl's windows are short.
func (a *blockAsk) nums(pl *plan, b []byte) []byte {
	for _, v := range [5]int64{a.replicas, leaseMargin, minBlock, 2 * a.rtt, int64(pl.shortWindows())} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// worthAsking reports whether a block is worth asking for a key whose
// round trip under pl, at now, was decided as d: the script's rule
// (reserveSize in lua/reserve.lua) applied to d's counts, the requests its
// last short window counts over its period or, for a key this replica
// began to track at born, less than a period before now, over the time
// since plus a block's life (the script's span for a key its window has
// held for less, demandSpan, where d tells no age: a key older in Redis
// than here reads as faster than it is, and askBlock's own share, the
// ask's bound, holds it to what this replica has seen), and what its
// windows have left, as if all the key's requests came to this replica.
// It only saves asking for keys that would be granted nothing (the ask
// makes the script read and work out more: about 12,000 instructions,
// BENCHMARKS.md), and keeps such keys in the lease table (warm) while
// this replica's own share of their demand, which bounds the ask
// (askBlock), builds up; the script sizes a block from the counts it
// reads itself.
func worthAsking(pl *plan, d *Decision, now, born time.Time, maxLease, replicas, rtt int64) bool {
	ns := pl.shortWindows()
	rest := blockRest(pl, now.UnixMicro(), rtt)
	if rest <= 0 {
		return false
	}
	sw := d.Windows[ns-1]
	span := sw.Period
	if !born.IsZero() {
		span = min(span, max(now.Sub(born), 0)+blockLife)
	}
	k := min((sw.Limit-sw.Remaining)*rest/span.Microseconds(), maxLease)
	for _, w := range d.Windows {
		k = min(k, w.Remaining/(leaseMargin*replicas))
	}
	return k >= minBlock
}

// demands reports whether key's round trip under pl at now, decided as d,
// shows a block worth asking for its next one (worthAsking; born when
// this replica began to track the key, zero if unknown).
func (t *leaseTable) demands(pl *plan, d *Decision, now, born time.Time) bool {
	return d.Outcome == Allowed && !d.Degraded && worthAsking(pl, d, now, born, t.maxLease, max(t.replicas(), 1), t.rtt.Load())
}

// noteDemand ends key's round trip, which asked for a block if asked,
// recording whether it showed the demand (warm).
func (t *leaseTable) noteDemand(key string, warm, asked bool) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		e.warm = warm
		if asked {
			e.asking = false
		}
	}
}
