package ratelimit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The census. Every replica beats into PREFIX{replicas}, a sorted set scored by
// Redis time, every heartbeatEvery, and members silent for heartbeatTTL are
// dropped, so the live count, which sizes fallback shares, leases and blocks,
// is the fleet as it is now. A replica withdraws as it stops.

// replicas is the census and the finalize marks' view (finalize.go). For the
// first heartbeatTTL it counts at least Options.Replicas (replicas starting
// together see only those that beat first), then the last count seen.
type replicas struct {
	rdb     redis.UniversalClient
	key     string
	id      string
	initial int64
	started time.Time
	count   atomic.Int64
	met     *metrics
	log     *slog.Logger
	// This release's census and the mark, and this replica's view of it.
	final, mark string
	view        atomic.Pointer[view]
	warned      atomic.Bool
	// The key prefix, and expanding, set while this replica writes compact
	// records back for an older release (expandFor).
	prefix    string
	expanding atomic.Bool
	// The dataset token's key, and what to restore if it is lost (heldMarks).
	dataset string
	held    atomic.Pointer[heldMarks]
	// The hold; finalizeAfter (0: never), and allClear: since when (Redis µs;
	// 0: not) no older replica and no hold were counted.
	hold          string
	finalizeAfter time.Duration
	allClear      atomic.Int64
}

const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 3 * time.Second
)

// heartbeatScript (lua/heartbeat.lua) announces replica ARGV[1] in the census
// KEYS[1] and this release's KEYS[2], drops members silent for ARGV[2] ms, and
// returns the live count, the older count, the mark KEYS[3], the server's µs,
// the dataset token KEYS[4], whether it restored the mark, and the hold
// KEYS[5]. First, if the token is not ARGV[4], the one last read, it restores
// where missing the mark ARGV[3] and the hold ARGV[6]; ARGV[5] is a fresh
// token. Every release writes KEYS[1].
var heartbeatScript = redis.NewScript(heartbeatLua)

//go:embed lua/heartbeat.lua
var heartbeatLua string

// newToken returns 16 random hex digits.
func newToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newReplicas(rdb redis.UniversalClient, prefix string, initial int, finalizeAfter time.Duration, met *metrics, log *slog.Logger) *replicas {
	r := &replicas{rdb: rdb, key: prefix + "{replicas}", id: newToken(), met: met, log: log,
		final: prefix + finalCensusSuffix, mark: prefix + finalMarkSuffix,
		dataset: prefix + datasetSuffix, prefix: prefix,
		hold: prefix + holdSuffix, finalizeAfter: max(finalizeAfter, 0),
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
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h := r.held.Load()
	if h == nil {
		h = &heldMarks{}
	}
	res, err := heartbeatScript.Run(ctx, r.rdb, []string{r.key, r.final, r.mark, r.dataset, r.hold},
		r.id, heartbeatTTL.Milliseconds(), h.mark, h.dataset, newToken(), h.hold).Slice()
	if err == nil && len(res) != 7 {
		err = fmt.Errorf("ratelimit: unexpected heartbeat reply %v", res)
	}
	if err != nil {
		r.forget()
		return err
	}
	at := time.Now()
	n, _ := res[0].(int64)
	older, _ := res[1].(int64)
	markText, _ := res[2].(string)
	mark, _ := strconv.ParseInt(markText, 10, 64)
	nowText, _ := res[3].(string)
	now, err := strconv.ParseInt(nowText, 10, 64)
	if err != nil {
		r.forget()
		return fmt.Errorf("ratelimit: unexpected heartbeat time %v", res[3])
	}
	dataset, _ := res[4].(string)
	if restored, _ := res[5].(int64); restored == 1 && r.log != nil {
		r.log.Warn("ratelimit: Redis lost its data (restarted empty, or flushed) while records were finalized: the finalize mark was set again",
			"finalized", markText)
	}
	hold, _ := res[6].(string)
	r.observe(mark, older, at)
	if mark > 0 && older > 0 {
		// A rollback begun without undoing: write compact records back.
		r.expandFor(parent)
	}
	r.held.Store(&heldMarks{mark: inForce(markText, mark, older), dataset: dataset, hold: hold})
	r.met.finalizeHold.Set(boolGauge(hold != ""))
	if r.finalizeDue(older, hold != "", mark > 0, now) {
		r.finalizeNow(ctx)
	}
	if time.Since(r.started) < heartbeatTTL {
		n = max(n, r.initial)
	}
	r.set(max(n, 1))
	return nil
}

// run beats until ctx is done, then withdraws: others count it out at once.
func (r *replicas) run(ctx context.Context, timeout time.Duration) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	_ = r.beat(ctx, timeout)
	for {
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), timeout)
			pipe := r.rdb.TxPipeline()
			pipe.ZRem(wctx, r.key, r.id)
			pipe.ZRem(wctx, r.final, r.id)
			_, _ = pipe.Exec(wctx)
			cancel()
			return
		case <-t.C:
			_ = r.beat(ctx, timeout)
		}
	}
}
