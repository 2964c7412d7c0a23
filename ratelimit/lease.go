package ratelimit

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Leasing: while every window of a key has plenty of quota left, a replica
// asks the script for a block of k admissions (a lease) instead of one,
// and answers the key's next k-1 requests in process. The script counts
// all k at once, in the current bucket of every window, so the windows
// stay strict across replicas; the price is that admissions leased but
// never spent count until they slide out. Hence:
//
//   - a lease is spent only until the end of the current bucket of every
//     window (and at most leaseLife), converted to this process's
//     monotonic clock from the round trip's start, so that latency and
//     clock skew can only shorten it;
//   - k is this replica's expected demand for the key within that time,
//     less two round trips (the lease arrives one round trip late, and
//     its end is brought forward by the latency), from its rate over the
//     last rateSpan or two, less half a standard deviation, at most
//     MaxLease, so that little of a lease is left when it ends; no lease
//     is asked when that time is too short;
//   - the script grants k only while every window has at least
//     leaseMargin·k·Replicas remaining, and one admission otherwise: near
//     its limit a key is decided exactly, one request per round trip;
//   - what a lease leaves unspent is given back when the replica lets it
//     go (giveback.go): it no longer counts against the key, near its
//     limit or in its day.
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
	// back, when set, is given what leases and blocks leave unspent
	// (giveback.go).
	back func(giveBack)
	// prefix is the limiter's key prefix, for the record names each
	// entry keeps (names); fleet and forceCoarse tell the plan a round
	// trip is sent under, whose records they are (replicas.callPlan).
	prefix      string
	fleet       *replicas
	forceCoarse bool
	// untracked counts the requests of keys the table had no room for
	// (their shard full), until the sweep hands them to the metrics.
	untracked atomic.Int64
}

type leaseShard struct {
	mu   sync.Mutex
	keys map[string]*leaseEntry
}

type leaseEntry struct {
	// Demand: requests seen in the current rate period (from curStart)
	// and in the one before.
	cur, prev int64
	curStart  time.Time

	// This replica's own requests for the key in the current block
	// period (from ownStart; blockLife or more) and in the one before it
	// (from ownPrevStart, zero while there is none): what a block's size
	// stands on (ownShare).
	own, ownPrev           int64
	ownStart, ownPrevStart time.Time
	// born is when this replica began to track the key (the entry's
	// making): the key's windows have held it no longer as far as this
	// replica knows (worthAsking).
	born time.Time

	// The lease: left admissions to spend before deadline (local clock),
	// granted under pl by a round trip that started at sent and ran at
	// redisNow (µs, server clock).
	pl       *plan
	left     int64
	spent    int64
	deadline time.Time
	sent     time.Time
	redisNow int64
	windows  []WindowState // as reported for the first admission of the lease
	binding  int
	// block: the lease is a block (blocks.go), counted in the short
	// windows' coarse records (in the bucket of its end, redisEnd: µs,
	// server clock) and the long windows, for up to blockLife.
	block    bool
	redisEnd int64

	// refill is open while a round trip asking for a lease is in flight;
	// closed when it ends.
	refill chan struct{}

	// warm: the key's last decision under its plan here showed a demand a
	// block would serve (worthAsking); asking: a block round trip is in
	// flight.
	warm, asking bool

	// names are the key's record names under namesPl (stateKeys), made
	// once rather than for every round trip; never changed in place, so
	// a round trip may hold them after the shard's lock is released.
	names   []string
	namesPl *plan
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

// take answers one request for key under pl from its lease (served, the
// decision in d). When it cannot, it returns what to ask the script for
// and the key's record names under the plan its round trip is sent
// under (nil when the table has no room for the key); wait, when not nil, is a lease round trip for the key
// already in flight, which the caller may wait for and then call take
// again with first false. first also counts the request toward the key's
// demand. A caller given an ask with want > 1 must call done when its
// round trip ends.
func (t *leaseTable) take(key string, pl *plan, now time.Time, first bool, d *Decision) (served bool, ask leaseAsk, wait <-chan struct{}, names []string) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		if len(sh.keys) >= t.maxPerShard {
			t.untracked.Add(1)
			return false, noLease, nil, nil
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
			return true, noLease, nil, nil
		}
		t.dropLease(key, e)
	}
	names = e.namesOf(t.prefix, key, t.fleet.callPlan(pl, t.forceCoarse))
	if e.refill != nil {
		if first {
			return false, noLease, e.refill, names
		}
		return false, noLease, nil, names
	}
	k := e.size(pl, now, t.maxLease, t.rtt.Load())
	if k <= 1 {
		return false, noLease, nil, names
	}
	e.refill = make(chan struct{})
	return false, leaseAsk{want: k, need: k * leaseMargin * max(t.replicas(), 1), life: leaseLife.Microseconds()}, nil, names
}

