package ratelimit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// errTimeout is a round trip that did not complete within Options.Timeout.
var errTimeout = errors.New("ratelimit: redis round trip timed out")

// errOverloaded is a decision that could not even be queued.
var errOverloaded = errors.New("ratelimit: too many decisions waiting for redis")

// call is one script evaluation waiting for its pipeline.
type call struct {
	keys  []string
	args  []any
	reply any
	err   error
	done  chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// batcher sends concurrent decisions to Redis in pipelines: each worker
// takes whatever is queued when it is free (up to max) and sends it as one
// round trip, so batches grow with load and add no delay when idle.
type batcher struct {
	rdb     redis.UniversalClient
	sc      script
	queue   chan *call
	max     int
	timeout time.Duration
	observe func(time.Duration, error)
}

func newBatcher(rdb redis.UniversalClient, sc script, max, queue int, timeout time.Duration, observe func(time.Duration, error)) *batcher {
	return &batcher{rdb: rdb, sc: sc, queue: make(chan *call, queue), max: max, timeout: timeout, observe: observe}
}

// do evaluates the script for keys and args and waits at most wait.
func (b *batcher) do(ctx context.Context, keys []string, args []any, wait time.Duration) (any, error) {
	c := callPool.Get().(*call)
	c.keys, c.args = keys, args
	select {
	case b.queue <- c:
	default:
		c.keys, c.args = nil, nil
		callPool.Put(c)
		return nil, errOverloaded
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-c.done:
		reply, err := c.reply, c.err
		*c = call{done: c.done}
		callPool.Put(c)
		return reply, err
	case <-timer.C:
		// The worker still owns c and will signal it later; c is not reused.
		return nil, errTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run is one worker; it returns when ctx is done.
func (b *batcher) run(ctx context.Context) {
	batch := make([]*call, 0, b.max)
	cmds := make([]*redis.Cmd, 0, b.max)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		cmds = b.exec(ctx, batch, cmds[:0])
		for i := range batch {
			batch[i] = nil
		}
	}
}

// exec sends one pipeline of EVALSHA and answers every call. Calls the
// server answers with NOSCRIPT (its script cache was flushed) are loaded
// and sent again with EVAL.
func (b *batcher) exec(ctx context.Context, batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	start := time.Now()
	pipe := b.rdb.Pipeline()
	for _, c := range batch {
		cmds = append(cmds, pipe.EvalSha(ctx, b.sc.sha, c.keys, c.args...))
	}
	_, err := pipe.Exec(ctx)
	var retry []int
	if err != nil {
		for i, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				retry = append(retry, i)
			}
		}
	}
	if len(retry) > 0 {
		b.reload(ctx, batch, cmds, retry)
		err = nil
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil && !isNoScript(e) {
				err = e
				break
			}
		}
	}
	b.observe(time.Since(start), err)
	for i, c := range batch {
		c.reply, c.err = cmds[i].Val(), cmds[i].Err()
		c.done <- struct{}{}
	}
	return cmds
}

func (b *batcher) reload(ctx context.Context, batch []*call, cmds []*redis.Cmd, retry []int) {
	// EVAL below carries the source anyway, so a failed load costs nothing;
	// a successful one spares the next pipelines another NOSCRIPT.
	_ = b.rdb.ScriptLoad(ctx, b.sc.src).Err()
	pipe := b.rdb.Pipeline()
	for _, i := range retry {
		cmds[i] = pipe.Eval(ctx, b.sc.src, batch[i].keys, batch[i].args...)
	}
	_, _ = pipe.Exec(ctx)
}
