package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Finalizing. Some ways of writing the records are safe only once no
// replica of an older release writes them. The fleet finalizes by itself:
// once a replica's heartbeats have counted no live replica of an older
// release, and no operator's hold, for Options.FinalizeAfter (default a
// minute, by Redis time), it sets a mark in Redis,
// PREFIX{replicas}:finalized, to the server's time (the same script as
// 'petstore limits finalize', Limiter.Finalize, which does it at once).
// Rolling back past this release is not supported after it unless the
// mark is removed first (Limiter.Unfinalize, which also holds finalizing
// back) and heartbeatTTL has passed. An operator who wants to keep that
// rollback open through a staged upgrade holds finalizing back before
// the rollout (Limiter.Hold: PREFIX{replicas}:hold, in the spirit of
// CockroachDB's cluster.preserve_downgrade_option); an explicit Finalize
// lifts the hold. What finalizing enables now:
//
//   - A window record's expiry is set per epoch of a quarter of its
//     period (expiry, lua/ring.lua): when the head moves into a new epoch,
//     not on every head move. A release before this one refreshes the record's
//     TTL from now on every head move; one of its writes in the middle of
//     an epoch would leave the record to expire before that epoch's later
//     events stop counting, which the decisions of a finalized replica no
//     longer correct.
//
// Every writer of this release sets the same expiry for an epoch (to the
// millisecond), never earlier than an older release would, so replicas
// that have not yet read the mark (they set it on every head move) run
// safely beside those that have, and beside older releases before the
// mark.
//
// The mark is in force on a replica while its last heartbeat, at most
// heartbeatTTL ago, read it and counted no live replica of an older
// release: each replica of this release announces itself in a second
// census, PREFIX{replicas}:final, beside the one every release writes, and
// the difference is the older ones (metric older_replicas). Finalize
// refuses while there are any. Even finalized, a replica that counts one
// (a rollback begun without unfinalizing) goes back to setting the expiry
// on every head move at its next heartbeat, and once it counts none again
// resumes from that time, not the mark's (observeFinal); what an older
// replica writes before the census counts it may still let a window
// overshoot, for up to a period.
//
// The mark and the census say "no replica of a release before this one",
// nothing more. A later release whose finalized writes this release could
// not read (a format extension that every reader must apply, such as
// one header record per key) must not come into force on
// this mark: this release's replicas are in PREFIX{replicas}:final and
// would not count as older during that release's rollout. It takes a
// census and a mark of its own (finalizing to its level), which this
// release neither writes nor reads.
const (
	finalCensusSuffix = "{replicas}:final"
	finalMarkSuffix   = "{replicas}:finalized"
)

// Blocks (blocks.go) are finalizing's second level: a replica of a release
// before it neither reads nor writes the coarse records, and would admit
// into a window without the blocks other replicas spend. Each replica of
// this release also announces itself in PREFIX{replicas}:final2 (beside
// PREFIX{replicas}:final, where the release before this one counts it as
// its own kind), and Finalize sets PREFIX{replicas}:finalized2 too, refused
// while any live replica is in the census and not in final2 (the release
// before this one included). While a heartbeat, at most heartbeatTTL ago,
// read that mark and counted no such replica, a replica grants blocks;
// while it reads the mark at all, and for blockLife and heartbeatTTL
// after it last granted one, its round trips read the coarse records
// (a block granted elsewhere may still be spent). A rollback begun
// without undoing the mark stops new blocks at the replicas' next
// heartbeat; what the older replicas admit meanwhile, beside blocks still
// being spent, may let a short window overshoot by those blocks, for up
// to blockLife.
const (
	blocksCensusSuffix = "{replicas}:final2"
	blocksMarkSuffix   = "{replicas}:finalized2"
)

