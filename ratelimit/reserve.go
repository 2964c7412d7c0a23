package ratelimit

import (
	"context"
	"encoding/binary"
	"time"
)

// Reservations: a lease of a plan's long windows alone. A key far from
// its limits but too slow to lease (a few requests a second: fewer than
// two expected within the current bucket of its shortest window) calls
// Redis for every request, and most of that call's work is spent on its
// long windows, whose buckets last minutes (a day window's 7.2) and whose
// limits it is nowhere near. So a replica asks such a key's round trip
// under the whole plan to reserve, should it admit the request, a block of
// k more admissions of the plan's long windows alone (plan.long; k worked
// out by the script, reserveAsk), and sends the key's next requests under
// the plan's short part (plan.short: the short windows and the ban rule),
// each with one reserved admission in hand. The argument that keeps a
// lease strict holds for each part:
//
//   - the reservation counts all k admissions in every long window when it
//     is granted (with the request it rides on, which counts once in every
//     window), in the current bucket, and records the reservation's end as
//     that bucket's last event, so each admission spent before the end is
//     counted in every interval that holds it;
//   - it is granted only while every long window has leaseMargin·k·Replicas
//     remaining, is capped (the lease cap) at its plan's limits while it
//     runs, and is spent only under the plan it was taken for, before the
//     end of its bucket in every long window, within reserveLife of the
//     round trip's start and on this process's monotonic clock;
//   - each request spending it is decided exactly in every short window
//     (and against the key's ban) by its own round trip, and gives its
//     reserved admission back when that decision refuses it or fails.
//
// What a reservation leaves unspent stays counted in the long windows until
// it slides out, as a lease's does; its size is the key's demand within
// its life, so little is left. A decision under the short part reads and
// writes no long window's record: for the common plan of a minute and a
// day, about a quarter of a cold decision's work in Redis.
const reserveLife = 10 * time.Second

// reservation is a key's reserved admissions of its plan's long windows.
type reservation struct {
	pl       *plan // the whole plan it was taken for
	left     int64
	deadline time.Time
	redisNow int64        // the grant's server time, µs
	win      []winVerdict // the long windows as the grant left them (the whole reservation counted)
	asking   bool         // a reservation round trip is in flight
	// warm: the key's last decision under a whole plan here showed a
	// demand a reservation would serve (worthAsking).
	warm bool
}

// reserveTake hands out one reserved admission of key under pl at now. It
// returns a window standing for each of pl's windows, the long ones as the
// grant left them (the short ones for the caller to fill), the admissions
// left after this one and the reservation's deadline, to give the
// admission back with; ok is false when none is held (and nothing is
// allocated).
func (t *leaseTable) reserveTake(key string, pl *plan, now time.Time) (win []winVerdict, left int64, deadline time.Time, ok bool) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return nil, 0, time.Time{}, false
	}
	r := &e.res
	if r.left <= 0 || r.pl != pl || !now.Before(r.deadline) {
		return nil, 0, time.Time{}, false
	}
	win = make([]winVerdict, len(pl.windows))
	copy(win[len(pl.windows)-len(r.win):], r.win)
	r.left--
	return win, r.left, r.deadline, true
}

// reserveGiveBack returns an admission reserveTake handed out under the
// reservation that ends at deadline, if it is still the key's.
func (t *leaseTable) reserveGiveBack(key string, pl *plan, deadline time.Time) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil && e.res.pl == pl && e.res.deadline.Equal(deadline) {
		e.res.left++
	}
}

// askReservation marks a reservation round trip in flight for key under pl
// at now and returns the most to reserve (this replica's own demand,
// ownShare, at most MaxLease), or 0 when it asks none: the key's last whole
// decision showed no demand for one (noteDemand), one is in flight, the
// key holds a usable reservation (or no entry: the table is full), or its
// own demand here is below the least granted. warm is what that last
// decision showed, born when the entry was made (zero without one).
func (t *leaseTable) askReservation(key string, pl *plan, now time.Time, rtt int64) (most int64, warm bool, born time.Time) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return 0, false, time.Time{}
	}
	if !e.res.warm || e.res.asking || e.res.pl == pl && e.res.left > 0 && now.Before(e.res.deadline) {
		return 0, e.res.warm, e.born
	}
	if most = min(e.ownShare(now, reserveRest(pl, now.UnixMicro(), rtt, t.blocksOn())), t.maxLease); most < minReserve {
		return 0, true, e.born
	}
	e.res.asking = true
	return most, true, e.born
}

