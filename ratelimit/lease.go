package ratelimit

// Grants: a grant (a lease, or for a key too slow for one a block) spends
// only admissions Redis already counted in every window of its plan, only
// under that plan and until its end, by this process's monotonic clock from
// the round trip's start, which latency and skew only bring forward. What it
// leaves unspent is given back (giveback.go).

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// A lease is k admissions asked at once, to answer the key's next k-1
// requests in process. The script counts them in every window's current
// bucket, only while each has leaseMargin·k·Replicas remaining: near its
// limit a key is decided exactly, a round trip per request.
const (
	leaseMargin = 4
	leaseLife   = time.Second
	rateSpan    = 250 * time.Millisecond
	// leaseKeys caps the keys whose demand and lease this process tracks.
	leaseKeys = 65536
)

// leaseTable holds this process's leases and per-key demand.
type leaseTable struct {
	seed        maphash.Seed
	shards      [memShards]leaseShard
	maxPerShard int
	maxLease    int64
	replicas    func() int64 // live replica count
	rtt         atomic.Int64 // moving average of decision round trips, µs
	// back, when set, is given what leases and blocks leave unspent.
	back func(giveBack)
	// untracked counts requests of keys the table had no room for.
	untracked atomic.Int64
}

type leaseShard struct {
	mu   sync.Mutex
	keys map[string]*leaseEntry
}

type leaseEntry struct {
	// Requests in this rate period (from curStart) and the one before.
	cur, prev int64
	curStart  time.Time

	// Requests per block period, this one and the one before (ownShare).
	own, ownPrev           int64
	ownStart, ownPrevStart time.Time
	// born is when the entry was made (worthAsking).
	born time.Time

	// The lease: left admissions to spend before deadline (local clock),
	// granted under pl by a round trip sent at sent, run at redisNow (µs).
	pl       *plan
	left     int64
	spent    int64
	deadline time.Time
	sent     time.Time
	redisNow int64
	windows  []WindowState // as reported for the first admission of the lease
	binding  int
	// block: the lease is a block, ending at redisEnd (µs, server clock).
	block    bool
	redisEnd int64

	// refill is open while a lease round trip is in flight.
	refill chan struct{}

	// warm: last decision showed block demand; asking: block ask in flight.
	warm, asking bool
}

func newLeaseTable(maxLease int, replicas func() int64) *leaseTable {
	t := &leaseTable{
		seed:        maphash.MakeSeed(),
		maxPerShard: max(leaseKeys/memShards, 1),
		maxLease:    int64(maxLease),
		replicas:    replicas,
	}
	for i := range t.shards {
		t.shards[i].keys = make(map[string]*leaseEntry)
	}
	return t
}

func (t *leaseTable) shard(key string) *leaseShard {
	return &t.shards[maphash.String(t.seed, key)%memShards]
}

// take answers one request for key from its lease (served), or returns what
// to ask the script for and wait, a lease round trip in flight, after which
// to call take again with first false. A caller given an ask with want > 1
// must call done when it ends.
func (t *leaseTable) take(key string, pl *plan, now time.Time, first bool, d *Decision) (served bool, ask leaseAsk, wait <-chan struct{}) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		if len(sh.keys) >= t.maxPerShard {
			t.untracked.Add(1)
			return false, noLease, nil
		}
		e = &leaseEntry{curStart: now, ownStart: now, born: now}
		sh.keys[key] = e
	}
	if first {
		e.note(now)
	}
	if e.left > 0 {
		if e.pl == pl && now.Before(e.deadline) {
			e.left--
			e.serve(now, d)
			return true, noLease, nil
		}
		t.dropLease(key, e)
	}
	if e.refill != nil {
		if first {
			return false, noLease, e.refill
		}
		return false, noLease, nil
	}
	k := e.size(pl, now, t.maxLease, t.rtt.Load())
	if k <= 1 {
		return false, noLease, nil
	}
	e.refill = make(chan struct{})
	return false, leaseAsk{want: k, need: k * leaseMargin * max(t.replicas(), 1), life: leaseLife.Microseconds()}, nil
}

