package ratelimit

// Throttle: GCRA per key, shared through Redis by redis_rate. While Redis is
// unreachable, each replica allows in process its 1/Replicas share of the
// rate and burst, rounded up (fail-open), or refuses (fail-closed); without
// a client, the whole limit is enforced in process.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// ThrottleLimit is a GCRA limit: Rate per Period on average, bursts of Burst.
type ThrottleLimit struct {
	Rate   int
	Burst  int
	Period time.Duration
}

func (t ThrottleLimit) validate() error {
	if t.Rate < 1 || t.Burst < 1 || t.Period < time.Millisecond {
		return fmt.Errorf("ratelimit: throttle %d/%s burst %d: rate and burst must be at least 1 and the period at least 1ms", t.Rate, t.Period, t.Burst)
	}
	return nil
}

// Throttle limits requests per client address (failed authentications and
// other unauthenticated requests), or per any key when named.
type Throttle struct {
	name    string // names its Redis keys and its metrics' plan label
	rl      *redis_rate.Limiter
	limit   ThrottleLimit
	local   *gcraStore
	llimit  ThrottleLimit // per replica while Redis is unreachable
	opts    Options
	count   counters
	breaker *breaker
	now     func() time.Time
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
}

// NewThrottle returns a Throttle sharing state through client, or local to
// this process when client is nil. Decisions are counted under plan "ip".
func NewThrottle(client redis.UniversalClient, limit ThrottleLimit, opts Options) (*Throttle, error) {
	return newThrottle(client, "ip", "address throttling", limit, opts, hooks{})
}

// NewNamedThrottle is NewThrottle with a budget of its own, its state under
// Options.Prefix+name+":{KEY}" and its decisions under plan name. name is a
// lowercase identifier (a-z, 0-9, '_' or '-'); NewThrottle's is "ip".
func NewNamedThrottle(client redis.UniversalClient, name string, limit ThrottleLimit, opts Options) (*Throttle, error) {
	if !throttleName(name) {
		return nil, fmt.Errorf("ratelimit: throttle name %q: want a lowercase identifier (a-z, 0-9, '_' or '-')", name)
	}
	return newThrottle(client, name, name+" throttling", limit, opts, hooks{})
}

// newThrottle builds a Throttle; what names it in the breaker's log lines.
func newThrottle(client redis.UniversalClient, name, what string, limit ThrottleLimit, opts Options, h hooks) (*Throttle, error) {
	if h.clock == nil {
		h.clock = time.Now
	}
	if err := limit.validate(); err != nil {
		return nil, err
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: register metrics: %w", err)
	}
	r := opts.Replicas
	t := &Throttle{
		name:   name,
		limit:  limit,
		local:  newGCRAStore(),
		llimit: ThrottleLimit{Rate: (limit.Rate + r - 1) / r, Burst: (limit.Burst + r - 1) / r, Period: limit.Period},
		opts:   opts,
		count:  met.forPlan(name, false),
		now:    h.clock,
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				t.local.sweep(t.now())
			}
		}
	}()
	if client == nil {
		t.llimit = limit
		return t, nil
	}
	t.rl = redis_rate.NewLimiter(client)
	t.breaker = &breaker{
		what: what, mode: opts.FailureMode, log: opts.Logger, met: met,
		now:      func() time.Time { return t.now() },
		probe:    func(ctx context.Context) error { return probeRedis(ctx, client, opts.Prefix) },
		onOpen:   t.local.reset,
		interval: opts.ProbeInterval, timeout: max(opts.Timeout, 100*time.Millisecond),
		tripAfter: opts.TripAfter,
		kick:      make(chan struct{}, 1),
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.breaker.run(ctx)
	}()
	return t, nil
}

// Close stops the throttle's background work, like Limiter.Close.
func (t *Throttle) Close() error {
	t.once.Do(func() {
		t.cancel()
		waitBounded(&t.wg, time.Second)
	})
	return nil
}

// Allow decides one request from key; its Decision has one window, with the
// burst as Limit. It returns ctx's error, deciding nothing, if ctx ends first.
func (t *Throttle) Allow(ctx context.Context, key string) (Decision, error) {
	now := t.now()
	if t.rl == nil {
		return t.finish(t.local.allow(key, t.llimit, now), t.llimit, now, false), nil
	}
	if !t.breaker.isOpen() {
		res, err := t.remote(ctx, key)
		if err == nil {
			t.breaker.succeeded()
			return t.finish(res, t.limit, now, false), nil
		}
		if cerr := ctx.Err(); cerr != nil {
			// The caller giving up says nothing about Redis, and nobody
			// reads a decision made without it.
			return Decision{}, cerr
		}
		t.breaker.failed(err)
	}
	if t.opts.FailureMode == FailClosed {
		return Decision{}, ErrUnavailable
	}
	return t.finish(t.local.allow(key, t.llimit, now), t.llimit, now, true), nil
}