// ownShare returns what this replica can expect to spend of a reservation
// for the key over rest µs, on the evidence of its own requests for it
// since the start of the previous reservation period (of the current one
// while there is none): their count at their average rate over rest, m,
// less √(m·(1 + rest/span)), a standard deviation of the count to come
// and of its estimate, as both are under random arrivals (a Poisson
// count's variance is its mean; the estimate's, scaled, is m·rest/span;
// belowDemand). Sized at m, a reservation would be left partly unspent
// about half the time; a deviation below, seldom
// (TestReservationWasteUnderRandomArrivals). The span is a reserveLife at
// least, so that a new entry's first few requests do not read as a high
// rate. So a reservation leaves unspent, should the key stop, at most what
// the key itself sent this replica over the reservation's life at its
// recent rate; and what the replicas reserve together stays within the
// key's demand, however a balancer spreads it.
func (e *leaseEntry) ownShare(now time.Time, rest int64) int64 {
	if rest <= 0 {
		return 0
	}
	from := e.ownStart
	if !e.ownPrevStart.IsZero() {
		from = e.ownPrevStart
	}
	span := max(now.Sub(from), reserveLife).Microseconds()
	return belowDemand(float64(e.own+e.ownPrev), float64(rest)/float64(span), 1)
}

// reserveRest returns the time, µs, a reservation asked at us (µs) could
// be spent: until the end of every long window of pl's current bucket
// (and with blocks, of every coarse record's next one), at most reserveLife, less
// two round trips of rtt µs (the script works the same out on the
// server's clock).
func reserveRest(pl *plan, us, rtt int64, blocks bool) int64 {
	rest := reserveLife.Microseconds()
	for i := pl.shortWindows(); i < len(pl.windows); i++ {
		g := pl.windows[i].gran
		rest = min(rest, (us/g+1)*g-us)
	}
	if blocks {
		// A block may end in the coarse bucket after the current one
		// (blockWrite in lua/window.lua).
		for _, r := range pl.blk.coarse {
			rest = min(rest, (us/r.gran+2)*r.gran-us)
		}
	}
	return rest - 2*rtt
}

// blocksOn reports whether blocks are in force (blocks.go).
func (t *leaseTable) blocksOn() bool { return t.blocks != nil && t.blocks() }

// minReserve is the smallest reservation granted. The work a reservation
// adds to the round trip it rides on (its long windows' caps, the whole
// reply: about 29,000 instructions in Redis) is repaid by two reserved
// decisions (about 21,000 less each, for a plan of a minute and a day;
// BENCHMARKS.md), not by one.
const minReserve = 2

// reserveAsk asks a round trip under a whole plan to reserve, should it
// admit the request, a block of the plan's long windows for this replica
// (the script's mode 2). The script works out the block's size from the
// counts that decision reads, so that it stands on the key's traffic up
// to that instant: the requests the plan's last short window counts with
// this one (all replicas' over a minute, for the common plan), at their
// rate over its period, or over the time since the oldest it counts for a
// key it has held for less (demandSpan in lua/reserve.lua), scaled to
// the time the reservation could be spent (until the end of every long
// window's current bucket and within reserveLife, less two round trips);
// at most max, this replica's own share of that demand (ownShare), and at
// most what leaves every long window leaseMargin·k·replicas remaining;
// none below minReserve. So what a reservation can leave unspent, should
// the key stop, is at most what the key itself sent this replica over the
// reservation's life at its recent rate, and what the replicas reserve
// together stays within the key's demand: a quarter of it each on four
// replicas a balancer spreads the key over, all of it on the one replica
// a balancer by key sends it to. A burst does not reserve far beyond it,
// as an estimate from the last few hundred milliseconds would, nor does a
// size carried over from an earlier decision.
type reserveAsk struct {
	max, replicas, rtt int64
}

