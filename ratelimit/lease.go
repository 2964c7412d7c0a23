package ratelimit

// Leases: a lease spends only admissions Redis already counted in every
// window, only under its plan and until its end (its buckets' end, at most
// leaseLife) by this process's monotonic clock from the round trip's start,
// which latency and skew only bring forward. What it leaves unspent is given
// back (giveback.go).

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
	// prefix, fleet and forceCoarse name a round trip's records (callPlan).
	prefix      string
	fleet       *replicas
	forceCoarse bool
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

	// names are the key's record names under namesPl, made once; never
	// changed in place, so a round trip may hold them past the lock.
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

// take answers one request for key from its lease (served), or returns what
// to ask the script for, the key's record names (nil without room) and wait,
// a lease round trip in flight, after which to call take again with first
// false. A caller given an ask with want > 1 must call done when it ends.
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

// namesOf returns the key's record names under pl; the caller holds the lock.
func (e *leaseEntry) namesOf(prefix, key string, pl *plan) []string {
	if e.namesPl != pl {
		ns := stateKeys(prefix, key, pl)
		e.names, e.namesPl = ns[:len(ns):len(ns)], pl
	}
	return e.names
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