// Throttled reports, without counting, whether a request from key would be
// refused now, to turn a client away before the work the throttle protects.
func (t *Throttle) Throttled(ctx context.Context, key string) (bool, error) {
	now := t.now()
	if t.rl == nil || t.breaker.isOpen() {
		if t.rl != nil && t.opts.FailureMode == FailClosed {
			return false, ErrUnavailable
		}
		lim := t.limit
		if t.rl != nil {
			lim = t.llimit
		}
		return t.local.throttled(key, lim, now), nil
	}
	res, err := t.remoteN(ctx, key, 0)
	if err != nil {
		if t.opts.FailureMode == FailClosed {
			return false, ErrUnavailable
		}
		return t.local.throttled(key, t.llimit, now), nil
	}
	return res.Remaining < 1, nil
}

func (t *Throttle) remote(ctx context.Context, key string) (*redis_rate.Result, error) {
	return t.remoteN(ctx, key, 1)
}

// remoteN asks Redis for n requests (0: how many are left), waiting at most
// Options.Timeout whatever the client's own timeouts.
func (t *Throttle) remoteN(ctx context.Context, key string, n int) (*redis_rate.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	type answer struct {
		res *redis_rate.Result
		err error
	}
	ch := make(chan answer, 1)
	lim := redis_rate.Limit{Rate: t.limit.Rate, Burst: t.limit.Burst, Period: t.limit.Period}
	start := time.Now()
	go func() {
		res, err := t.rl.AllowN(ctx, t.opts.Prefix+t.name+":{"+key+"}", lim, n)
		ch <- answer{res, err}
	}()
	select {
	case a := <-ch:
		t.breaker.met.observeRedis(time.Since(start), a.err)
		return a.res, a.err
	case <-ctx.Done():
		t.breaker.met.observeRedis(time.Since(start), ctx.Err())
		return nil, errTimeout
	}
}

// throttleName reports whether name is fit for a Redis key and a label.
func throttleName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func (t *Throttle) finish(res *redis_rate.Result, lim ThrottleLimit, now time.Time, degraded bool) Decision {
	d := Decision{
		Outcome:  Allowed,
		Degraded: degraded,
		Time:     now,
		Windows: []WindowState{{
			Window:    Window{Limit: int64(lim.Burst), Period: lim.Period},
			Remaining: int64(max(res.Remaining, 0)),
			Reset:     now.Add(max(res.ResetAfter, 0)),
		}},
	}
	if res.Allowed == 0 {
		d.Outcome = Limited
		d.RetryAfter = res.RetryAfter
	}
	t.count.outcome[d.Outcome].Inc()
	return d
}

// gcraStore is GCRA in memory, the same algorithm as redis_rate's script.
type gcraStore struct {
	mu  sync.Mutex
	tat map[string]time.Time // theoretical arrival time per key
}

func newGCRAStore() *gcraStore { return &gcraStore{tat: make(map[string]time.Time)} }

func (g *gcraStore) allow(key string, lim ThrottleLimit, now time.Time) *redis_rate.Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	interval := lim.Period / time.Duration(lim.Rate)
	tat := g.tat[key]
	if tat.Before(now) {
		tat = now
	}
	newTat := tat.Add(interval)
	allowAt := newTat.Add(-interval * time.Duration(lim.Burst))
	if diff := now.Sub(allowAt); diff < 0 {
		return &redis_rate.Result{Allowed: 0, Remaining: 0, RetryAfter: -diff, ResetAfter: tat.Sub(now)}
	}
	g.tat[key] = newTat
	remaining := int(now.Sub(allowAt) / interval)
	return &redis_rate.Result{Allowed: 1, Remaining: remaining, RetryAfter: -1, ResetAfter: newTat.Sub(now)}
}

func (g *gcraStore) throttled(key string, lim ThrottleLimit, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	interval := lim.Period / time.Duration(lim.Rate)
	tat := g.tat[key]
	if tat.Before(now) {
		tat = now
	}
	return now.Before(tat.Add(interval).Add(-interval * time.Duration(lim.Burst)))
}

func (g *gcraStore) sweep(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, tat := range g.tat {
		if !tat.After(now) {
			delete(g.tat, k)
		}
	}
}

func (g *gcraStore) reset() {
	g.mu.Lock()
	clear(g.tat)
	g.mu.Unlock()
}