// The marks outlive a Redis that loses its dataset (restarted without
// persistence, flushed, failed over to an empty replica): finalizing is
// the operator's word that no older release runs, and a lost dataset
// does not start one. The heartbeat keeps a token of the dataset,
// PREFIX{replicas}:dataset, written where there is none, and each
// replica holds the marks its last heartbeat found in force beside the
// token it read (heldMarks). A heartbeat that finds another token, or
// none, finds the dataset the replica last read gone, and sets the marks
// it held again where they are missing, at their own times; a replica
// that held none (a mark out of force beside an older replica, or
// undone) restores nothing. The marks' own times serve: every record
// written before them was lost with the dataset, and what older replicas
// would write since is the census's to catch, as after any finalizing
// (a replica that counts one holds the marks out of force, and holds
// none). The one case it gets wrong: Redis
// losing its dataset after 'petstore limits finalize --undo' and before
// every replica's next heartbeat read the marks gone (a second) restores
// what was undone; so Unfinalize, after heartbeatTTL, removes them again
// should they be back. (A replica cut off from Redis from the undo until
// after that, its heartbeats failing, still holds them, and would set
// them again after a later loss: should a rollback follow,
// PetstoreRollbackAfterFinalize fires, and the census holds them out of
// force once it counts the older replicas.)
const datasetSuffix = "{replicas}:dataset"

// holdSuffix names the operator's hold on finalizing: while it is set, no
// replica finalizes by itself. A heartbeat that finds the dataset lost
// sets it again, as it does the marks: a hold is the operator's word too.
const holdSuffix = "{replicas}:hold"

// heldMarks is what a replica's last heartbeat found: the marks in force
// (as read, empty where not in force), the dataset's token and the hold.
type heldMarks struct {
	mark, mark2, dataset, hold string
}

// finalizeDue reports whether this replica finalizes by itself after a
// heartbeat at Redis time now (µs) that counted older live replicas of
// an older release, and found a hold (held) and both marks (marked) or
// not: every heartbeat since one at least finalizeAfter ago counted no
// older replica and no hold, and a mark is missing.
func (r *replicas) finalizeDue(older int64, held, marked bool, now int64) bool {
	if older > 0 || held || r.finalizeAfter <= 0 {
		r.allClear.Store(0)
		return false
	}
	since := r.allClear.Load()
	if since == 0 {
		r.allClear.Store(now)
		return false
	}
	return !marked && now-since >= r.finalizeAfter.Microseconds()
}

// finalizeNow finalizes on this replica's own judgment (finalizeDue). The
// script checks the census and the hold again, atomically, so a replica
// of an older release or a hold that appeared since the heartbeat still
// stops it. The next heartbeat reads the marks.
func (r *replicas) finalizeNow(ctx context.Context) {
	res, err := runFinalize(ctx, r, true)
	if err != nil || res[0] == 0 || res[2] == 1 {
		return
	}
	if r.log != nil {
		r.log.Info("ratelimit: finalized the records: no replica of an older release and no hold for the finalize period",
			"finalize_after", r.finalizeAfter)
	}
}

// inForce returns a mark as read (text, mark) while it is in force: set,
// and no live replica of a release before its level (older; as
// observeFinal and observeBlocks hold it), else "".
func inForce(text string, mark, older int64) string {
	if mark > 0 && older == 0 {
		return text
	}
	return ""
}

// blockView is a replica's view of the blocks mark: whether blocks are in
// force (grant) and coarse records read (read) until until (Unix ns), and
// until when coarse records are read regardless (readUntil: blockLife
// and heartbeatTTL after blocks were last in force).
type blockView struct {
	grant, read      bool
	until, readUntil int64
}

