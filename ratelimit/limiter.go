package ratelimit

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

// Limiter decides whether requests for a key are within its Policy. With a
// Redis client every replica shares the counts; without one the limiter
// keeps them in this process.
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

// New returns a Limiter sharing state through client, or a purely local
// one when client is nil. It does not wait for Redis: the script is loaded
// in the background, and an unreachable Redis is handled like any outage,
// by the failure mode, until it answers.
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
	// Everything the background goroutines read is built before the first
	// of them starts.
	if opts.CacheSize > 0 {
		l.cache = newRejectCache(opts.CacheSize)
	}
	l.replicas = newReplicas(client, opts.Prefix, opts.Replicas, opts.FinalizeAfter, met, opts.Logger)
	l.reg = newRegistry(client, opts.Prefix)
	if opts.MaxLease > 1 {
		l.lease = newLeaseTable(opts.MaxLease, l.replicas.live)
		l.lease.prefix = opts.Prefix
		l.lease.fleet, l.lease.forceCoarse = l.replicas, h.blocks
		l.back = newGiveBacks(client, opts.Prefix, opts.Logger, func() bool { return l.breaker.isOpen() })
		l.lease.back = l.back.add
		if h.inStep {
			l.lease.back = func(g giveBack) { l.back.sendBatch(context.Background(), max(opts.Timeout, 100*time.Millisecond), g) }
		}
	}
	l.fb = newFallback(fallbackSize, l.replicas.live)
	l.breaker = &breaker{
		what: "rate limits", mode: opts.FailureMode, log: opts.Logger, met: met, gauge: true,
		now:      func() time.Time { return l.now() },
		probe:    func(ctx context.Context) error { return client.ScriptLoad(ctx, decideLua).Err() },
		interval: opts.ProbeInterval, timeout: max(opts.Timeout, 100*time.Millisecond),
		tripAfter: opts.TripAfter,
		kick:      make(chan struct{}, 1),
	}
	// The breaker hears from the pipelines, which time a round trip from
	// when it is sent: a decision that waited in the queue is not a Redis
	// failure.
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

	// Preload the decision code without holding up the caller: an
	// unreachable Redis at start is an outage like any other. (A server
	// without Functions is found out by the first batch.)
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

// Close stops the limiter's background work. It does not close the
// client, and it does not wait for a round trip stuck on an unresponsive
// Redis longer than a second: closing the client ends those.
func (l *Limiter) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		l.cancel()
		waitBounded(&l.wg, time.Second)
		// A replica going away lets its leases and blocks go and
		// gives back what they leave unspent, within a second; what it
		// cannot give back stays counted in Redis until it slides out.
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
// It returns an error only for an invalid policy, ErrUnavailable in
// fail-closed mode when Redis cannot answer within the timeout, or ctx's
// error when ctx ends while the decision waits for Redis (nothing is
// decided for the request then; a call already sent still counts in
// Redis, as any admission whose answer was lost). Under a
// shadow policy the decision is made and recorded the same way and marked
// Shadow: the caller serves the request whatever its outcome.
func (l *Limiter) Allow(ctx context.Context, key string, p Policy) (Decision, error) {
	var d Decision
	err := l.allow(ctx, key, &p, &d)
	d.Shadow = p.Shadow
	return d, err
}

// allow decides into d. Each step of a request is a function of its own,
// and each fills the caller's d rather than returning a Decision to copy:
// a request its lease serves (most of a busy key's) then runs within the
// stack the handler chain has without a limiter (see planCache.get).
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

// allowLocal decides key in this process alone, through the local
// decider: a limiter without Redis.
func (l *Limiter) allowLocal(key string, pl *plan, d *Decision) {
	v := l.local.one(request{key: key, pl: pl, in: input{lease: noLease}})
	l.finish(pl, &v, false, d)
}

