package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicas counts the live replicas, so that the fallback divides limits
// by the fleet as it is now, not as it was configured: each replica
// announces itself in a sorted set scored by Redis time every
// heartbeatEvery, drops members silent for heartbeatTTL, and reads the
// count in the same script. Options.Replicas is the count until the
// census is complete: for the first heartbeatTTL a replica counts at
// least Options.Replicas (replicas starting together see only those that
// beat before them), and after that the last count seen (kept while Redis
// is unreachable).
type replicas struct {
	rdb     redis.UniversalClient
	key     string
	id      string
	initial int64
	started time.Time
	count   atomic.Int64
	met     *metrics
}

const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 3 * time.Second
)

var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
`)

func newReplicas(rdb redis.UniversalClient, prefix string, initial int, met *metrics) *replicas {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	r := &replicas{rdb: rdb, key: prefix + "{replicas}", id: hex.EncodeToString(b), met: met,
		initial: int64(max(initial, 1)), started: time.Now()}
	r.set(r.initial)
	return r
}

func (r *replicas) live() int64 { return r.count.Load() }

func (r *replicas) set(n int64) {
	r.count.Store(n)
	r.met.replicasLive.Set(float64(n))
}

// beat announces this replica once and reads the live count.
func (r *replicas) beat(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, err := heartbeatScript.Run(ctx, r.rdb, []string{r.key}, r.id, heartbeatTTL.Milliseconds()).Int64()
	if err != nil {
		return err
	}
	if time.Since(r.started) < heartbeatTTL {
		n = max(n, r.initial)
	}
	r.set(max(n, 1))
	return nil
}

// run beats until ctx is done, then withdraws this replica so that the
// others count it out at once.
func (r *replicas) run(ctx context.Context, timeout time.Duration) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	_ = r.beat(ctx, timeout)
	for {
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), timeout)
			_ = r.rdb.ZRem(wctx, r.key, r.id).Err()
			cancel()
			return
		case <-t.C:
			_ = r.beat(ctx, timeout)
		}
	}
}
