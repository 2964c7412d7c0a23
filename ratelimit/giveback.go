package ratelimit

// Giving back: an unspent admission is taken back at most once, only from
// the bucket that counted it, only while its window still holds that
// bucket, and never more than the bucket counts; so a record always counts
// at least what was admitted in each of its buckets.

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Unspent admissions would count against the key's limits (its day's too)
// until they slid out, refusing a key near its limit for admissions nobody
// made. They are given back once they cannot be spent: they leave the lease
// table (drop, under the shard's lock) before being queued, once. Left
// alone: a bucket slid out of the window (it counts against nothing, and may
// predate a Reset whose mark expired), a saturated count or total (its true
// value is unknown), and a bucket's last event (later only keeps it longer).
//
// A Reset deletes the key's records, and an older grant given back would
// come off counts made since. So replicas that reset or hear of it forget
// the key's grants, and since that can be missed, the Reset marks the key
// with the server's time (resetRecords): older grants are not taken back.
//
// Best effort: a give-back that finds the queue full, Redis unreachable or
// the circuit open is dropped; its admissions count until they slide out.

// giveBackQueue bounds the give-backs waiting; giveBackBatch, a pipeline's.
const (
	giveBackQueue = 4096
	giveBackBatch = 64
)

// giveBack is a lease's or block's unspent admissions, n, to take off each
// of windows (the first coarse of them coarse records, counted at end).
type giveBack struct {
	key     string
	windows []ring
	coarse  int
	end     int64 // a block's end, µs (coarse records)
	at      int64 // the grant's server time, µs
	n       int64
	counter prometheus.Counter // counts what Redis took back (nil: nothing)
}

// giveBacks queues give-backs and sends them.
type giveBacks struct {
	rdb    redis.UniversalClient
	prefix string
	log    *slog.Logger
	open   func() bool // the circuit is open: Redis is not tried
	queue  chan giveBack
	send   sync.Mutex // one sender at a time: the loop, or Close's flush
	// bySlot: Redis Cluster, where a call's keys must share a slot.
	bySlot bool
	// applied counts the give-backs that took something off a window.
	applied atomic.Int64
}

func newGiveBacks(rdb redis.UniversalClient, prefix string, log *slog.Logger, open func() bool) *giveBacks {
	_, cluster := rdb.(*redis.ClusterClient)
	return &giveBacks{rdb: rdb, prefix: prefix, log: log, open: open, queue: make(chan giveBack, giveBackQueue), bySlot: cluster}
}

func (q *giveBacks) add(g giveBack) {
	select {
	case q.queue <- g:
	default:
	}
}

func (q *giveBacks) run(ctx context.Context, timeout time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case g := <-q.queue:
			q.sendBatch(ctx, timeout, g)
		}
	}
}

// flush sends everything queued, within timeout in all.
func (q *giveBacks) flush(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		select {
		case g := <-q.queue:
			q.sendBatch(ctx, timeout, g)
			if ctx.Err() != nil {
				return
			}
		default:
			return
		}
	}
}

// sendBatch sends first and what else is queued, up to giveBackBatch, in
// one pipeline: one script call, or under Redis Cluster one per slot.
func (q *giveBacks) sendBatch(ctx context.Context, timeout time.Duration, first giveBack) {
	batch := []giveBack{first}
fill:
	for len(batch) < giveBackBatch {
		select {
		case g := <-q.queue:
			batch = append(batch, g)
		default:
			break fill
		}
	}
	if q.open() {
		return
	}
	q.send.Lock()
	defer q.send.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	groups := [][]giveBack{batch}
	if q.bySlot {
		groups = slotGroups(batch)
	}
	cmds := make([]*redis.Cmd, len(groups))
	exec := func(idx []int) {
		pipe := q.rdb.Pipeline()
		for _, i := range idx {
			cmds[i] = giveBackCall(ctx, q.prefix, groups[i])
			_ = pipe.Process(ctx, onceCmd{cmds[i]})
		}
		_, _ = pipe.Exec(ctx)
	}
	all := make([]int, len(groups))
	for i := range all {
		all[i] = i
	}
	exec(all)
	// Resend only the calls the server did not run (onceCmd).
	var missing []int
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		if err := giveBackScript.Load(ctx, q.rdb).Err(); err != nil {
			q.log.Debug("ratelimit: unspent admissions not given back", "err", err, "calls", len(missing))
			return
		}
		exec(missing)
	}
	var failed int
	var lastErr error
	for i, gs := range groups {
		taken, err := giveBackReplies(cmds[i], len(gs))
		if err != nil {
			failed, lastErr = failed+len(gs), err
			continue
		}
		for j, n := range taken {
			if n > 0 {
				q.applied.Add(1)
				if gs[j].counter != nil {
					gs[j].counter.Add(float64(n))
				}
			}
		}
	}
	if failed > 0 {
		q.log.Debug("ratelimit: unspent admissions not given back", "err", lastErr, "blocks", failed)
	}
}

