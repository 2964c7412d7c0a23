package ratelimit

// Degraded mode: the breaker and the fallback. The breaker trips only on
// persistent failure, minFailures consecutive failed round trips spanning
// tripAfter or more, never on one blip. Callers report only Redis's
// failures, not the replica's own (a decision not queued, or queued past its
// deadline), so that a busy machine is no outage. The fallback, deciding
// while Redis cannot answer, admits within the fail-open bound (fallback).

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// breaker decides when a replica stops asking Redis and answers locally
// (fail-open) or refuses (fail-closed); a request whose own round trip
// failed is decided by the fallback alone. While open, a probe retries
// Redis every interval (probeRedis); its first success closes it.
type breaker struct {
	what      string // what is degraded, for the log lines
	mode      FailureMode
	log       *slog.Logger
	met       *metrics
	gauge     bool // owns fallback_active, fallback_seconds_total and breaker_trips_total
	now       func() time.Time
	probe     func(context.Context) error
	onOpen    func()
	interval  time.Duration
	timeout   time.Duration
	tripAfter time.Duration

	failing atomic.Bool // a failure since the last success: the slow path
	open    atomic.Bool

	mu           sync.Mutex // guards the fields below
	failingSince time.Time
	failures     int
	since        time.Time // open since (fallback_seconds_total settled up to)
	kick         chan struct{}
}

// minFailures is the fewest consecutive failures that trip a breaker.
const minFailures = 3

func (b *breaker) isOpen() bool { return b.open.Load() }

// succeeded records a round trip that Redis answered.
func (b *breaker) succeeded() {
	if !b.failing.Load() {
		return
	}
	b.mu.Lock()
	b.failures, b.failingSince = 0, time.Time{}
	b.failing.Store(false)
	b.mu.Unlock()
}

// failed records a round trip that Redis failed or did not answer in time.
func (b *breaker) failed(err error) {
	now := b.now()
	b.mu.Lock()
	if b.failures == 0 {
		b.failingSince = now
		b.failing.Store(true)
	}
	b.failures++
	trip := !b.open.Load() && b.failures >= minFailures && now.Sub(b.failingSince) >= b.tripAfter
	if trip {
		b.open.Store(true)
		b.since = now
	}
	failures, since := b.failures, b.failingSince
	b.mu.Unlock()
	if !trip {
		return
	}
	if b.gauge {
		b.met.breakerTrips.Inc()
	}
	if b.mode == FailOpen {
		if b.onOpen != nil {
			b.onOpen()
		}
		if b.gauge {
			b.met.fallbackActive.Set(1)
		}
		b.log.Warn("ratelimit: redis unreachable, enforcing "+b.what+" per replica",
			"failures", failures, "failing_for", now.Sub(since).Round(time.Millisecond), "err", err)
	} else {
		b.log.Error("ratelimit: redis unreachable, refusing "+b.what+" decisions until it is back",
			"failures", failures, "failing_for", now.Sub(since).Round(time.Millisecond), "err", err)
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// run probes Redis while the breaker is open, until ctx is done.
func (b *breaker) run(ctx context.Context) {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.settle()
			return
		case <-b.kick:
		case <-t.C:
		}
		if !b.open.Load() {
			continue
		}
		b.settle()
		pctx, cancel := context.WithTimeout(ctx, b.timeout)
		err := b.probe(pctx)
		cancel()
		if err != nil {
			continue
		}
		b.mu.Lock()
		b.settleLocked()
		since := b.since
		b.since = time.Time{}
		b.failures, b.failingSince = 0, time.Time{}
		b.failing.Store(false)
		b.open.Store(false)
		b.mu.Unlock()
		if b.mode == FailOpen && b.gauge {
			b.met.fallbackActive.Set(0)
		}
		b.log.Info("ratelimit: redis reachable again, shared "+b.what+" resumed", "after", b.now().Sub(since).Round(time.Millisecond))
	}
}

// settle adds the time spent open so far to fallback_seconds_total.
func (b *breaker) settle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleLocked()
}

func (b *breaker) settleLocked() {
	if !b.gauge || b.mode != FailOpen || b.since.IsZero() {
		return
	}
	now := b.now()
	if d := now.Sub(b.since); d > 0 {
		b.met.fallbackSeconds.Add(d.Seconds())
	}
	b.since = now
}

