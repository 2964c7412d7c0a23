package ratelimit

// Allow's order: plan cache -> rejection cache -> grants (a lease or block
// held here) -> batcher -> decider; without Redis, the local decider. In
// decide the breaker and fallback wrap the decider: an open breaker or spent
// budget goes to the fallback (ErrUnavailable when fail-closed); a failed
// round trip is sent once more (sendAgain), then falls back.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter decides whether requests for a key are within its Policy, with
// counts shared through Redis or, without a client, kept in this process.
type Limiter struct {
	rdb   redis.UniversalClient
	opts  Options
	hooks hooks
	log   *slog.Logger
	met   *metrics
	plans planCache
	local *localDecider // the decider without Redis
	fb    *fallback     // decisions without Redis when it has one
	cache *rejectCache
	lease *leaseTable // nil when leasing is off
	back  *giveBacks  // what leases leave unspent, sent back; nil when leasing is off
	batch *batcher
	now   func() time.Time

	breaker  *breaker
	replicas *replicas
	reg      *registry // nil without Redis

	ctx    context.Context // the background work's, until Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

// New returns a Limiter sharing state through client, or a local one when
// client is nil. It does not wait for Redis: an unreachable one is an outage.
func New(client redis.UniversalClient, opts Options) (*Limiter, error) {
	return newLimiter(client, opts, hooks{})
}

func newLimiter(client redis.UniversalClient, opts Options, h hooks) (*Limiter, error) {
	if h.clock == nil {
		h.clock = time.Now
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: register metrics: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Limiter{
		rdb:    client,
		opts:   opts,
		hooks:  h,
		log:    opts.Logger,
		met:    met,
		plans:  newPlanCache(),
		now:    h.clock,
		ctx:    ctx,
		cancel: cancel,
	}
	l.local = newLocalDecider(l.now)
	if client == nil {
		if !h.inStep {
			l.goBackground(ctx, l.sweepLoop)
		}
		return l, nil
	}
	// Build all that background goroutines read before starting the first.
	if opts.CacheSize > 0 {
		l.cache = newRejectCache(opts.CacheSize)
	}
	l.replicas = newReplicas(client, opts.Prefix, opts.Replicas, opts.FinalizeAfter, met, opts.Logger)
	l.reg = newRegistry(client, opts.Prefix)
	if opts.MaxLease > 1 {
		l.lease = newLeaseTable(opts.MaxLease, l.replicas.live)
		l.back = newGiveBacks(client, opts.Prefix, opts.Logger, func() bool { return l.breaker.isOpen() })
		l.lease.back = l.back.add
		if h.inStep {
			l.lease.back = func(g giveBack) { l.back.sendBatch(context.Background(), max(opts.Timeout, 100*time.Millisecond), g) }
		}
	}
	l.fb = newFallback(fallbackSize, l.replicas.live)
	l.breaker = &breaker{
		what: "rate limits", mode: opts.FailureMode, log: opts.Logger, met: met, gauge: true,
		now: func() time.Time { return l.now() },
		probe: func(ctx context.Context) error {
			if err := client.ScriptLoad(ctx, decideLua).Err(); err != nil {
				return err
			}
			return probeRedis(ctx, client, opts.Prefix)
		},
		interval: opts.ProbeInterval, timeout: max(opts.Timeout, 100*time.Millisecond),
		tripAfter: opts.TripAfter,
		kick:      make(chan struct{}, 1),
	}
	// Round trips are timed from the send: time queued is no Redis failure.
	l.batch = newBatcher(newRedisDecider(client, opts.Prefix, opts.Logger), opts.Timeout, opts.PipelineHold, func(d time.Duration, err error) {
		met.observeRedis(d, err)
		if err != nil {
			l.breaker.failed(err)
		} else {
			l.breaker.succeeded()
		}
	}, func(d time.Duration) { met.queueWait.Observe(d.Seconds()) })
	l.batch.dec.finalized = l.replicas.finalized
	for range opts.Pipelines {
		l.goBackground(ctx, l.batch.run)
	}
	if !h.inStep {
		l.goBackground(ctx, l.sweepLoop)
	}
	l.goBackground(ctx, l.breaker.run)
	if l.back != nil {
		l.goBackground(ctx, func(ctx context.Context) { l.back.run(ctx, max(opts.Timeout, 100*time.Millisecond)) })
	}
	if !h.noHeartbeat && !opts.Admin {
		l.goBackground(ctx, func(ctx context.Context) { l.replicas.run(ctx, max(opts.Timeout, 100*time.Millisecond)) })
		l.goBackground(ctx, func(ctx context.Context) {
			l.reg.run(ctx, max(opts.Timeout, 100*time.Millisecond), func() []*plan { return l.plans.recent(l.now()) })
		})
	}
	l.goBackground(ctx, l.subscribeLoop)

	// A server without Functions is found out by the first batch.
	l.goBackground(ctx, func(ctx context.Context) {
		lctx, cancel := context.WithTimeout(ctx, max(opts.Timeout, time.Second))
		defer cancel()
		if err := client.ScriptLoad(lctx, decideLua).Err(); err != nil && ctx.Err() == nil {
			l.log.Warn("ratelimit: cannot load the decision script yet", "err", err)
		}
		_ = l.batch.dec.loadFunction(lctx)
	})
	return l, nil
}

func (l *Limiter) goBackground(ctx context.Context, f func(context.Context)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(ctx)
	}()
}

// Close stops the background work, waiting at most a second: closing the
// client, which Close leaves open, ends round trips stuck on Redis.
func (l *Limiter) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		l.cancel()
		waitBounded(&l.wg, time.Second)
		// What cannot be given back stays counted until it slides out.
		if l.lease != nil {
			if unspent := l.lease.release(); unspent > 0 {
				l.back.flush(min(max(l.opts.Timeout, 100*time.Millisecond), time.Second))
				l.log.Info("ratelimit: closed; leases and blocks let go", "unspent", unspent)
			}
		}
	}
	return nil
}

