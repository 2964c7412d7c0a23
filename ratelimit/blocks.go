package ratelimit

import "time"

// Blocks: a reservation of every window, the short ones too, spent in
// process. A reservation (reserve.go) spares a cold key's round trip the
// work of its long windows, but each request still makes one for its short
// windows: a block counted in a short window's own ring, whose buckets
// last a fraction of a second, could be spent only until its bucket ends,
// and no ring of today's can hold a count longer than a period after its
// bucket ends. So each short window of a plan that counts blocks has a
// second record, its coarse record: a ring of the same period whose
// buckets last reserveLife (blockRing), where a block is counted whole in
// the bucket of its end (at most the one after the current: the record's
// head may run a bucket ahead of the clock), its end that bucket's last
// event, much as a reservation is counted in a long window. The window
// counts the sum of both records, everywhere a decision reads it: its
// admissions, caps, Remaining, Reset and Retry-After (script.go,
// pairStanding). The argument that keeps a reservation strict then holds
// for every window:
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
//     it was taken for, within its end on this process's clock;
//   - a request spent from it is decided in process, as a lease's is
//     (lease.go): no round trip.
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
// reserveLife divides a minute, and up to one more where it does not: a
// 32 s period has buckets of 10,666,666 µs, and the period spans one more
// of them than three, so a bucket counts 42.7 s past its end). A ban
// issued elsewhere is announced to a block's holder (announceBan), which
// lets the block go.
//
// A plan of short windows alone (a minute, say) has no long window to
// reserve, but takes blocks all the same, asked on its whole decision
// (plan.allShort): the argument above needs no long window. A replica of
// the release before, which granted none for such a plan, read its
// coarse records all the same whenever blocks were in force, so the two
// share a fleet without a finalize level of their own.
//
// Blocks need every replica deciding a key to read the coarse records: a
// replica that does not would admit into a window without them. So does
// every plan with a short window, since another plan of the key, or its
// own before an edit, may have blocks counted in the records of its
// periods. So they
// come into force with finalizing's second level (finalize.go), once no
// replica of an older release runs; the blocks hook (hooks, limiter.go) forces them in tests
// and benchmarks.

// blockRing returns the coarse record of short window w: the same period
// and limit, in buckets of reserveLife (one, when the period is shorter),
// and one bucket more than the period spans: a block is counted in the
// bucket of its end (blockWrite in lua/window.lua), at most the one after the
// current, and the record still holds every bucket whose blocks count
// while that one is its head. (So a bucket's blocks count until its end
// plus the period: at most a bucket after their own end's.)
func blockRing(w ring) ring {
	r := newRing(w.limit, time.Duration(w.period)*time.Microsecond, int(max(w.period/reserveLife.Microseconds(), 1)))
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
// pl that asked to reserve with blocks in force and started at sent: the
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