// namesOf returns the key's record names under pl (stateKeys), made
// when the entry has none for pl. The caller holds the shard's lock.
func (e *leaseEntry) namesOf(prefix, key string, pl *plan) []string {
	if e.namesPl != pl {
		ns := stateKeys(prefix, key, pl)
		e.names, e.namesPl = ns[:len(ns):len(ns)], pl
	}
	return e.names
}

// done ends a lease round trip for key that started at sent. With ok, v
// is its verdict and d the decision made from it; a grant of more than one
// admission becomes the key's lease.
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

// hold makes what a round trip for key under pl that started at sent
// granted beyond its request's own (v's, decided as d) the key's lease,
// letting the one it held go. The caller holds the shard's lock.
func (t *leaseTable) hold(key string, e *leaseEntry, pl *plan, sent time.Time, v *verdict, d *Decision) {
	t.dropLease(key, e)
	e.pl, e.left, e.spent = pl, v.granted-1, 1
	e.sent, e.redisNow, e.redisEnd = sent, v.now, v.leaseEnd
	// The server's remaining lease time, counted from before the round
	// trip began, less a microsecond for the resolution of the server's
	// clock: never later than the lease's end on the server's clock.
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

// size returns the lease to ask for: the requests expected within the
// time a lease taken now could be spent, at the rate of the requests seen
// before this one over the current rate period and the one before, less
// half a standard deviation (leaseDeviations), at most maxLease. A key
// seen once in a while never leases.
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

// leaseDeviations is how far below its expected demand a lease is sized,
// in standard deviations (belowDemand). At 0, leases were left partly
// unspent about half the time (11% of leased admissions under random
// arrivals); at half a deviation, 6%, for about 4 in 100 requests more
// decided by a round trip (TestLeaseWasteUnderRandomArrivals). A whole
// one, as blocks take, would cost twice that: a lease's rate is
// measured over a few hundred milliseconds, so its estimate is as noisy
// as the demand itself. The key's slower rates (own, ownPrev), steadier,
// were tried in its place: a key resuming after a pause of a few
// seconds then leased little until they caught up (a benchmark's keys
// sending in rounds leased 0.62-0.81 of their requests, against 0.87).
const leaseDeviations = 0.5

// belowDemand returns a block's size for n requests counted over a span,
// to be spent over scale times that span: m = n·scale, the requests
// expected, less d standard deviations of the count to come and of its
// estimate together, √(m·(1 + scale)), as both are under random arrivals
// (a Poisson count's variance is its mean; the estimate's, scaled, is
// m·scale), and never below 0. Sized at m, a block is left partly unspent
// about half the time, and what it leaves counts in the key's windows for
// nothing.
func belowDemand(n, scale, d float64) int64 {
	m := n * scale
	if m <= 0 {
		return 0
	}
	return int64(max(m-d*math.Sqrt(m*(1+scale)), 0))
}

// serve puts in d the decision for one admission from the lease (or
// block).
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

// drop forgets the key's lease, counting what it left unspent (its
// admissions stay counted in Redis), and returns that.
func (e *leaseEntry) drop() (unspent int64) {
	if e.left > 0 && e.pl != nil {
		unspent = e.left
		e.pl.unspent[e.kind()].Add(float64(unspent))
	}
	e.pl, e.left, e.spent, e.windows, e.block = nil, 0, 0, e.windows[:0], false
	return unspent
}

// kind is the metrics' index of what the key's lease is: 0 a lease, 1 a
// block.
func (e *leaseEntry) kind() int {
	if e.block {
		return 1
	}
	return 0
}

// dropLease is e.drop, giving back what the lease leaves unspent: a
// lease's in every window's record, a block's in the short windows'
// coarse records and the long windows' (blockRings).
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

// letGo drops key's lease (or block), giving back what it leaves unspent.
func (t *leaseTable) letGo(key string) {
	sh := t.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		t.dropLease(key, e)
	}
	sh.mu.Unlock()
}

// forget drops key's lease or block, without giving back what it leaves
// unspent: after a Reset its records are new (giveback.go).
func (t *leaseTable) forget(key string) {
	sh := t.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		e.drop()
	}
	sh.mu.Unlock()
}

// release drops every lease and block the table holds, counting what they
// leave unspent (drop), and returns how many admissions that was.
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

// sweep drops keys without a usable lease or a round trip in flight that
// have been idle for two rate periods, except a key whose last decision
// showed the demand for a block (warm), idle for less than blockLife: a
// key sending a few requests a second to a fleet reaches each replica a
// second or more apart, and would otherwise lose what its last round trip
// showed before its next request, and never take a block. Such keys are
// kept only while their shard is at most half full, so that they never
// crowd out the keys that lease.
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