func waitBounded(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// Allow decides one request for key under p and records it when admitted.
// It fails only for an invalid policy, ErrUnavailable (fail-closed, Redis
// not answering in time), or ctx's error if ctx ends while the decision
// waits (a call already sent still counts). Shadow decisions count alike.
func (l *Limiter) Allow(ctx context.Context, key string, p Policy) (Decision, error) {
	var d Decision
	err := l.allow(ctx, key, &p, &d)
	d.Shadow = p.Shadow
	return d, err
}

// allow and its steps fill the caller's d, not return a Decision: a request
// its lease serves then fits the stack it has with no limiter (planCache.get).
func (l *Limiter) allow(ctx context.Context, key string, p *Policy, d *Decision) error {
	pl, err := l.plans.get(p, &l.opts, l.met)
	if err != nil {
		return err
	}
	start := l.now()
	pl.touch(start)
	if l.rdb == nil {
		l.allowLocal(key, pl, d)
		return nil
	}
	return l.allowShared(ctx, key, pl, start, d)
}

func (l *Limiter) allowLocal(key string, pl *plan, d *Decision) {
	v := l.local.one(request{key: key, pl: pl, in: input{lease: noLease}})
	l.finish(pl, &v, false, d)
}

// allowShared answers from what this replica holds for key or makes a round
// trip, waiting for Redis at most Timeout in all (plus one if the trip fails:
// sendAgain). Finding its key's lease round trip in flight, it waits once
// (that lease likely covers it, or the cache answers), then looks again.
func (l *Limiter) allowShared(ctx context.Context, key string, pl *plan, start time.Time, d *Decision) error {
	first := true
	// entered is when the wait began; zero (no clock read) until then.
	var entered time.Time
	for {
		var extra int64
		if l.cache != nil {
			pending, hit := l.cache.answer(key, pl, start, d)
			if hit {
				pl.outcome[d.Outcome].Inc()
				return nil
			}
			extra = pending
		}
		// No lease while local rejections (extra) must reach Redis as strikes,
		// nor for candidate windows, which must see every request.
		ask := noLease
		if l.lease != nil && extra == 0 && len(pl.candidates) == 0 {
			served, a, wait := l.lease.take(key, pl, start, first, d)
			if served {
				pl.outcome[Allowed].Inc()
				pl.leased.Inc()
				pl.countNearLimit(d)
				return nil
			}
			if wait != nil {
				entered = time.Now()
				l.awaitLease(ctx, wait)
				first, start = false, l.now()
				continue
			}
			ask = a
		}
		budget := l.opts.Timeout
		if !entered.IsZero() {
			budget -= time.Since(entered)
		}
		if pl.blk != nil && extra == 0 && ask == noLease && l.lease != nil && l.blocksOn() {
			return l.blockTrip(ctx, key, pl, start, budget, d)
		}
		return l.roundTrip(ctx, key, pl, start, extra, ask, budget, d)
	}
}

func (l *Limiter) awaitLease(ctx context.Context, wait <-chan struct{}) {
	t := time.NewTimer(l.opts.Timeout)
	defer t.Stop()
	select {
	case <-wait:
	case <-t.C:
	case <-ctx.Done():
	}
}

// roundTrip decides key in Redis, asking a lease as ask says, and keeps it.
// v goes by pointer for stack (TestRoundTripRequestFitsTheConnectionStack).
func (l *Limiter) roundTrip(ctx context.Context, key string, pl *plan, start time.Time, extra int64, ask leaseAsk, budget time.Duration, d *Decision) error {
	var v verdict
	err := l.decide(ctx, key, pl, start, extra, ask, budget, d, &v, nil)
	if ask.want > 1 {
		l.lease.done(key, pl, start, &v, d, err == nil && !d.Degraded)
	}
	return err
}

// blockTrip decides a slow key's request, asking for a block when its last
// round trip showed demand (apart, so that allowShared's frame stays small).
func (l *Limiter) blockTrip(ctx context.Context, key string, pl *plan, start time.Time, budget time.Duration, d *Decision) error {
	var v verdict
	var ask *blockAsk
	rtt := l.lease.rtt.Load()
	most, warm, born := l.lease.askBlock(key, pl, start, rtt)
	asking := most > 0
	if asking {
		ask = &blockAsk{max: most, replicas: max(l.replicas.live(), 1), rtt: rtt}
	}
	err := l.decide(ctx, key, pl, start, 0, noLease, budget, d, &v, ask)
	if err == nil && !d.Degraded {
		l.lease.blocked(key, pl, start, &v, d)
	}
	// Only a change is written: most cold keys keep showing no demand.
	if demand := err == nil && l.lease.demands(pl, d, start, born); demand != warm || asking {
		l.lease.noteDemand(key, demand, asking)
	}
	return err
}

// decide asks Redis, or the fallback when it cannot answer, and fills d (and
// v when Redis answered). With blk it also asks a block (lease.go); the
// caller keeps what is granted.
func (l *Limiter) decide(ctx context.Context, key string, pl *plan, start time.Time, extra int64, ask leaseAsk, budget time.Duration, d *Decision, v *verdict, blk *blockAsk) error {
	if l.breaker.isOpen() || budget <= 0 {
		return l.degraded(key, pl, start, extra, d)
	}
	if cerr := ctx.Err(); cerr != nil && extra == 0 {
		// A caller already gone is not sent, unless it carries strikes.
		*d = Decision{}
		return cerr
	}
	add, pending := l.fb.takePending(key, pl, start.UnixMicro())
	sd := l.reg.seeding(pl)
	cp := l.callPlan(pl)
	if cp.coarse == nil || sd != nil {
		// No block while an edit spreads, or with blocks gone out of force
		// since the caller looked.
		blk = nil
	}
	dec := l.batch.dec.pack(key, cp, input{extra: extra, add: add, lease: ask, seed: sd, block: blk})
	reply, err := l.batch.do(ctx, dec, budget)
	if err != nil && l.sendAgain(ctx, err) {
		l.met.sentAgain.Inc()
		reply, err = l.batch.do(ctx, dec, l.opts.Timeout)
	}
	if err == nil {
		err = decodeInto(pl, reply, v)
	}
	if err != nil {
		*v = verdict{}
		l.fb.restorePending(key, pending)
		return l.failedTrip(ctx, key, pl, start, extra, d)
	}
	l.answered(key, pl, start, v, max(v.granted-1, 0), d)
	if v.newBan && cp != pl {
		l.announceBan(key)
	}
	return nil
}

// sendAgain reports whether a failed round trip is sent once more, with its
// own Timeout: a blip then costs latency, not a looser decision without
// Redis. If the first call did reach Redis, the request counts twice: only
// stricter. Not sent again: a caller gone, an open breaker (Redis is down),
// a decision never queued (it would deepen the backlog), a Redis reply.
func (l *Limiter) sendAgain(ctx context.Context, err error) bool {
	if l.hooks.sendOnce || ctx.Err() != nil || l.breaker.isOpen() || errors.Is(err, errOverloaded) {
		return false
	}
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// announceBan tells every replica key was banned, so each drops its block
// (spent without round trips for blockLife). Best effort: blocks end anyway.
func (l *Limiter) announceBan(key string) {
	go func() {
		ctx, cancel := context.WithTimeout(l.ctx, max(l.opts.Timeout, 100*time.Millisecond))
		defer cancel()
		_ = l.rdb.Publish(ctx, l.opts.Prefix+"ban", key).Err()
	}()
}

func (l *Limiter) callPlan(pl *plan) *plan { return l.replicas.callPlan(pl, l.hooks.blocks) }

// blocksOn reports whether blocks are in force here: slow keys take them.
func (l *Limiter) blocksOn() bool { return l.hooks.blocks || l.replicas.grantsBlocks() }

func (l *Limiter) failedTrip(ctx context.Context, key string, pl *plan, start time.Time, extra int64, d *Decision) error {
	if l.cache != nil {
		l.cache.abandon(key)
	}
	if cerr := ctx.Err(); cerr != nil {
		// A local decision would count the request twice (its call may
		// still reach Redis) and blame Redis in the metrics.
		*d = Decision{}
		return cerr
	}
	// Whether Redis is down is the breaker's to judge, from the pipelines.
	return l.degraded(key, pl, start, extra, d)
}

// answered turns Redis's verdict v into d. The fallback keeps Redis's own
// counts; held (a lease's or block's rest, counted but granted here) is
// added back to each Remaining, as if each request went to Redis alone.
func (l *Limiter) answered(key string, pl *plan, start time.Time, v *verdict, held int64, d *Decision) {
	l.fb.remember(key, pl, start.UnixMicro(), v)
	if l.lease != nil {
		l.lease.observe(l.now().Sub(start))
	}
	for i := range v.win {
		v.win[i].remaining += held
	}
	l.finish(pl, v, false, d)
	if l.cache != nil {
		l.cache.store(key, pl, d, v.strikes, start)
	}
}

// degraded decides into d without Redis according to the failure mode.
func (l *Limiter) degraded(key string, pl *plan, start time.Time, extra int64, d *Decision) error {
	if l.opts.FailureMode == FailClosed {
		*d = Decision{}
		return ErrUnavailable
	}
	v := l.fb.decide(key, pl, start.UnixMicro(), input{extra: extra, lease: noLease})
	pl.localOutcome[v.outcome].Inc()
	l.finish(pl, &v, true, d)
	return nil
}

func (l *Limiter) finish(pl *plan, v *verdict, degraded bool, d *Decision) {
	decisionOf(pl, v, d)
	d.Degraded = degraded
	pl.outcome[d.Outcome].Inc()
	pl.countNearLimit(d)
	if v.newBan {
		pl.banned.Inc()
	}
	if len(pl.candidates) > 0 {
		pl.candidate[Allowed].Add(float64(v.cAdm))
		pl.candidate[Limited].Add(float64(v.cLim))
		pl.candidate[Banned].Add(float64(v.cBan))
		if v.cNewBan {
			pl.candidateBanned.Inc()
		}
	}
}

// decisionOf states v in pl's windows (a fallback plan's too: same windows).
func decisionOf(pl *plan, v *verdict, d *Decision) {
	*d = Decision{
		Outcome:    v.outcome,
		Windows:    make([]WindowState, len(pl.policy.Windows)),
		RetryAfter: time.Duration(v.retry) * time.Microsecond,
		Shadow:     pl.policy.Shadow,
		Time:       time.UnixMicro(v.now),
	}
	for i, w := range pl.policy.Windows {
		d.Windows[i] = WindowState{Window: w, Remaining: v.win[i].remaining, Reset: time.UnixMicro(v.win[i].reset)}
		// Windows are ordered by period, so <= prefers the longer on a tie.
		if d.Windows[i].Remaining <= d.Windows[d.Binding].Remaining {
			d.Binding = i
		}
	}
	if len(pl.candidates) > 0 {
		d.Candidate = make([]WindowState, len(pl.candidates))
		for i, w := range pl.policy.Candidate {
			d.Candidate[i] = WindowState{Window: w, Remaining: v.cwin[i].remaining, Reset: time.UnixMicro(v.cwin[i].reset)}
		}
		d.CandidateOutcome = v.cOutcome
	}
}

// subscribeLoop drops cached bans another process lifted, the leases and
// blocks of keys it reset, and the blocks of keys it banned (announceBan).
func (l *Limiter) subscribeLoop(ctx context.Context) {
	if l.cache == nil && l.lease == nil {
		return
	}
	banned := l.opts.Prefix + "ban"
	sub := l.rdb.Subscribe(ctx, l.opts.Prefix+"unban", banned)
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if m.Channel == banned {
				// The key's counts stand: its unspent grants go back.
				if l.lease != nil {
					l.lease.letGo(m.Payload)
				}
				continue
			}
			if l.cache != nil {
				l.cache.forget(m.Payload)
			}
			l.fb.unban(m.Payload)
			// After a Reset a grant held here would admit uncounted.
			if l.lease != nil {
				l.lease.forget(m.Payload)
			}
		}
	}
}

func (l *Limiter) sweepLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.sweep(l.now())
		}
	}
}

// sweep drops idle keys' state and reports how full the lease table is.
func (l *Limiter) sweep(now time.Time) {
	l.local.store.sweep(now.UnixMicro())
	if l.fb != nil {
		l.fb.sweep(now.UnixMicro())
	}
	if l.cache != nil {
		l.cache.sweep(now)
	}
	if l.lease != nil {
		l.met.trackedKeys.Set(float64(l.lease.sweep(now)))
		if n := l.lease.untracked.Swap(0); n > 0 {
			l.met.untracked.Add(float64(n))
		}
	}
}