// fallback decides without Redis (fail-open) for a request whose round trip
// failed and for all while the breaker is open, within the README's bound
// ("Failure modes"): with R left in a window at the last shared verdict this
// replica got and N live replicas, it admits at most ⌊R/N⌋ more until the
// period has passed since (that count has slid out by then); after that, and
// for keys without such a verdict, max(1, ⌊L/N⌋) per window. A known ban
// holds; strikes count locally. Local admissions reach the shared windows
// with the key's next round trip (input.add); an admission's Remaining
// counts down from the last shared verdict (countDown).
type fallback struct {
	seed        maphash.Seed
	shards      [memShards]fallbackShard
	maxPerShard int
	live        func() int64 // live replica count

	// pendingKeys counts entries with pending admissions, raised before one's
	// pending leaves zero, lowered after it returns (or the entry goes), under
	// the shard lock: never low, so at zero takePending skips lock and lookup.
	pendingKeys atomic.Int64
}

type fallbackShard struct {
	mu   sync.Mutex
	keys map[string]*fallbackEntry
}

// fallbackEntry is what the replica knows of one key.
type fallbackEntry struct {
	pl        *plan   // the plan of the last shared verdict
	at        int64   // when that verdict's round trip began (local µs); 0: none
	remaining []int64 // per window of pl, what the verdict left (leases counted whole)
	banUntil  int64   // local µs
	pending   int64   // local admissions not yet added to the shared windows
	expires   int64   // local µs: nothing here matters after it

	state  *keyState // local decisions since seeded
	seeded int64     // the at the state was seeded from
	taken  []taken   // what seeding took, at seeded, to stand for others' admissions
}

// taken is the part of a window's local limit that seeding took.
type taken struct {
	ring string
	n    int64
}

func newFallback(size int, live func() int64) *fallback {
	f := &fallback{seed: maphash.MakeSeed(), maxPerShard: max(size/memShards, 1), live: live}
	for i := range f.shards {
		f.shards[i].keys = make(map[string]*fallbackEntry)
	}
	return f
}

func (f *fallback) shard(key string) *fallbackShard {
	return &f.shards[maphash.String(f.seed, key)%memShards]
}

// remember records Redis's verdict v from a round trip begun at start
// (local µs). v's remaining must be Redis's own (leases counted whole).
func (f *fallback) remember(key string, pl *plan, start int64, v *verdict) {
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		if len(sh.keys) >= f.maxPerShard {
			return
		}
		e = &fallbackEntry{}
		sh.keys[key] = e
	}
	e.pl, e.at = pl, start
	// Local decisions since the last shared verdict are superseded by this
	// one (decide seeds afresh from it): their rings go now, not with the
	// entry a day later, so an outage leaves no memory behind. Rings still
	// holding admissions for the next round trip (takePending) stay.
	if e.pending == 0 {
		e.state, e.taken = nil, nil
	}
	e.remaining = e.remaining[:0]
	for _, w := range v.win {
		e.remaining = append(e.remaining, w.remaining)
	}
	e.banUntil = 0
	if v.banUntil > 0 {
		e.banUntil = start + v.banUntil - v.now
	}
	longest := pl.windows[len(pl.windows)-1].period
	e.expires = max(e.expires, start+longest, e.banUntil)
}

// takePending returns, per window, the local admissions counted at now (local
// µs) for the next round trip, and how many that covers (restorePending).
func (f *fallback) takePending(key string, pl *plan, now int64) ([]int64, int64) {
	if f.pendingKeys.Load() == 0 {
		return nil, 0
	}
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil || e.pending == 0 || e.state == nil {
		return nil, 0
	}
	adds := make([]int64, len(pl.windows))
	for i := range pl.windows {
		r := &pl.windows[i]
		s := e.state.windows[r.name]
		if s == nil {
			continue
		}
		b := s.bucket(r, now)
		s.advance(r, b)
		used, from := s.used(r, now, b)
		for _, tk := range e.taken {
			if tk.ring == r.name && e.seeded/r.gran >= from {
				used -= tk.n // seeding's stand-in for others, still counted
			}
		}
		adds[i] = min(max(used, 0), e.pending)
	}
	p := e.pending
	e.pending = 0
	f.pendingKeys.Add(-1)
	return adds, p
}

// restorePending gives back admissions whose round trip failed.
func (f *fallback) restorePending(key string, n int64) {
	if n == 0 {
		return
	}
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		if e.pending == 0 {
			f.pendingKeys.Add(1)
		}
		e.pending += n
	}
}

