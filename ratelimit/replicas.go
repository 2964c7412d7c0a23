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
	// Records level: census, mark, this replica's view, and clear (Redis µs),
	// the first heartbeat counting no older replica (0: none yet).
	final, mark string
	fin         atomic.Pointer[finState]
	clear       atomic.Int64
	warnedOlder atomic.Bool
	// Blocks level: census, mark and this replica's view.
	final2, mark2 string
	blk           atomic.Pointer[blockView]
	warnedBlocks  atomic.Bool
	// Compact level: census and mark (its view is part of fin's); the key
	// prefix and expanding, set while this replica writes compact records
	// back for an older release (expandFor).
	final3, mark3 string
	prefix        string
	expanding     atomic.Bool
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
// KEYS[1] and the level censuses KEYS[2] (records), KEYS[3] (blocks) and
// KEYS[8] (compact), drops members silent for ARGV[2] ms, and returns the live
// count, the older count of the first two levels, the marks KEYS[4] and
// KEYS[5], the server's µs, the dataset token KEYS[6], whether it restored a
// mark, the hold KEYS[7], then the compact level's older count and mark
// KEYS[9]. First, if the token is not ARGV[5], the one last read, it restores
// where missing the marks ARGV[3], ARGV[4], ARGV[8] and the hold ARGV[7];
// ARGV[6] is a fresh token. The release before this one writes KEYS[1] to
// KEYS[3], the one before that KEYS[1] and KEYS[2].
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
		final2: prefix + blocksCensusSuffix, mark2: prefix + blocksMarkSuffix, dataset: prefix + datasetSuffix,
		final3: prefix + compactCensusSuffix, mark3: prefix + compactMarkSuffix, prefix: prefix,
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
	res, err := heartbeatScript.Run(ctx, r.rdb, []string{r.key, r.final, r.final2, r.mark, r.mark2, r.dataset, r.hold, r.final3, r.mark3},
		r.id, heartbeatTTL.Milliseconds(), h.mark, h.mark2, h.dataset, newToken(), h.hold, h.mark3).Slice()
	if err == nil && len(res) != 11 {
		err = fmt.Errorf("ratelimit: unexpected heartbeat reply %v", res)
	}
	if err != nil {
		r.forget()
		return err
	}
	at := time.Now()
	n, _ := res[0].(int64)
	older, _ := res[1].(int64)
	older2, _ := res[2].(int64)
	markText, _ := res[3].(string)
	mark, _ := strconv.ParseInt(markText, 10, 64)
	mark2Text, _ := res[4].(string)
	mark2, _ := strconv.ParseInt(mark2Text, 10, 64)
	nowText, _ := res[5].(string)
	now, err := strconv.ParseInt(nowText, 10, 64)
	if err != nil {
		r.forget()
		return fmt.Errorf("ratelimit: unexpected heartbeat time %v", res[5])
	}
	dataset, _ := res[6].(string)
	if restored, _ := res[7].(int64); restored == 1 && r.log != nil {
		r.log.Warn("ratelimit: Redis lost its data (restarted empty, or flushed) while records were finalized: the finalize marks were set again",
			"finalized", markText, "blocks", mark2Text)
	}
	hold, _ := res[8].(string)
	older3, _ := res[9].(int64)
	mark3Text, _ := res[10].(string)
	mark3, _ := strconv.ParseInt(mark3Text, 10, 64)
	r.observeFinal(mark, older, now, at, mark3 > 0 && older3 == 0)
	r.observeBlocks(mark2, older2, at)
	if mark3 > 0 {
		// Marked, a replica that cannot read compact records is a rollback
		// without undo too (older3 counts every older one).
		r.met.olderReplicas.Set(float64(older3))
		if older3 > 0 {
			r.expandFor(parent)
		}
	}
	r.held.Store(&heldMarks{mark: inForce(markText, mark, older), mark2: inForce(mark2Text, mark2, older2),
		mark3: inForce(mark3Text, mark3, older3), dataset: dataset, hold: hold})
	r.met.finalizeHold.Set(boolGauge(hold != ""))
	if r.finalizeDue(older+older2+older3, hold != "", mark > 0 && mark2 > 0 && mark3 > 0, now) {
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
			pipe.ZRem(wctx, r.final2, r.id)
			pipe.ZRem(wctx, r.final3, r.id)
			_, _ = pipe.Exec(wctx)
			cancel()
			return
		case <-t.C:
			_ = r.beat(ctx, timeout)
		}
	}
}
