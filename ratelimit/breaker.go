package ratelimit

// Breaker: it trips only on persistent failure, minFailures consecutive
// failed round trips spanning tripAfter or more, never on one blip. Callers
// report only Redis's failures, not the replica's own (a decision not queued,
// or queued past its deadline), so that a busy machine is no outage.

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// breaker decides when a replica stops asking Redis and answers locally
// (fail-open) or refuses (fail-closed); a request whose own round trip
// failed is decided by the fallback alone. While open, a probe retries
// Redis every interval; its first success closes it.
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