// slotGroups splits batch into runs of one Redis Cluster slot each.
func slotGroups(batch []giveBack) [][]giveBack {
	slot := func(g *giveBack) int { return keySlot(g.key) }
	slices.SortStableFunc(batch, func(x, y giveBack) int { return slot(&x) - slot(&y) })
	var groups [][]giveBack
	for from := 0; from < len(batch); {
		to := from + 1
		for to < len(batch) && slot(&batch[to]) == slot(&batch[from]) {
			to++
		}
		groups = append(groups, batch[from:to])
		from = to
	}
	return groups
}

// giveBackReplies returns the most a call took off any window, per give-back.
func giveBackReplies(c *redis.Cmd, n int) ([]int64, error) {
	taken, err := c.Int64Slice()
	if err == nil && len(taken) != n {
		err = fmt.Errorf("ratelimit: %d replies to %d give-backs", len(taken), n)
	}
	return taken, err
}

// onceCmd is a command go-redis does not retry after a network error or a
// timeout (NoRetry): the server may have run it, and a give-back run twice
// takes its admissions off twice. sendBatch resends NOSCRIPT calls itself.
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// giveBackCall returns gs, of one slot, as one unsent EVALSHA.
func giveBackCall(ctx context.Context, prefix string, gs []giveBack) *redis.Cmd {
	keys, args := giveBackCommand(prefix, gs)
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", giveBackScript.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	// Where the keys begin, for routing by slot (as go-redis's EvalSha).
	cmd.SetFirstKeyPos(3)
	return cmd
}

// giveBackCommand returns gs's script keys and arguments. Per give-back: the
// key's reset mark and window records, and one argument of big-endian 8-byte
// numbers: its admissions, the grant's server time, its window count, then
// per window the bucket that counted them, the ring's n and bucket width.
func giveBackCommand(prefix string, gs []giveBack) ([]string, []any) {
	var nk int
	for i := range gs {
		nk += 1 + len(gs[i].windows)
	}
	keys := make([]string, 0, nk)
	args := make([]any, len(gs))
	for i := range gs {
		g := &gs[i]
		keys = append(keys, resetMarkKey(prefix, g.key))
		nums := make([]byte, 0, 8*(3+3*len(g.windows)))
		nums = binary.BigEndian.AppendUint64(nums, uint64(g.n))
		nums = binary.BigEndian.AppendUint64(nums, uint64(g.at))
		nums = binary.BigEndian.AppendUint64(nums, uint64(len(g.windows)))
		for j := range g.windows {
			w := &g.windows[j]
			bucket := g.at / w.gran
			if j < g.coarse {
				keys = append(keys, coarseKey(prefix, g.key, w))
				bucket = (g.end - 1) / w.gran
			} else {
				keys = append(keys, windowKey(prefix, g.key, w))
			}
			nums = binary.BigEndian.AppendUint64(nums, uint64(bucket))
			nums = binary.BigEndian.AppendUint64(nums, uint64(w.n))
			nums = binary.BigEndian.AppendUint64(nums, uint64(w.gran))
		}
		args[i] = nums
	}
	return keys, args
}

// giveBackScript (lua/giveback.lua, after the decision code's lua/codec.lua
// and lua/layout.lua) takes giveBackCommand's give-backs off window records
// (format.go).
var giveBackScript = redis.NewScript(codecLua + layoutLua + giveBackLua)

//go:embed lua/giveback.lua
var giveBackLua string