// done ends key's lease round trip; with ok, a grant over one is its lease.
func (t *leaseTable) done(key string, pl *plan, sent time.Time, v *verdict, d *Decision, ok bool) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return
	}
	if e.refill != nil {
		close(e.refill)
		e.refill = nil
	}
	if !ok || v.granted <= 1 || d.Outcome != Allowed {
		return
	}
	t.hold(key, e, pl, sent, v, d)
}

// hold makes what v granted beyond the request's own the key's lease,
// letting the old one go. The caller holds the shard's lock.
func (t *leaseTable) hold(key string, e *leaseEntry, pl *plan, sent time.Time, v *verdict, d *Decision) {
	t.dropLease(key, e)
	e.pl, e.left, e.spent = pl, v.granted-1, 1
	e.sent, e.redisNow, e.redisEnd = sent, v.now, v.leaseEnd
	// Counted from before the round trip began, less 1 µs for the server
	// clock's resolution: never later than the lease's end by that clock.
	e.deadline = sent.Add(time.Duration(v.leaseEnd-v.now-1) * time.Microsecond)
	e.windows = append(e.windows[:0], d.Windows...)
	e.binding = d.Binding
}

// observe adds a decision round trip of d to the moving average.
func (t *leaseTable) observe(d time.Duration) {
	us := max(d.Microseconds(), 0)
	for {
		old := t.rtt.Load()
		if t.rtt.CompareAndSwap(old, old+(us-old)/8) {
			return
		}
	}
}

// note counts one request toward the key's demand.
func (e *leaseEntry) note(now time.Time) {
	if el := now.Sub(e.curStart); el >= rateSpan {
		if el >= 2*rateSpan {
			e.prev = 0
		} else {
			e.prev = e.cur
		}
		e.cur, e.curStart = 0, now
	}
	e.cur++
	if now.Sub(e.ownStart) >= blockLife {
		e.ownPrev, e.ownPrevStart = e.own, e.ownStart
		e.own, e.ownStart = 0, now
	}
	e.own++
}

// size returns the lease to ask for (1: none): the requests expected at the
// recent rate while a lease taken now could be spent, less two round trips
// (it arrives late and ends early), less leaseDeviations, at most maxLease.
func (e *leaseEntry) size(pl *plan, now time.Time, maxLease, rtt int64) int64 {
	if maxLease <= 1 {
		return 1
	}
	span := rateSpan + now.Sub(e.curStart)
	us := now.UnixMicro()
	rest := leaseLife.Microseconds()
	for i := range pl.windows {
		g := pl.windows[i].gran
		rest = min(rest, (us/g+1)*g-us)
	}
	rest -= 2 * rtt
	if rest <= 0 {
		return 1
	}
	return min(belowDemand(float64(e.prev+e.cur-1), float64(rest)/float64(span.Microseconds()), leaseDeviations), maxLease)
}

// leaseDeviations is how many standard deviations below demand a lease is
// sized, trading unspent admissions against round trips: not a block's whole
// one, as a lease's rate over a few hundred milliseconds is as noisy as the
// demand; nor from the steadier own rate, which lags after a pause.
const leaseDeviations = 0.5

// belowDemand sizes a block for n requests counted over a span, spent over
// scale spans: m = n·scale less d deviations of the count and its estimate,
// √(m·(1+scale)) under random arrivals (at m, half are left partly unspent).
func belowDemand(n, scale, d float64) int64 {
	m := n * scale
	if m <= 0 {
		return 0
	}
	return int64(max(m-d*math.Sqrt(m*(1+scale)), 0))
}

// serve puts in d the decision for one admission from the lease.
func (e *leaseEntry) serve(now time.Time, d *Decision) {
	*d = Decision{
		Outcome: Allowed,
		Windows: make([]WindowState, len(e.windows)),
		Binding: e.binding,
		Time:    time.UnixMicro(e.redisNow).Add(now.Sub(e.sent)),
		Leased:  true,
	}
	for i, w := range e.windows {
		w.Remaining = max(w.Remaining-e.spent, 0)
		d.Windows[i] = w
	}
	e.spent++
}

