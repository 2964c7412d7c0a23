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
	log     *slog.Logger
	// final is the census of this release's replicas and mark the
	// finalize mark (finalize.go); fin is this replica's view of it,
	// clear the Redis time (µs) of its first heartbeat since which it
	// counted no older replica (0: it counts one, or has not beaten yet),
	// and warnedOlder whether its warning about older replicas was logged.
	final, mark string
	fin         atomic.Pointer[finState]
	clear       atomic.Int64
	warnedOlder atomic.Bool
	// final2 and mark2 are the census and mark of blocks (finalize.go),
	// blk this replica's view of them.
	final2, mark2 string
	blk           atomic.Pointer[blockView]
	warnedBlocks  atomic.Bool
	// dataset names the record holding the token of Redis's dataset, and
	// held what the last heartbeat found in force, to restore should
	// that dataset be lost (finalize.go, heldMarks).
	dataset string
	held    atomic.Pointer[heldMarks]
	// hold names the operator's hold on finalizing (finalize.go), after
	// how long a census with no older replica and no hold this replica
	// finalizes by itself (0: never), and allClear the Redis time (µs) of
	// its first heartbeat since which it has counted neither (0: it
	// counts one, or has not beaten yet).
	hold          string
	finalizeAfter time.Duration
	allClear      atomic.Int64
}

const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 3 * time.Second
)

// heartbeatScript (lua/heartbeat.lua) announces replica ARGV[1] in the
// census KEYS[1] and in the censuses of the finalize levels this release
// has, KEYS[2] (records) and KEYS[3] (blocks) (finalize.go), drops members
// silent for ARGV[2] ms from all three, and returns the live count, how
// many of them are of releases before each level (in the first census and
// not in the level's), the marks KEYS[4] and KEYS[5] (empty when none),
// the server's time (µs), the dataset's token KEYS[6], whether it restored
// a mark, and the hold on finalizing KEYS[7] (empty when none). The
// release before this one writes KEYS[1] and KEYS[2] alone, the one before
// that KEYS[1].
//
// First it keeps the finalize marks through the loss of Redis's dataset
// (finalize.go, heldMarks): KEYS[6] holds a token for the dataset,
// written (ARGV[6], fresh) where there is none. Where the token is not
// the one this replica last read (ARGV[5]; empty: it read none), the
// dataset it last read is gone, and the marks it held in force then
// (ARGV[3], ARGV[4]; empty: not in force) are set again where missing,
// and so is the hold it last read (ARGV[7]).
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
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h := r.held.Load()
	if h == nil {
		h = &heldMarks{}
	}
	res, err := heartbeatScript.Run(ctx, r.rdb, []string{r.key, r.final, r.final2, r.mark, r.mark2, r.dataset, r.hold},
		r.id, heartbeatTTL.Milliseconds(), h.mark, h.mark2, h.dataset, newToken(), h.hold).Slice()
	if err == nil && len(res) != 9 {
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
	r.observeFinal(mark, older, now, at)
	r.observeBlocks(mark2, older2, at)
	r.held.Store(&heldMarks{mark: inForce(markText, mark, older), mark2: inForce(mark2Text, mark2, older2), dataset: dataset, hold: hold})
	r.met.finalizeHold.Set(boolGauge(hold != ""))
	if r.finalizeDue(older+older2, hold != "", mark > 0 && mark2 > 0, now) {
		r.finalizeNow(ctx)
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
			pipe := r.rdb.TxPipeline()
			pipe.ZRem(wctx, r.key, r.id)
			pipe.ZRem(wctx, r.final, r.id)
			pipe.ZRem(wctx, r.final2, r.id)
			_, _ = pipe.Exec(wctx)
			cancel()
			return
		case <-t.C:
			_ = r.beat(ctx, timeout)
		}
	}
}
