package ratelimit

// Batcher: one script call decides many keys (up to scriptBatch decisions,
// one Redis Cluster slot per call), and one key's decisions keep their
// order, within a call and across the calls of a round trip.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// errTimeout is a round trip that did not complete within Options.Timeout.
var errTimeout = errors.New("ratelimit: redis round trip timed out")

// errOverloaded is a decision that could not even be queued.
var errOverloaded = errors.New("ratelimit: too many decisions waiting for redis")

// call is one decision waiting for its pipeline.
type call struct {
	decision
	slot  int // the key's Redis Cluster slot (0 outside a cluster)
	reply string
	err   error
	done  chan struct{}
	// queued is when the decision joined the queue.
	queued time.Time
	// timer bounds the caller's wait; pooled, so as not to allocate.
	timer *time.Timer
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

// batcher: each free worker sends what is queued (up to maxBatch) in one
// round trip, so batches grow with load and add no delay when idle.
type batcher struct {
	dec     *redisDecider
	queue   chan *call
	timeout time.Duration
	observe func(time.Duration, error)
	// waited hears how long each decision of a pipeline waited for it.
	waited func(time.Duration)

	// hold: see run. ended is closed and replaced as pipelines are answered.
	hold     time.Duration
	front    sync.Mutex
	inflight atomic.Int32
	ended    atomic.Pointer[chan struct{}]
	// full is signalled when a script call's worth is queued.
	full chan struct{}
}

// maxBatch caps the decisions in one pipeline; queueSize, those waiting.
const (
	maxBatch  = 256
	queueSize = 8192
)

func newBatcher(dec *redisDecider, timeout, hold time.Duration, observe func(time.Duration, error), waited func(time.Duration)) *batcher {
	if hold < 0 {
		hold = 0
	}
	b := &batcher{dec: dec, queue: make(chan *call, queueSize), timeout: timeout, hold: hold, full: make(chan struct{}, 1), observe: observe, waited: waited}
	ch := make(chan struct{})
	b.ended.Store(&ch)
	return b
}

// do makes decision d and waits at most wait for the script's reply.
func (b *batcher) do(ctx context.Context, d decision, wait time.Duration) (string, error) {
	c := callPool.Get().(*call)
	c.decision = d
	c.slot = b.dec.slot(d)
	c.queued = time.Now()
	select {
	case b.queue <- c:
	default:
		c.decision = decision{}
		callPool.Put(c)
		return "", errOverloaded
	}
	if b.hold > 0 && len(b.queue) >= scriptBatch-1 {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
	c.timer.Reset(wait)
	select {
	case <-c.done:
		c.timer.Stop()
		reply, err := c.reply, c.err
		*c = call{done: c.done, timer: c.timer}
		callPool.Put(c)
		return reply, err
	case <-c.timer.C:
		// The worker still owns c and will signal it later; c is not reused.
		return "", errTimeout
	case <-ctx.Done():
		c.timer.Stop()
		return "", ctx.Err()
	}
}

// run is one worker, until ctx is done. With a hold, the worker holding
// front sends the next batch, while others are in flight, only once they
// are all answered, its oldest decision has waited hold, or a script call's
// worth is queued: near Redis, decisions share one call rather than each
// pay a call's fixed cost; far from it, they wait hold more.
func (b *batcher) run(ctx context.Context) {
	batch := make([]*call, 0, maxBatch)
	var timer *time.Timer
	if b.hold > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
		b.front.Lock()
	}
	for {
		select {
		case <-ctx.Done():
			if b.hold > 0 {
				b.front.Unlock()
			}
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
		if b.hold > 0 {
			b.waitInflight(ctx, batch[0].queued.Add(b.hold), timer)
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.inflight.Add(1)
		if b.hold > 0 {
			b.front.Unlock()
		}
		b.exec(ctx, batch)
		clear(batch)
		b.inflight.Add(-1)
		if b.hold > 0 {
			ch := make(chan struct{})
			close(*b.ended.Swap(&ch))
			b.front.Lock()
		}
	}
}

// waitInflight waits as run says, until deadline at most.
func (b *batcher) waitInflight(ctx context.Context, deadline time.Time, timer *time.Timer) {
	for {
		ended := b.ended.Load()
		if b.inflight.Load() == 0 || len(b.queue) >= scriptBatch-1 {
			return
		}
		d := time.Until(deadline)
		if d <= 0 {
			return
		}
		timer.Reset(d)
		select {
		case <-*ended:
			timer.Stop()
		case <-b.full:
			timer.Stop()
		case <-timer.C:
			return
		case <-ctx.Done():
			timer.Stop()
			return
		}
	}
}

// exec sends batch as one pipeline of script calls and answers every call.
func (b *batcher) exec(ctx context.Context, batch []*call) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if b.dec.cluster {
		// One slot per call; stable, so one key's decisions keep their order.
		slices.SortStableFunc(batch, func(x, y *call) int { return x.slot - y.slot })
	}
	start := time.Now()
	ds := make([]decision, len(batch))
	for i, c := range batch {
		b.waited(start.Sub(c.queued))
		ds[i] = c.decision
	}
	sent, err := b.dec.send(ctx, ds, func(i int) int { return batch[i].slot })
	b.observe(time.Since(start), err)
	sent.answer(func(i int, reply string, err error) {
		c := batch[i]
		c.reply, c.err = reply, err
		c.done <- struct{}{}
	})
}