// allowShared answers from what this replica holds for key (the rejection
// cache, a lease) or else makes a round trip.
//
// No request waits for Redis longer than Options.Timeout in all, whether
// for a lease another request is fetching or for its own round trip,
// but for one more Timeout when that round trip fails (sendAgain). A
// request finding a lease round trip for its key in flight waits for it
// once (its lease is likely to cover this request too, and if it finds
// the key limited, the rejection cache answers), then looks again from
// the top with what is left of its Timeout.
func (l *Limiter) allowShared(ctx context.Context, key string, pl *plan, start time.Time, d *Decision) error {
	first := true
	// entered is when the request's wait began; zero while it has not
	// waited: it then has the whole Timeout, with no clock read for it.
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
		// Rejections answered locally must reach Redis as strikes: a
		// request carrying them makes the round trip. Candidate windows
		// evaluate every request: no leases for their keys.
		ask := noLease
		var names []string
		if l.lease != nil && extra == 0 && len(pl.candidates) == 0 {
			served, a, wait, ns := l.lease.take(key, pl, start, first, d)
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
			ask, names = a, ns
		}
		budget := l.opts.Timeout
		if !entered.IsZero() {
			budget -= time.Since(entered)
		}
		if pl.blk != nil && extra == 0 && ask == noLease && l.lease != nil && l.blocksOn() {
			return l.blockTrip(ctx, key, pl, start, budget, names, d)
		}
		return l.roundTrip(ctx, key, pl, start, extra, ask, budget, names, d)
	}
}

// awaitLease waits, at most Timeout, for the lease round trip in flight
// that closes wait.
func (l *Limiter) awaitLease(ctx context.Context, wait <-chan struct{}) {
	t := time.NewTimer(l.opts.Timeout)
	defer t.Stop()
	select {
	case <-wait:
	case <-t.C:
	case <-ctx.Done():
	}
}

// roundTrip decides key in Redis within budget, asking for a lease as ask
// says, and keeps the lease granted. Its steps fill the caller's d and
// its own verdict by pointer, as allow's do: a request that makes a round
// trip then waits for Redis within the stack a keep-alive connection
// settles at (TestRoundTripRequestFitsTheConnectionStack in httpapi).
func (l *Limiter) roundTrip(ctx context.Context, key string, pl *plan, start time.Time, extra int64, ask leaseAsk, budget time.Duration, names []string, d *Decision) error {
	var v verdict
	err := l.decide(ctx, key, pl, start, extra, ask, budget, names, d, &v, nil)
	if ask.want > 1 {
		l.lease.done(key, pl, start, &v, d, err == nil && !d.Degraded)
	}
	return err
}

// decide asks Redis, or the fallback when it cannot answer, and fills d
// and, when Redis answered, v. names are the key's record names under pl
// when the caller has them (the lease table keeps them), nil otherwise.
//
// With blk, the round trip also asks for a block for the key's next
// requests (blocks.go), and the lease table keeps what Redis granted.
func (l *Limiter) decide(ctx context.Context, key string, pl *plan, start time.Time, extra int64, ask leaseAsk, budget time.Duration, names []string, d *Decision, v *verdict, blk *blockAsk) error {
	if l.breaker.isOpen() || budget <= 0 {
		return l.degraded(key, pl, start, extra, d)
	}
	if cerr := ctx.Err(); cerr != nil && extra == 0 {
		// A caller already gone is not sent: nothing counts for it. (One
		// carrying strikes is: those must reach Redis.)
		*d = Decision{}
		return cerr
	}
	// Admissions this replica made without Redis travel with the key's
	// next round trip.
	add, pending := l.fb.takePending(key, pl, start.UnixMicro())
	sd := l.reg.seeding(pl)
	cp := l.callPlan(pl)
	if cp.coarse == nil {
		// Blocks went out of force since the caller looked: a block
		// needs the coarse records.
		blk = nil
	}
	// (Names taken before blocks came into force or went out of it, a
	// heartbeat in between, are another plan's: a plan with coarse
	// records has more.)
	if names == nil || len(names) != cp.keyCount() {
		names = stateKeys(l.opts.Prefix, key, cp)
	}
	dec := decision{keys: seedKeys(l.opts.Prefix, key, sd, names), pl: cp,
		nums: scriptNums(pl, input{extra: extra, add: add, lease: ask, seed: sd, block: blk})}
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
	// A lease or a block is counted whole, but the rest of it is this
	// process's to grant.
	l.answered(key, pl, start, v, max(v.granted-1, 0), d)
	if blk != nil {
		l.lease.blocked(key, pl, start, v, d)
	}
	if v.newBan && cp != pl {
		l.announceBan(key)
	}
	return nil
}