// nums appends the ask's numbers for a decision under pl past the five
// every ask has (script.go): the replicas, the margin, the least granted,
// the round trips' allowance (µs) and how many of pl's windows are short.
func (a *reserveAsk) nums(pl *plan, b []byte) []byte {
	for _, v := range [5]int64{a.replicas, leaseMargin, minReserve, 2 * a.rtt, int64(pl.shortWindows())} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// worthAsking reports whether a reservation is worth asking for a key
// whose round trip under pl, at now, was decided as d: the script's rule
// (reserveSize in lua/reserve.lua) applied to d's counts, the requests its last
// short window counts over its period or, for a key this replica began to
// track at born, less than a period before now, over the time since plus
// a reservation's life (the script's span for a key its window has held
// for less, demandSpan, where d tells no age: a key older in Redis than
// here reads as faster than it is, and askReservation's own share, the
// ask's bound, holds it to what this replica has seen), and what its
// windows have left, as if all the key's requests came to this replica.
// It only saves asking for keys that would be granted nothing (the ask
// makes the script read and work out more: about 12,000 instructions,
// BENCHMARKS.md), and keeps such keys in the lease table (warm) while
// this replica's own share of their demand, which bounds the ask
// (askReservation), builds up; the script sizes a reservation from the
// counts it reads itself.
func worthAsking(pl *plan, d *Decision, now, born time.Time, maxLease, replicas, rtt int64, blocks bool) bool {
	ns := pl.shortWindows()
	rest := reserveRest(pl, now.UnixMicro(), rtt, blocks)
	if rest <= 0 {
		return false
	}
	sw := d.Windows[ns-1]
	span := sw.Period
	if !born.IsZero() {
		span = min(span, max(now.Sub(born), 0)+reserveLife)
	}
	k := min((sw.Limit-sw.Remaining)*rest/span.Microseconds(), maxLease)
	from := ns
	if blocks {
		// A block is counted in the short windows too.
		from = 0
	}
	for _, w := range d.Windows[from:] {
		k = min(k, w.Remaining/(leaseMargin*replicas))
	}
	return k >= minReserve
}

// demands reports whether key's round trip under pl at now, decided as d,
// shows a reservation worth asking for its next one (worthAsking; born
// when this replica began to track the key, zero if unknown).
func (t *leaseTable) demands(pl *plan, d *Decision, now, born time.Time) bool {
	return d.Outcome == Allowed && !d.Degraded && worthAsking(pl, d, now, born, t.maxLease, max(t.replicas(), 1), t.rtt.Load(), t.blocksOn())
}

// noteDemand ends key's round trip under a whole plan, which asked to
// reserve if asked, recording whether it showed the demand (warm).
func (t *leaseTable) noteDemand(key string, warm, asked bool) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		e.res.warm = warm
		if asked {
			e.res.asking = false
		}
	}
}

// reserved keeps what Redis's verdict v granted a round trip for key under
// pl that asked to reserve and started at sent: the admissions it counted
// beyond the request's own become the key's reservation, of the long
// windows (v's windows after the plan's short ones, as the grant left
// them).
func (t *leaseTable) reserved(key string, pl *plan, sent time.Time, v *verdict) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil || v.outcome != Allowed || v.granted <= 1 {
		return
	}
	t.dropReserved(key, e)
	r := &e.res
	r.pl, r.left, r.redisNow = pl, v.granted-1, v.now
	// As a lease's: never later than its end on the server's clock.
	r.deadline = sent.Add(time.Duration(v.leaseEnd-v.now-1) * time.Microsecond)
	r.win = append(r.win[:0], v.win[len(pl.short.windows):]...)
}

// dropReserved is e.dropReservation, giving back what the reservation
// leaves unspent: its admissions were counted in the plan's long windows.
func (t *leaseTable) dropReserved(key string, e *leaseEntry) int64 {
	pl, at := e.res.pl, e.res.redisNow
	n := e.dropReservation()
	if n > 0 && t.back != nil {
		t.back(giveBack{key: key, windows: pl.windows[len(pl.short.windows):], at: at, n: n, counter: pl.givenBack[1]})
	}
	return n
}

