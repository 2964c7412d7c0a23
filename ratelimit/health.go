package ratelimit

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// health tracks whether Redis is reachable. The first failure of an outage
// marks it down (one log line, gauge set when it owns the fallback gauge);
// a probe then retries Redis in the background until it answers, which
// marks it up again (one more line).
type health struct {
	what     string // what is degraded, for the log lines
	mode     FailureMode
	log      *slog.Logger
	met      *metrics
	gauge    bool // owns fallback_active and fallback_seconds_total
	now      func() time.Time
	probe    func(context.Context) error
	onDown   func()
	interval time.Duration
	timeout  time.Duration

	down  atomic.Bool
	mu    sync.Mutex // guards since
	since time.Time
	kick  chan struct{}
}

func (h *health) isDown() bool { return h.down.Load() }

// fail records that Redis failed with err.
func (h *health) fail(err error) {
	if h.down.Swap(true) {
		return
	}
	h.mu.Lock()
	h.since = h.now()
	h.mu.Unlock()
	if h.mode == FailOpen {
		if h.onDown != nil {
			h.onDown()
		}
		if h.gauge {
			h.met.fallbackActive.Set(1)
		}
		h.log.Warn("ratelimit: redis unreachable, enforcing "+h.what+" per replica", "err", err)
	} else {
		h.log.Error("ratelimit: redis unreachable, refusing "+h.what+" decisions until it is back", "err", err)
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run probes Redis while it is down, until ctx is done.
func (h *health) run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			h.settle()
			return
		case <-h.kick:
		case <-t.C:
		}
		if !h.down.Load() {
			continue
		}
		h.settle()
		pctx, cancel := context.WithTimeout(ctx, h.timeout)
		err := h.probe(pctx)
		cancel()
		if err != nil {
			continue
		}
		h.mu.Lock()
		h.settleLocked()
		since := h.since
		h.since = time.Time{}
		h.down.Store(false)
		h.mu.Unlock()
		if h.gauge && h.mode == FailOpen {
			h.met.fallbackActive.Set(0)
		}
		h.log.Info("ratelimit: redis reachable again, shared "+h.what+" resumed", "after", h.now().Sub(since).Round(time.Millisecond))
	}
}

// settle adds the time spent in fallback so far to fallback_seconds_total.
func (h *health) settle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settleLocked()
}

func (h *health) settleLocked() {
	if !h.gauge || h.mode != FailOpen || h.since.IsZero() {
		return
	}
	now := h.now()
	if d := now.Sub(h.since); d > 0 {
		h.met.fallbackSeconds.Add(d.Seconds())
	}
	h.since = now
}
