package ratelimit

// Blocks: a block spends only admissions Redis already counted in every
// window of its plan, only under that plan, and only until its end, on this
// process's monotonic clock from the round trip's start (so latency and skew
// only shorten it). What it leaves unspent is given back (giveback.go).

import (
	"context"
	"encoding/binary"
	"time"
)

// A block is a lease for a key too slow for one (under two requests expected
// in its shortest window's bucket), asked on a round trip that admits a
// request; a ban issued elsewhere makes holders let go (announceBan). As a
// short window's buckets are too brief to spend one in, each has a coarse
// record (blockRing) with buckets of about blockLife, counting a block whole
// in the bucket of its end, at most the next; a long window counts it in its
// current bucket. Every read sums both records (script.go, pairStanding), so
// a lease's argument holds: a record counts a block from its grant (the head
// moves to its bucket) until that bucket's last event is a period old, and a
// block is granted only while every window has leaseMargin·k·Replicas left,
// and caps each record it counts in.
//
// The cost: decisions under such a plan read coarse records too, and a block
// counts until a period after its coarse bucket, so Retry-After, exact for
// these counts, can be a coarse bucket later than per-admission counts would
// give (two where that bucket does not divide the period).
//
// Compatibility: under any plan with a short window, a replica that did not
// read coarse records would admit past them (another plan of the key, or its
// own before an edit, may have counted blocks). So blocks come into force
// only at finalizing's second level (finalize.go). Plans of short windows
// alone need no level of their own: the release before read their coarse
// records whenever blocks were in force. The script still grants that
// release's reservations (blocks of long windows); this release asks none.

// blockLife is a block's longest life and the coarse records' bucket width:
// a window whose buckets last less is short.
const blockLife = 10 * time.Second

// blockRing returns short window w's coarse record: buckets of blockLife
// (one if shorter), plus one for a head a bucket ahead (blockWrite).
func blockRing(w ring) ring {
	r := newRing(w.limit, time.Duration(w.period)*time.Microsecond, int(max(w.period/blockLife.Microseconds(), 1)))
	r.n++
	// Kept a bucket longer too (newRing's ttlMS).
	r.ttlMS = (r.period+3*r.gran+999)/1000 + 1
	return r
}

// withBlocks returns pl compiled again with coarse records for its s short
// windows, for a call's keys and numbers only: it has no counters.
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

// blocked makes what v granted beyond the request's own the key's lease,
// marked as a block; d's windows are what it reports from.
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

// blockTrip decides a slow key's request, asking for a block when its last
// round trip showed demand (apart, so that allowShared's frame stays small).
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
	// Only a change is written: most cold keys keep showing no demand.
	if demand := err == nil && l.lease.demands(pl, d, start, born); demand != warm || asking {
		l.lease.noteDemand(key, demand, asking)
	}
	return err
}

// askBlock marks a block ask in flight for key and returns the largest block
// to ask (ownShare, at most MaxLease), or 0: no demand shown (warm), an ask
// in flight, no entry, or a share below minBlock.
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

// ownShare returns what this replica can expect to spend of a block over
// rest µs, from its own requests over a blockLife at least (so that a new
// entry's first few do not read as a high rate), less a standard deviation:
// should the key stop, a block leaves at most what it sent here in its life.
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

// blockRest returns how long (µs) a block asked at us could be spent: to the
// end of every long window's bucket and every coarse record's next one, at
// most blockLife, less two round trips (as the script does, by its clock).
func blockRest(pl *plan, us, rtt int64) int64 {
	rest := blockLife.Microseconds()
	for i := pl.shortWindows(); i < len(pl.windows); i++ {
		g := pl.windows[i].gran
		rest = min(rest, (us/g+1)*g-us)
	}
	for _, r := range pl.blk.coarse {
		rest = min(rest, (us/r.gran+2)*r.gran-us)
	}
	return rest - 2*rtt
}

// minBlock is the smallest block granted: the work a block adds to its
// round trip is repaid by two requests spent in process, not by one.
const minBlock = 2

// blockAsk asks a round trip that admits its request to count a block for
// this replica too (mode 2), sized by the script from the counts it reads,
// not a burst: all replicas' rate in the plan's last short window over
// blockRest, none below minBlock, at most max (ownShare), so that replicas'
// blocks stay within the key's demand however a balancer spreads it.
type blockAsk struct {
	max, replicas, rtt int64
}

// nums appends the ask's numbers past the five every ask has (script.go).
func (a *blockAsk) nums(pl *plan, b []byte) []byte {
	for _, v := range [5]int64{a.replicas, leaseMargin, minBlock, 2 * a.rtt, int64(pl.shortWindows())} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// worthAsking reports whether the script's rule (reserveSize in
// lua/reserve.lua) would grant a block on d's counts, as if all the key's
// requests came here, over its period or, if less, the time since born plus
// a blockLife (an older key reads as faster; ownShare bounds the ask).
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

// demands reports whether d shows a block worth asking next (worthAsking).
func (t *leaseTable) demands(pl *plan, d *Decision, now, born time.Time) bool {
	return d.Outcome == Allowed && !d.Degraded && worthAsking(pl, d, now, born, t.maxLease, max(t.replicas(), 1), t.rtt.Load())
}

// noteDemand records whether key's round trip showed demand (warm) and
// ends its ask if it made one.
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