// drop forgets the lease, returning its unspent rest, still counted in Redis.
func (e *leaseEntry) drop() (unspent int64) {
	if e.left > 0 && e.pl != nil {
		unspent = e.left
		e.pl.unspent[e.kind()].Add(float64(unspent))
	}
	e.pl, e.left, e.spent, e.windows, e.block = nil, 0, 0, e.windows[:0], false
	return unspent
}

// kind is the metrics' index of the lease: 0 a lease, 1 a block.
func (e *leaseEntry) kind() int {
	if e.block {
		return 1
	}
	return 0
}

// dropLease is e.drop, giving back the unspent rest where it was counted.
func (t *leaseTable) dropLease(key string, e *leaseEntry) int64 {
	pl, at, kind, end := e.pl, e.redisNow, e.kind(), e.redisEnd
	n := e.drop()
	if n > 0 && t.back != nil {
		g := giveBack{key: key, windows: pl.windows, at: at, n: n, counter: pl.givenBack[kind]}
		if kind == 1 {
			g.windows, g.coarse, g.end = pl.blk.backRings, len(pl.blk.coarse), end
		}
		t.back(g)
	}
	return n
}

func (t *leaseTable) letGo(key string) {
	sh := t.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		t.dropLease(key, e)
	}
	sh.mu.Unlock()
}

// forget drops key's lease or block without giving it back: after a Reset
// its records are new (giveback.go).
func (t *leaseTable) forget(key string) {
	sh := t.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		e.drop()
	}
	sh.mu.Unlock()
}

// release drops every lease and block, giving back what they leave unspent.
func (t *leaseTable) release() (unspent int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			unspent += t.dropLease(k, e)
		}
		sh.mu.Unlock()
	}
	return unspent
}

// sweep drops keys idle for two rate periods, without a usable lease or a
// round trip in flight. A warm key, which may reach each replica a second
// or more apart, is kept up to blockLife so that it can take a block, but
// only in a shard at most half full, so as not to crowd out keys that lease.
func (t *leaseTable) sweep(now time.Time) (kept int) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		crowded := 2*len(sh.keys) > t.maxPerShard
		for k, e := range sh.keys {
			idle := now.Sub(e.curStart)
			if e.refill == nil && idle >= 2*rateSpan && (e.left == 0 || !now.Before(e.deadline)) &&
				!e.asking && (!e.warm || crowded || idle >= blockLife) {
				t.dropLease(k, e)
				delete(sh.keys, k)
			}
		}
		kept += len(sh.keys)
		sh.mu.Unlock()
	}
	return kept
}

// A block is a lease for a key too slow for one (under two requests expected
// in its shortest window's bucket), asked on a round trip that admits a
// request; a ban issued elsewhere makes holders let go (announceBan). As a
// short window's buckets are too brief to spend one in, each has a coarse
// record (blockRing) with buckets of about blockLife, counting a block whole
// in the bucket of its end, at most the next; a long window counts it in its
// current bucket. Every read sums both records (pairStanding in
// lua/window.lua), so a lease's argument holds: a record counts a block from
// its grant (the head moves to its bucket) until that bucket's last event is
// a period old, and a block is granted only while every window has
// leaseMargin·k·Replicas left, and caps each record it counts in.
//
// The cost: decisions under such a plan read coarse records too, and a block
// counts until a period after its coarse bucket, so Retry-After, exact for
// these counts, can be a coarse bucket later than per-admission counts would
// give (two where that bucket does not divide the period).
//
// Compatibility: under any plan with a short window, a replica that did not
// read coarse records would admit past them (another plan of the key, or its
// own before an edit, may have counted blocks). So blocks come into force
// only with finalizing (finalize.go). Each release runs its own decision
// code (redisdecider.go names it by a digest), so the script grants a block
// only with a coarse record for every short window: the grants of the
// long windows alone that releases before finalizing made are gone.

// blockLife is a block's longest life and the coarse records' bucket width:
// a window whose buckets last less is short.
const blockLife = 10 * time.Second

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

// worthAsking reports whether the script's rule (blockSize in
// lua/blocksize.lua) would grant a block on d's counts, as if all the key's
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