// observeBlocks takes what a heartbeat read at at: the blocks mark (µs, 0:
// none) and the live replicas of releases before blocks.
func (r *replicas) observeBlocks(mark, older int64, at time.Time) {
	v := &blockView{grant: mark > 0 && older == 0, read: mark > 0, until: at.Add(heartbeatTTL).UnixNano()}
	if old := r.blk.Load(); old != nil {
		v.readUntil = old.readUntil
	}
	if v.grant {
		v.readUntil = at.Add(heartbeatTTL + blockLife).UnixNano()
	}
	r.blk.Store(v)
	r.met.blocksInForce.Set(boolGauge(v.grant))
	if mark > 0 {
		// With the blocks mark set, a replica of any release before this
		// one is a rollback begun without undoing it: the gauges the
		// alert reads say so (observeFinal counts only those before
		// records could be finalized).
		r.met.olderReplicas.Set(float64(older))
		r.met.finalizeMark.Set(1)
		if older > 0 && r.warnedBlocks.CompareAndSwap(false, true) && r.log != nil {
			r.log.Warn("ratelimit: blocks are in force by the finalize mark but replicas of an older release are live: no new blocks are granted; run 'petstore limits finalize --undo' before rolling back",
				"older_replicas", older)
		}
	}
	if older == 0 {
		r.warnedBlocks.Store(false)
	}
}

// grantsBlocks reports whether blocks are in force on this replica.
func (r *replicas) grantsBlocks() bool {
	if r == nil {
		return false
	}
	v := r.blk.Load()
	return v != nil && v.grant && time.Now().UnixNano() < v.until
}

// callPlan returns the plan a round trip for a request under pl is sent
// under: pl with its short windows' coarse records (plan.blk) while this
// replica reads them (readsCoarse, or always with force: the blocks
// hook), else pl.
func (r *replicas) callPlan(pl *plan, force bool) *plan {
	if pl.blk != nil && (force || r.readsCoarse()) {
		return pl.blk
	}
	return pl
}

// readsCoarse reports whether this replica's round trips read coarse
// records: blocks may be spent somewhere.
func (r *replicas) readsCoarse() bool {
	if r == nil {
		return false
	}
	v := r.blk.Load()
	if v == nil {
		return false
	}
	now := time.Now().UnixNano()
	return v.read && now < v.until || now < v.readUntil
}

// finState is a replica's view of the mark: the script's argument (the
// time passed to it, µs, in decimal: the mark's, or later, observeFinal)
// and until when the view holds without a newer heartbeat (Unix ns).
type finState struct {
	arg   any
	until int64
}

// errNoRedis is the answer of a Limiter without Redis to what only Redis
// keeps.
var errNoRedis = errors.New("ratelimit: no Redis configured")

// notFinalized is the script's argument for "not finalized".
var notFinalized any = "0"

// finalized returns the script's argument (script.go, ARGV[2]): the
// finalize time while the mark is in force on this replica, else "0".
func (r *replicas) finalized() any {
	if r == nil {
		return notFinalized
	}
	f := r.fin.Load()
	if f == nil || time.Now().UnixNano() >= f.until {
		return notFinalized
	}
	return f.arg
}

