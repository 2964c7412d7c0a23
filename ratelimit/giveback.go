package ratelimit

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

// Giving back: what a lease or a block leaves unspent was counted in
// Redis with what was admitted, in the bucket that was current when it was
// granted, and would count there until the bucket slides out: against the
// key's limits in every interval that holds it (the day's window too), so
// that a key sending close to its limit could be refused for admissions
// nobody made. A replica that lets a lease or a block go with
// admissions left (its end passed, its plan changed, the key's entry was
// swept, the replica closes) therefore sends them back: a script takes
// them off that bucket's count and off the window's total, in every window
// the block was counted in, where the bucket is still stored.
//
// The windows stay strict: a record only ever counts at least what was
// admitted in each of its buckets, because
//
//   - an admission is given back only once the replica can no longer spend
//     it: it leaves the lease table (drop, under the
//     shard's lock) before it is queued, and it is queued once, and sent
//     again only when the server answered NOSCRIPT (ran nothing): never
//     after a network error or a timeout, when the server may have run it
//     (onceCmd);
//   - it is taken off the bucket it was counted in (the grant's server
//     time over the window's bucket width: the script counted it in
//     floor(now/g)), and only while the record stores that bucket (the head
//     or one of the n before it) and the window still holds it at the
//     server's time; a bucket that slid out is left alone;
//   - no more is taken off a bucket than it counts, and nothing off a
//     saturated count or total (their true values are unknown);
//   - the bucket's last event, where the block's end was recorded, is left
//     as it is: an event later than the true last only keeps the bucket in
//     the window longer.
//
// A Reset deletes a key's records: a block granted before it was counted
// in records that no longer exist, and giving it back would take it off
// counts made since. So the replica that resets, and every replica the
// announcement reaches, drops the key's blocks without giving them back
// (forget); and since an announcement can be missed, the Reset also marks
// the key with the server's time (resetRecords), and the script takes
// nothing back for a block granted at or before it.
//
// Giving back is best effort: a give-back that finds its queue full, Redis
// unreachable or the circuit open is dropped, and its admissions count
// until they slide out, as they did before. The windows it did reach are
// strict either way.

// giveBackQueue is how many give-backs wait to be sent before more are
// dropped; giveBackBatch, how many go in one pipeline.
const (
	giveBackQueue = 4096
	giveBackBatch = 64
)

// giveBack is a block's unspent admissions, n, to take off the bucket at
// of each of windows (the records under prefix for key: the first coarse
// of them coarse records, blocks.go, where a block is counted in the
// bucket of its end instead).
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

// add queues g, or drops it when the queue is full.
func (q *giveBacks) add(g giveBack) {
	select {
	case q.queue <- g:
	default:
	}
}

// run sends what is queued as it comes, until ctx ends.
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

// sendBatch sends first and whatever else is queued, up to giveBackBatch,
// in one pipeline: one call of giveBackScript for them all, or under Redis
// Cluster one per hash slot, since a script touches one slot.
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
	// exec sends the calls of groups at idx in one pipeline.
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
	// Only the calls the server did not run are sent again, once the
	// script is loaded (on every shard of a cluster): another would be
	// given back twice.
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

// giveBackReplies returns what a call of giveBackScript for n give-backs
// took off, per give-back: the most it took off any of its windows.
func giveBackReplies(c *redis.Cmd, n int) ([]int64, error) {
	taken, err := c.Int64Slice()
	if err == nil && len(taken) != n {
		err = fmt.Errorf("ratelimit: %d replies to %d give-backs", len(taken), n)
	}
	return taken, err
}

// onceCmd is a command go-redis does not send again after a network error
// or a timeout (Cmder's NoRetry): the server may have run it before its
// reply was lost, and a give-back run twice would take its admissions off
// twice. (NOSCRIPT, which the server answers without running anything, is
// retried by sendBatch itself.)
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// giveBackCall returns gs, give-backs of keys of one slot, as one EVALSHA
// of giveBackScript, unsent.
func giveBackCall(ctx context.Context, prefix string, gs []giveBack) *redis.Cmd {
	keys, args := giveBackCommand(prefix, gs)
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", giveBackScript.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	// Where the keys begin, for a cluster's routing by slot (as go-redis's
	// own EvalSha marks it).
	cmd.SetFirstKeyPos(3)
	return cmd
}

// giveBackCommand returns the script keys and arguments of gs: per
// give-back, the key's reset mark and its windows' records, and one
// argument of big-endian 8-byte numbers: its admissions, the grant's
// server time and the number of its windows, then per window the bucket
// they were counted in, the ring's n and its bucket width.
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

// giveBackScript (lua/giveback.lua) takes unspent admissions back off
// window records (format.go), its numbers read and written by the
// decision code's own codec (lua/codec.lua). KEYS and ARGV: per give-back
// (giveBackCommand), its key's reset mark and window records; and one
// argument of 8-byte numbers: its admissions, the grant's server time,
// the number of its windows, then per window the bucket they were counted
// in, the ring's n and its bucket width. Only a bucket the window still
// holds at the server's time is taken from (one the record stores but
// time has slid out of the window counts against nothing, and may lie
// before a Reset whose mark has expired). A give-back granted at or
// before the key's last reset (its mark) takes nothing: the records it
// was counted in are gone. It returns, per give-back, the most taken off
// any of its windows.
var giveBackScript = redis.NewScript(codecLua + giveBackLua)

//go:embed lua/giveback.lua
var giveBackLua string