// decide evaluates one request for key under pl at now (local µs).
func (f *fallback) decide(key string, pl *plan, now int64, in input) verdict {
	n := max(f.live(), 1)
	lp := pl.localFor(n)
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, kept := sh.keys[key]
	if e == nil {
		e = &fallbackEntry{}
		if len(sh.keys) < f.maxPerShard && !in.peek {
			sh.keys[key], kept = e, true
		}
	}
	if e.state == nil || e.seeded != e.at {
		e.state, e.taken = e.seedState(pl, lp, now, n)
		e.seeded = e.at
	}
	v := e.state.decide(lp, now, in)
	if !in.peek {
		if v.outcome == Allowed {
			if e.pending == 0 && kept {
				f.pendingKeys.Add(1)
			}
			e.pending++
		}
		e.expires = max(e.expires, e.state.expires)
	}
	if v.outcome == Allowed {
		e.countDown(pl, now, &v)
	}
	return v
}

// seedState continues from the last shared verdict: in each window within its
// period, what ⌊R/N⌋ leaves of the local limit is taken at the verdict's time.
func (e *fallbackEntry) seedState(pl, lp *plan, now, n int64) (*keyState, []taken) {
	st := &keyState{}
	var tk []taken
	if e.at == 0 || e.pl != pl {
		return st, nil
	}
	for i := range lp.windows {
		r := &lp.windows[i]
		if now-e.at >= r.period || i >= len(e.remaining) {
			continue
		}
		share := min(r.limit, e.remaining[i]/n)
		if n := r.limit - share; n > 0 {
			s, _ := st.ringFor(r, true)
			b := s.bucket(r, e.at)
			s.advance(r, b)
			s.add(r, b, e.at, n)
			tk = append(tk, taken{ring: r.name, n: n})
		}
	}
	if lp.ban.on && e.banUntil > now {
		st.ban.until = e.banUntil
	}
	return st, tk
}

// countDown sets an admission's Remaining, in each window still within its
// period of the last shared verdict, to R less pending (all admitted after),
// as a lease counts down: short by what replicas held unspent then, over by
// what others admitted since, never above L. Others keep the local figure.
func (e *fallbackEntry) countDown(pl *plan, now int64, v *verdict) {
	if e.at == 0 || e.pl != pl {
		return
	}
	for i := range pl.windows {
		if now-e.at >= pl.windows[i].period || i >= len(e.remaining) || i >= len(v.win) {
			continue
		}
		v.win[i].remaining = max(e.remaining[i]-e.pending, 0)
	}
}

func (f *fallback) sweep(now int64) {
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			if e.expires <= now {
				f.drop(sh, k, e)
			}
		}
		sh.mu.Unlock()
	}
}

// forget drops key, pending admissions included (Reset).
func (f *fallback) forget(key string) {
	sh := f.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		f.drop(sh, key, e)
	}
	sh.mu.Unlock()
}

// drop deletes key's entry e; the caller holds sh's lock.
func (f *fallback) drop(sh *fallbackShard, key string, e *fallbackEntry) {
	delete(sh.keys, key)
	if e.pending > 0 {
		f.pendingKeys.Add(-1)
	}
}

func (f *fallback) unban(key string) {
	sh := f.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		e.banUntil = 0
		if e.state != nil {
			e.state.ban, e.state.cban = banState{}, banState{}
		}
	}
	sh.mu.Unlock()
}

// localPlan is a plan's fallback for one live replica count.
type localPlan struct {
	n  int64
	pl *plan
}

// localFor returns the plan one of n replicas enforces alone: each limit
// max(1, ⌊L/n⌋), the same ban rules and geometry.
func (pl *plan) localFor(n int64) *plan {
	if lp := pl.local.Load(); lp != nil && lp.n == n {
		return lp.pl
	}
	p := pl.policy
	p.Windows = append([]Window(nil), p.Windows...)
	for i, w := range p.Windows {
		p.Windows[i].Limit = max(1, w.Limit/n)
	}
	lp := compile(p, pl.buckets, pl.strikeBuckets)
	lp.counters = pl.counters
	pl.local.Store(&localPlan{n: n, pl: lp})
	return lp
}

// probeRedis is a breaker's probe: Redis takes a write and every primary
// has room (memory.full). A Redis that answers PING or SCRIPT LOAD may still
// refuse every decision: full under noeviction (OOM), short of replicas
// (min-replicas-to-write), unable to save (MISCONF). Were it counted as
// back, the breaker would close at each probe and trip again a TripAfter
// later.
func probeRedis(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
	if err := rdb.Set(ctx, prefix+probeSuffix, "", time.Second).Err(); err != nil {
		return err
	}
	return eachPrimary(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		if m := readMemory(ctx, c); m.full() {
			return fmt.Errorf("ratelimit: Redis is full: %d of its maxmemory %d bytes used, under noeviction", m.used, m.maxmemory)
		}
		return nil
	})
}

// probeSuffix names the key probeRedis writes; it lives a second.
const probeSuffix = "{replicas}:probe"