// observeFinal takes what a heartbeat read at Redis time now (µs): the
// mark (µs, 0: none) and the live replicas of older releases. The time
// passed to the script is the later of the mark and clear, the first
// heartbeat since which this replica has counted no older replica: every
// write of an older release was made before it (one that left the census
// withdrew after its last decision, or stopped beating before its last
// one and was dropped heartbeatTTL later), so epochs that began before
// it keep setting expiries on every head move. A rollback begun without
// undoing the mark and then rolled forward again is safe this way, once
// the older replicas are counted; what they write before a heartbeat
// counts them is not (ratelimit/README.md, Finalizing).
func (r *replicas) observeFinal(mark, older, now int64, at time.Time) {
	r.met.olderReplicas.Set(float64(older))
	r.met.finalizeMark.Set(boolGauge(mark > 0))
	if older > 0 {
		r.clear.Store(0)
	} else if r.clear.Load() == 0 {
		r.clear.Store(now)
	}
	if mark > 0 && older == 0 {
		fin := max(mark, r.clear.Load())
		r.fin.Store(&finState{arg: strconv.FormatInt(fin, 10), until: at.Add(heartbeatTTL).UnixNano()})
		r.met.finalized.Set(1)
	} else {
		r.fin.Store(nil)
		r.met.finalized.Set(0)
	}
	if mark > 0 && older > 0 && r.warnedOlder.CompareAndSwap(false, true) && r.log != nil {
		r.log.Warn("ratelimit: records are finalized but replicas of an older release are live: expiries are set on every head move again; run 'petstore limits finalize --undo' before rolling back",
			"older_replicas", older)
	} else if older == 0 {
		r.warnedOlder.Store(false)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// forget drops the view of the mark and of the census (a heartbeat
// failed: older replicas may come and go unseen).
func (r *replicas) forget() {
	r.fin.Store(nil)
	r.clear.Store(0)
	r.allClear.Store(0)
	r.met.finalized.Set(0)
	// Blocks granted while the view held may still be spent elsewhere:
	// coarse records are read until readUntil.
	if old := r.blk.Load(); old != nil {
		r.blk.Store(&blockView{readUntil: old.readUntil})
	}
	r.met.blocksInForce.Set(0)
}

// finalizeScript (lua/finalize.lua) counts the live replicas of releases
// before this one's last level (in the census KEYS[1] and not in KEYS[2],
// members silent for ARGV[1] ms dropped) and, when there are none, sets
// the marks KEYS[3] (records) and KEYS[4] (blocks) to the server's time in
// µs where they are not set. ARGV[2] is "auto" for a replica finalizing by
// itself, refused while the hold KEYS[5] is set; an operator's finalizing
// lifts the hold. It returns the records mark (0 when refused), the count,
// whether both marks were set already, the blocks mark, and whether a hold
// refused it.
var finalizeScript = redis.NewScript(finalizeLua)

//go:embed lua/finalize.lua
var finalizeLua string

// runFinalize runs finalizeScript for r's census, marks and hold, auto
// (a replica's own judgment) or an operator's.
func runFinalize(ctx context.Context, r *replicas, auto bool) ([]int64, error) {
	mode := "operator"
	if auto {
		mode = "auto"
	}
	res, err := finalizeScript.Run(ctx, r.rdb, []string{r.key, r.final2, r.mark, r.mark2, r.hold}, heartbeatTTL.Milliseconds(), mode).Int64Slice()
	if err == nil && len(res) != 5 {
		err = fmt.Errorf("ratelimit: unexpected finalize reply %v", res)
	}
	return res, err
}

// OlderReplicasError is Finalize's refusal: replicas of a release before
// this one are live.
type OlderReplicasError struct{ Count int64 }

func (e *OlderReplicasError) Error() string {
	return fmt.Sprintf("ratelimit: %d live replica(s) of an older release; finalize once the rollout is done", e.Count)
}

// Finalize marks this release's records as finalized and puts blocks in
// force at once (see above; setting whichever mark is not set yet), lifts
// any hold, and returns
// the records mark's time, and whether both marks were set already (then
// they are kept: a records mark moved later would only make replicas
// refresh expiries on every head move again for an epoch, and the
// replicas' own census-clear time already covers a rollback and
// roll-forward made since). It refuses, with an *OlderReplicasError,
// while the census counts live replicas of a release before this one
// (the one before, which finalizes records but spends no blocks,
// included). Replicas put it in force within a heartbeat.
func (l *Limiter) Finalize(ctx context.Context) (at time.Time, already bool, err error) {
	if l.rdb == nil {
		return time.Time{}, false, errNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	res, err := runFinalize(ctx, l.replicas, false)
	if err != nil {
		return time.Time{}, false, err
	}
	if res[1] > 0 {
		return time.Time{}, false, &OlderReplicasError{Count: res[1]}
	}
	return time.UnixMicro(res[0]), res[2] == 1, nil
}

// Unfinalize holds finalizing back (Hold) and removes both marks: within
// Unfinalizing every replica
// refreshes expiries on every head move again and has stopped reading
// coarse records (and the blocks granted before have ended), and a
// release before this one may then be rolled back to. It returns after
// heartbeatTTL, by when every live replica has read the marks gone, and
// removes them again if they are back as they were: a replica that had
// not read them gone sets them again should Redis lose its dataset
// meanwhile (heldMarks).
func (l *Limiter) Unfinalize(ctx context.Context) error {
	if l.rdb == nil {
		return errNoRedis
	}
	r := l.replicas
	keys := []string{r.mark, r.mark2}
	tctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	pipe := l.rdb.TxPipeline()
	pipe.SetNX(tctx, r.hold, holdValue(), 0)
	mark := pipe.Get(tctx, r.mark)
	mark2 := pipe.Get(tctx, r.mark2)
	del := pipe.Del(tctx, keys...)
	_, _ = pipe.Exec(tctx)
	cancel()
	if err := del.Err(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(heartbeatTTL):
	}
	tctx, cancel = context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	return unmarkScript.Run(tctx, l.rdb, keys, mark.Val(), mark2.Val()).Err()
}

// Hold holds finalizing back (hold true): no replica finalizes by itself
// until an operator finalizes (Finalize) or lifts the hold (hold false).
// It changes nothing already finalized; Unfinalize holds and undoes.
func (l *Limiter) Hold(ctx context.Context, hold bool) error {
	if l.rdb == nil {
		return errNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	if hold {
		return l.rdb.SetNX(ctx, l.replicas.hold, holdValue(), 0).Err()
	}
	return l.rdb.Del(ctx, l.replicas.hold).Err()
}

// holdValue is what a hold holds: when it was set (Unix µs, this
// process's clock: the time is for people reading it).
func holdValue() string { return strconv.FormatInt(time.Now().UnixMicro(), 10) }

// unmarkScript (lua/unmark.lua) removes KEYS[i] where it holds ARGV[i] (a
// mark set again as it was, not a later finalizing's).
var unmarkScript = redis.NewScript(unmarkLua)

//go:embed lua/unmark.lua
var unmarkLua string

// Unfinalizing is how long after Unfinalize every replica has stopped
// writing records as finalized and reading coarse records, and every
// block granted before has ended: a heartbeat's TTL, a block's life and
// the heartbeat's TTL again (readsCoarse).
const Unfinalizing = 2*heartbeatTTL + blockLife

// FinalizeStatus is what the census and the mark say now.
type FinalizeStatus struct {
	// Finalized is the records mark's time, Blocks the blocks mark's,
	// Held when finalizing was held back; zero when not set.
	Finalized, Blocks, Held time.Time
	// Replicas counts the live replicas; Older those of a release before
	// this one (which Finalize refuses beside).
	Replicas, Older int64
}

// Finalization reads the mark and the census.
func (l *Limiter) Finalization(ctx context.Context) (FinalizeStatus, error) {
	var st FinalizeStatus
	if l.rdb == nil {
		return st, errNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	now, err := l.rdb.Time(ctx).Result()
	if err != nil {
		return st, err
	}
	from := strconv.FormatInt(now.Add(-heartbeatTTL).UnixMilli()+1, 10)
	pipe := l.rdb.Pipeline()
	r := l.replicas
	all := pipe.ZCount(ctx, r.key, from, "+inf")
	final := pipe.ZCount(ctx, r.final2, from, "+inf")
	mark := pipe.Get(ctx, r.mark)
	mark2 := pipe.Get(ctx, r.mark2)
	hold := pipe.Get(ctx, r.hold)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return st, err
	}
	st.Replicas = all.Val()
	st.Older = max(all.Val()-final.Val(), 0)
	if us, err := strconv.ParseInt(mark.Val(), 10, 64); err == nil && us > 0 {
		st.Finalized = time.UnixMicro(us)
	}
	if us, err := strconv.ParseInt(mark2.Val(), 10, 64); err == nil && us > 0 {
		st.Blocks = time.UnixMicro(us)
	}
	if us, err := strconv.ParseInt(hold.Val(), 10, 64); err == nil && us > 0 {
		st.Held = time.UnixMicro(us)
	}
	return st, nil
}