// dropReservation forgets key's reservation, counting what it left
// unspent (its admissions stay counted in Redis), and returns that.
func (e *leaseEntry) dropReservation() (unspent int64) {
	if e.res.left > 0 && e.res.pl != nil {
		unspent = e.res.left
		e.res.pl.unspent[1].Add(float64(unspent))
	}
	e.res.pl, e.res.left = nil, 0
	return unspent
}

// reservedTrip decides a request of a key too slow to lease under a plan
// with long windows, or with blocks in force under a plan of short windows
// alone: under the plan's short part when this replica holds a
// reservation for the key, else by a round trip under the whole plan,
// asked to reserve (with blocks in force, for a block) for the key's next
// requests when its last such round trip showed the demand and none is
// being asked already. (A function of its own, so that allowShared's frame
// stays as small for every other request.)
func (l *Limiter) reservedTrip(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, names []string, d *Decision) error {
	if pl.short != nil {
		if handled, err := l.spendReserved(ctx, key, pl, start, budget, names, d); handled {
			return err
		}
	}
	var v verdict
	var ask *reserveAsk
	var asking, warm bool
	var born time.Time
	// (No ask while coarse records are read but blocks are not in force:
	// the script would grant a block, which only blocks in force spend;
	// nor then for a plan of short windows alone, which has no
	// reservation.)
	if l.reg.seeding(pl) == nil && (l.blocksOn() || !l.readsCoarse() && pl.short != nil) {
		rtt := l.lease.rtt.Load()
		var most int64
		if most, warm, born = l.lease.askReservation(key, pl, start, rtt); most > 0 {
			asking = true
			ask = &reserveAsk{max: most, replicas: max(l.replicas.live(), 1), rtt: rtt}
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

// spendReserved decides key's request under the short part of pl when this
// replica holds a reservation of its long part for it. handled is false
// when it holds none, or the request must be decided whole (admissions
// made without Redis to report, a plan being seeded): the caller then
// decides as usual.
func (l *Limiter) spendReserved(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, names []string, d *Decision) (handled bool, err error) {
	if l.breaker.isOpen() || budget <= 0 || l.reg.seeding(pl) != nil {
		return false, nil
	}
	if add, pending := l.fb.takePending(key, pl, start.UnixMicro()); add != nil {
		l.fb.restorePending(key, pending)
		return false, nil
	}
	win, left, deadline, ok := l.lease.reserveTake(key, pl, start)
	if !ok {
		return false, nil
	}
	if cerr := ctx.Err(); cerr != nil {
		l.lease.reserveGiveBack(key, pl, deadline)
		*d = Decision{}
		return true, cerr
	}
	// The short windows are decided into their places in win.
	sv := verdict{win: win[:len(pl.short.windows)]}
	// The short part's records are the first of the whole plan's (but for
	// the coarse ones, with blocks in force).
	sp := l.callPlan(pl.short)
	if n := pl.short.keyCount(); names != nil && pl.shortNamesFirst && sp == pl.short {
		names = names[:n:n]
	} else {
		names = stateKeys(l.opts.Prefix, key, sp)
	}
	reply, err := l.batch.do(ctx, decision{keys: names, pl: sp}, budget)
	if err == nil {
		err = decodeInto(pl.short, reply, &sv)
	}
	if err != nil {
		l.lease.reserveGiveBack(key, pl, deadline)
		return true, l.failedTrip(ctx, key, pl, start, 0, d)
	}
	if sv.outcome != Allowed {
		l.lease.reserveGiveBack(key, pl, deadline)
		left++
	}
	// The decision under the whole plan: the short windows as decided, the
	// long ones as the reservation's grant left them (Redis's count).
	v := sv
	v.win = win
	l.answered(key, pl, start, &v, len(sv.win), left, d)
	d.Reserved = true
	pl.reserved.Inc()
	return true, nil
}