// sendAgain reports whether a decision whose round trip failed with err
// is sent once more, with a Timeout of its own: a Redis blip (a pause, a
// slow round trip on a busy machine, a connection reset) then costs the
// request latency, at most a second Timeout, rather than a decision
// without Redis, which loosens the window by what replicas admit alone.
// If the first call reached Redis after all, the request counts twice in
// its windows, which only makes them stricter. Not sent again: a caller
// already gone, a replica whose breaker has tripped (Redis is down, not
// blipping), a decision that could not even be queued (sending more
// would only deepen the backlog), and a reply Redis did give.
func (l *Limiter) sendAgain(ctx context.Context, err error) bool {
	if l.hooks.sendOnce || ctx.Err() != nil || l.breaker.isOpen() || errors.Is(err, errOverloaded) {
		return false
	}
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// announceBan tells every replica that key was banned, so that each lets
// go of the key's block (blocks.go) and its next request learns of the
// ban from Redis: a block is spent without a round trip for up to
// blockLife, where a lease ends within leaseLife. Best effort, off the
// request's path: a replica that misses it learns of the ban when its
// block ends.
func (l *Limiter) announceBan(key string) {
	go func() {
		ctx, cancel := context.WithTimeout(l.ctx, max(l.opts.Timeout, 100*time.Millisecond))
		defer cancel()
		_ = l.rdb.Publish(ctx, l.opts.Prefix+"ban", key).Err()
	}()
}

// callPlan returns the plan a round trip for a request under pl is sent
// under (replicas.callPlan).
func (l *Limiter) callPlan(pl *plan) *plan { return l.replicas.callPlan(pl, l.hooks.blocks) }

// blocksOn reports whether blocks are in force on this replica (blocks.go,
// finalize.go): slow keys then take blocks.
func (l *Limiter) blocksOn() bool { return l.hooks.blocks || l.replicas.grantsBlocks() }

// readsCoarse reports whether this replica's round trips read coarse
// records: blocks are in force, or may be spent elsewhere still.
func (l *Limiter) readsCoarse() bool { return l.hooks.blocks || l.replicas.readsCoarse() }

// failedTrip answers a request whose round trip failed or went unanswered
// in time.
func (l *Limiter) failedTrip(ctx context.Context, key string, pl *plan, start time.Time, extra int64, d *Decision) error {
	if l.cache != nil {
		l.cache.abandon(key)
	}
	if cerr := ctx.Err(); cerr != nil {
		// The caller gave up (a client that went away): nobody reads
		// a decision, and one made without Redis would count the
		// request here as well as in Redis (which its call may still
		// reach) and tell the metrics that Redis failed.
		*d = Decision{}
		return cerr
	}
	// This request alone is decided without Redis; whether Redis is
	// down is the breaker's to judge, from the pipelines.
	return l.degraded(key, pl, start, extra, d)
}

// answered turns v, Redis's verdict for key from a round trip that began
// at start, into d. The fallback remembers Redis's own counts; then the
// admissions that round trip counted and this process holds to grant (a
// lease's or a block's rest) are added back to the Remaining of every
// window, so that it reads as if each request had gone to Redis alone.
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

// finish turns a verdict into the Decision d (decisionOf) and counts it.
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

// decisionOf states verdict v in terms of pl's windows in d (also for a
// verdict of the fallback plan, whose windows are the same with smaller
// limits).
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

// subscribeLoop drops cached bans that another process lifted, the
// leases and blocks of keys it reset, and the blocks of keys it
// banned (announceBan).
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
				// The key's counts stand: what its lease or block leaves
				// unspent is given back.
				if l.lease != nil {
					l.lease.letGo(m.Payload)
				}
				continue
			}
			if l.cache != nil {
				l.cache.forget(m.Payload)
			}
			l.fb.unban(m.Payload)
			// After a Reset the key's counts are gone: a lease or a
			// block held here would admit uncounted until it ends.
			if l.lease != nil {
				l.lease.forget(m.Payload)
			}
		}
	}
}

// sweepLoop drops state of idle keys held in memory.
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

// sweep drops the state of keys idle at now and reports how full the
// lease table is.
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
