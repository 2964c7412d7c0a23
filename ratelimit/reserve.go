package ratelimit

import (
	"context"
	"time"
)

// Reservations: a lease of a plan's long windows alone. A key far from
// its limits but too slow to lease (a few requests a second: fewer than
// two expected within the current bucket of its shortest window) calls
// Redis for every request, and most of that call's work is spent on its
// long windows, whose buckets last minutes (a day window's 7.2) and whose
// limits it is nowhere near. So a replica that has seen such a key admitted
// asks the script, in the background, for a block of k admissions of the
// plan's long windows alone (plan.long), and sends the key's next requests
// under the plan's short part (plan.short: the short windows and the ban
// rule), each with one reserved admission in hand. The argument that keeps
// a lease strict holds for each part:
//
//   - the reservation counts all k admissions in every long window when it
//     is granted, in the current bucket, and records the reservation's end
//     as that bucket's last event, so each admission spent before the end
//     is counted in every interval that holds it;
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
	win      []winVerdict // the long windows as the grant left them (the whole reservation counted)
	asking   bool         // a reservation round trip is in flight
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

// reserveAsk marks a reservation round trip in flight for key under pl at
// now and returns true, unless one is in flight or the key holds a usable
// reservation (or no entry: the table is full).
func (t *leaseTable) reserveAsk(key string, pl *plan, now time.Time) bool {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil || e.res.asking || e.res.pl == pl && e.res.left > 0 && now.Before(e.res.deadline) {
		return false
	}
	e.res.asking = true
	return true
}

// minReserve is the smallest reservation asked for: below it, the call
// that reserves costs Redis about what the reserved decisions save
// (BENCHMARKS.md).
const minReserve = 4

// reserveSize returns the reservation to ask for a key whose round trip
// under pl, at now, was decided as d (0: none): the requests its longest
// short window counts (all replicas' over a minute, for the common plan),
// shared among replicas, scaled to the time a reservation taken now could
// be spent; at most maxLease, and at most what leaves every long window
// leaseMargin·k·replicas remaining. So what a reservation can leave
// unspent, should the key stop, is at most what the key itself sent to
// this replica over the last reservation's life on average (a sixth of its
// last minute's requests for a minute window): a burst does not reserve
// far beyond it, as an estimate from the last few hundred milliseconds
// would.
func reserveSize(pl *plan, d *Decision, now time.Time, maxLease, replicas, rtt int64) int64 {
	ns := len(pl.short.windows)
	us := now.UnixMicro()
	rest := reserveLife.Microseconds()
	for i := ns; i < len(pl.windows); i++ {
		g := pl.windows[i].gran
		rest = min(rest, (us/g+1)*g-us)
	}
	rest -= 2 * rtt
	if rest <= 0 {
		return 0
	}
	sw := d.Windows[ns-1]
	k := min((sw.Limit-sw.Remaining)*rest/(sw.Period.Microseconds()*replicas), maxLease)
	for _, w := range d.Windows[ns:] {
		k = min(k, w.Remaining/(leaseMargin*replicas))
	}
	if k < minReserve {
		return 0
	}
	return k
}

// reserved ends a reservation round trip for key under pl that started at
// sent: with ok, v is its verdict, and a grant of more than one admission
// becomes the key's reservation.
func (t *leaseTable) reserved(key string, pl *plan, sent time.Time, v *verdict, ok bool) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return
	}
	e.res.asking = false
	if !ok || v.outcome != Allowed || v.granted <= 1 {
		return
	}
	r := &e.res
	r.pl, r.left = pl, v.granted
	// As a lease's: never later than its end on the server's clock.
	r.deadline = sent.Add(time.Duration(v.leaseEnd-v.now-1) * time.Microsecond)
	r.win = append(r.win[:0], v.win...)
}

// dropReservation forgets key's reservation (its admissions stay counted).
func (e *leaseEntry) dropReservation() {
	e.res.pl, e.res.left = nil, 0
}

// reserve asks, in the background, for a reservation of key's long windows
// under pl when d, the decision a round trip under the whole plan just
// made at now, shows the key's rate warrants one and every long window the
// margin it needs. (The script grants a single admission when the margin
// is gone by the time it decides, which no request can spend: the check
// makes that rare.)
func (l *Limiter) reserve(key string, pl *plan, now time.Time, d *Decision) {
	if l.closed.Load() || l.reg.seeding(pl) != nil {
		return
	}
	n := max(l.replicas.live(), 1)
	k := reserveSize(pl, d, now, l.lease.maxLease, n, l.lease.rtt.Load())
	if k == 0 || !l.lease.reserveAsk(key, pl, now) {
		return
	}
	ask := leaseAsk{want: k, need: k * leaseMargin * n, life: reserveLife.Microseconds()}
	// Not one of the background loops Close waits for: a request may still
	// start one while Close runs. Close's cancel ends its wait for Redis.
	l.reserving.Add(1)
	go func() {
		defer l.reserving.Done()
		sent := l.now()
		var v verdict
		reply, err := l.batch.do(l.ctx, decision{keys: stateKeys(l.opts.Prefix, key, pl.long), pl: pl.long,
			nums: scriptNums(pl.long, input{lease: ask})}, l.opts.Timeout)
		if err == nil {
			err = decodeInto(pl.long, reply, &v)
		}
		l.lease.reserved(key, pl, sent, &v, err == nil)
	}()
}

// reservedTrip decides a request of a key too slow to lease under a plan
// with long windows: under the plan's short part when this replica holds a
// reservation for the key, else by a round trip under the whole plan,
// after which it may ask for one. (A function of its own, so that
// allowShared's frame stays as small for every other request.)
func (l *Limiter) reservedTrip(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, d *Decision) error {
	if handled, err := l.spendReserved(ctx, key, pl, start, budget, d); handled {
		return err
	}
	err := l.roundTrip(ctx, key, pl, start, 0, noLease, budget, d)
	if err == nil && d.Outcome == Allowed && !d.Degraded {
		l.reserve(key, pl, start, d)
	}
	return err
}

// spendReserved decides key's request under the short part of pl when this
// replica holds a reservation of its long part for it. handled is false
// when it holds none, or the request must be decided whole (admissions
// made without Redis to report, a plan being seeded): the caller then
// decides as usual.
func (l *Limiter) spendReserved(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, d *Decision) (handled bool, err error) {
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
	reply, err := l.batch.do(ctx, decision{keys: stateKeys(l.opts.Prefix, key, pl.short), pl: pl.short}, budget)
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
