package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Finalizing. A way of writing records that an older release cannot follow is
// used only while this replica's last heartbeat, at most heartbeatTTL ago, read
// its mark and counted no live replica of an older release; a replica that
// counts one goes back to the old way at its next heartbeat.

// Records level: finalized, a window record's expiry is set only when its head
// enters a new epoch (a quarter period). An older release sets it from now on
// every head move, so its write in mid-epoch could let a record expire before
// the epoch's events stop counting. Every writer of this release sets the same
// expiry for an epoch, never earlier than an older release would, so replicas
// yet to read the mark are safe beside those that have. Replicas of this
// release also beat in PREFIX{replicas}:final; the census less it is the older
// replicas. The mark means only "no replica of a release before this one": a
// later release whose finalized writes this one cannot read needs a census and
// mark of its own.
const (
	finalCensusSuffix = "{replicas}:final"
	finalMarkSuffix   = "{replicas}:finalized"
)

// Blocks level (lease.go): an older release neither reads nor writes coarse
// records, so it would admit without the blocks others spend. Replicas also
// beat in :final2 (staying in :final, where the release before counts them).
// Blocks are granted while this mark is in force; coarse records are read while
// it is read at all, and for blockLife and heartbeatTTL after the last grant,
// while blocks may still be spent. A rollback without Unfinalize may let a
// short window overshoot by the blocks being spent, for up to blockLife.
const (
	blocksCensusSuffix = "{replicas}:final2"
	blocksMarkSuffix   = "{replicas}:finalized2"
)

// Compact level (format.go): an older release cannot read a compact window
// record. Replicas also beat in :final3; new window records are written
// compact while this mark is in force (with the records level's), and read in
// either form always. Unfinalize writes them back as full rings (expandAll)
// once no replica writes them, so that an older release can read every one.
const (
	compactCensusSuffix = "{replicas}:final3"
	compactMarkSuffix   = "{replicas}:finalized3"
)

// The marks and the hold outlive a lost dataset (Redis restarted empty,
// flushed, failed over): finalizing is the operator's word that no older
// release runs, and a lost dataset does not start one. A heartbeat that finds a
// dataset token other than the one it last read restores, where missing and at
// their own times, the marks it held in force and the hold (heldMarks); records
// older than the marks were lost too. A loss just after Unfinalize would
// restore what was undone, so Unfinalize removes the marks again after
// heartbeatTTL; if a replica cut off meanwhile restores them later, the census
// holds them out of force.
const datasetSuffix = "{replicas}:dataset"

// holdSuffix is the operator's hold: no replica finalizes by itself while set.
const holdSuffix = "{replicas}:hold"

// heldMarks is what the last heartbeat found: marks in force, token and hold.
type heldMarks struct {
	mark, mark2, mark3, dataset, hold string
}

// finalizeDue reports whether to finalize by itself at Redis time now (µs): no
// older replica and no hold for finalizeAfter, and a mark missing.
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

// finalizeNow finalizes on this replica's judgment; the script re-checks census
// and hold atomically, in case either changed since the heartbeat.
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

// inForce returns text while mark is set and no older replica is live, else "".
func inForce(text string, mark, older int64) string {
	if mark > 0 && older == 0 {
		return text
	}
	return ""
}

// blockView is the blocks mark's view: grant and read hold until until (Unix
// ns); coarse records are read regardless until readUntil.
type blockView struct {
	grant, read      bool
	until, readUntil int64
}

// observeBlocks takes a heartbeat's blocks mark (µs, 0: none) and older count.
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
		// Marked, an older replica is a rollback without undo: gauges say so.
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

// callPlan returns pl.blk (pl with coarse records) while they are read, or with
// force (the blocks hook); else pl.
func (r *replicas) callPlan(pl *plan, force bool) *plan {
	if pl.blk != nil && (force || r.readsCoarse()) {
		return pl.blk
	}
	return pl
}

// readsCoarse reports whether round trips read coarse records.
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

// finState is the records mark's view: the script's argument (µs, decimal) and
// until when it holds without a newer heartbeat (Unix ns).
type finState struct {
	arg   any
	until int64
}

// errNoRedis answers, without Redis, what only Redis keeps.
var errNoRedis = errors.New("ratelimit: no Redis configured")

// notFinalized is the script's argument for "not finalized".
var notFinalized any = "0"

// finalized returns ARGV[2]: the finalize time while in force, else "0".
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

// observeFinal takes a heartbeat's records mark (µs, 0: none) and older count
// at Redis time now (µs). The script gets the later of the mark and clear, the
// first heartbeat counting no older replica: every older write came before
// clear (a replica leaves the census after its last decision, or heartbeatTTL
// after its last beat), so epochs begun before it keep per-move expiries. What
// older replicas write before being counted may let a window overshoot, for up
// to a period.
func (r *replicas) observeFinal(mark, older, now int64, at time.Time, compact bool) {
	r.met.olderReplicas.Set(float64(older))
	r.met.finalizeMark.Set(boolGauge(mark > 0))
	if older > 0 {
		r.clear.Store(0)
	} else if r.clear.Load() == 0 {
		r.clear.Store(now)
	}
	if mark > 0 && older == 0 {
		arg := strconv.FormatInt(max(mark, r.clear.Load()), 10)
		if compact {
			// The script reads a trailing "c" as the compact level (run.lua).
			arg += "c"
		}
		r.fin.Store(&finState{arg: arg, until: at.Add(heartbeatTTL).UnixNano()})
		r.met.compactRecords.Set(boolGauge(compact))
		r.met.finalized.Set(1)
	} else {
		r.fin.Store(nil)
		r.met.finalized.Set(0)
		r.met.compactRecords.Set(0)
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

// forget drops what a failed heartbeat may have hidden: the clear time, the
// run towards finalizing by itself, and block grants. The records view holds
// until it lapses, heartbeatTTL after the heartbeat that read it, as it would
// had this heartbeat been slow rather than failed (the rule at the top of this
// file). Dropped at once, a heartbeat that failed across a Redis restart had
// every key this replica decided over the next second write its records as
// full rings: a free key's day record stayed one (1,225 bytes, not 19) until
// its next bucket, up to seven minutes on.
func (r *replicas) forget() {
	r.clear.Store(0)
	r.allClear.Store(0)
	// Blocks granted meanwhile may still be spent elsewhere.
	if old := r.blk.Load(); old != nil {
		r.blk.Store(&blockView{readUntil: old.readUntil})
	}
	r.met.blocksInForce.Set(0)
}

// finalizeScript (lua/finalize.lua) drops census members silent for ARGV[1] ms
// and, if no older replica (in KEYS[1], not KEYS[2]) is live, sets the marks
// KEYS[3] (records), KEYS[4] (blocks) and KEYS[6] (compact) where unset to
// the server's µs. ARGV[2] "auto" is refused while the hold KEYS[5] is set; an
// operator's run lifts it. Reply: records mark (0: refused), older count, all
// set already, blocks mark, refused by the hold, compact mark.
var finalizeScript = redis.NewScript(finalizeLua)

//go:embed lua/finalize.lua
var finalizeLua string

// runFinalize runs finalizeScript for r, auto (by itself) or an operator's.
func runFinalize(ctx context.Context, r *replicas, auto bool) ([]int64, error) {
	mode := "operator"
	if auto {
		mode = "auto"
	}
	res, err := finalizeScript.Run(ctx, r.rdb, []string{r.key, r.final3, r.mark, r.mark2, r.hold, r.mark3}, heartbeatTTL.Milliseconds(), mode).Int64Slice()
	if err == nil && len(res) != 6 {
		err = fmt.Errorf("ratelimit: unexpected finalize reply %v", res)
	}
	return res, err
}

// OlderReplicasError is Finalize's refusal: older replicas are live.
type OlderReplicasError struct{ Count int64 }

func (e *OlderReplicasError) Error() string {
	return fmt.Sprintf("ratelimit: %d live replica(s) of an older release; finalize once the rollout is done", e.Count)
}

// Finalize sets whichever mark is missing, lifts any hold, and returns the
// records mark's time and whether both were set already. A set mark is kept:
// moving it later would only bring back an epoch of per-move expiries, as clear
// (observeFinal) covers a rollback since. It refuses with *OlderReplicasError
// while an older replica is live. Replicas put it in force within a heartbeat.
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

// Unfinalize opens a rollback past this release: older replicas may start
// Unfinalizing after the call. It holds finalizing back, removes both marks,
// waits heartbeatTTL for every replica to read them gone, and removes them
// again if they are back as they were (heldMarks).
func (l *Limiter) Unfinalize(ctx context.Context) error {
	if l.rdb == nil {
		return errNoRedis
	}
	r := l.replicas
	keys := []string{r.mark, r.mark2, r.mark3}
	tctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	pipe := l.rdb.TxPipeline()
	pipe.SetNX(tctx, r.hold, holdValue(), 0)
	mark := pipe.Get(tctx, r.mark)
	mark2 := pipe.Get(tctx, r.mark2)
	mark3 := pipe.Get(tctx, r.mark3)
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
	if err := unmarkScript.Run(tctx, l.rdb, keys, mark.Val(), mark2.Val(), mark3.Val()).Err(); err != nil {
		return err
	}
	return r.expandAll(ctx)
}

// Hold holds finalizing back (hold true) until an operator finalizes or lifts
// it (hold false). It changes nothing already finalized.
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

// holdValue is when the hold was set (Unix µs, local clock: for people).
func holdValue() string { return strconv.FormatInt(time.Now().UnixMicro(), 10) }

// unmarkScript (lua/unmark.lua) removes KEYS[i] only if it still holds ARGV[i].
var unmarkScript = redis.NewScript(unmarkLua)

//go:embed lua/unmark.lua
var unmarkLua string

// Unfinalizing is how long after Unfinalize every replica has stopped writing
// finalized records and reading coarse records, and every block has ended.
const Unfinalizing = 2*heartbeatTTL + blockLife

// FinalizeStatus is what the census and the mark say now.
type FinalizeStatus struct {
	// Finalized, Blocks, Compact and Held are when the marks and the hold
	// were set.
	Finalized, Blocks, Compact, Held time.Time
	// Replicas counts the live replicas, Older those of an older release.
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
	final := pipe.ZCount(ctx, r.final3, from, "+inf")
	mark := pipe.Get(ctx, r.mark)
	mark2 := pipe.Get(ctx, r.mark2)
	mark3 := pipe.Get(ctx, r.mark3)
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
	if us, err := strconv.ParseInt(mark3.Val(), 10, 64); err == nil && us > 0 {
		st.Compact = time.UnixMicro(us)
	}
	if us, err := strconv.ParseInt(hold.Val(), 10, 64); err == nil && us > 0 {
		st.Held = time.UnixMicro(us)
	}
	return st, nil
}

// expandScript (lua/expand.lua, after the decision code's codec.lua,
// layout.lua and ring.lua) writes a compact window record back as a full ring.
var expandScript = redis.NewScript(codecLua + layoutLua + ringLua + expandLua)

//go:embed lua/expand.lua
var expandLua string

// expandFor answers a rollback begun without Unfinalize: a replica of an
// older release is live, which cannot read compact records. After
// heartbeatTTL, by when every replica of this release has stopped writing
// them, one replica of the fleet (expandLock) writes them all back as full
// rings. Until then the older replica's decisions of keys with compact
// records fail (and are made degraded). While the rollback lasts, the fleet
// looks again each time the lock lapses.
func (r *replicas) expandFor(ctx context.Context) {
	if !r.expanding.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.expanding.Store(false)
		select {
		case <-ctx.Done():
			return
		case <-time.After(heartbeatTTL):
		}
		ctx, cancel := context.WithTimeout(ctx, expandLock)
		defer cancel()
		if ok, err := r.rdb.SetNX(ctx, r.prefix+expandLockSuffix, r.id, expandLock).Result(); err != nil || !ok {
			return
		}
		err := r.expandAll(ctx)
		if r.log != nil {
			done := "wrote them back as full rings"
			if err != nil {
				done = "writing them back as full rings failed"
			}
			r.log.Warn("ratelimit: a replica of an older release is live while records are compact: "+done+"; run 'petstore limits finalize --undo' before rolling back",
				"error", err)
		}
	}()
}

// expandLockSuffix names the lock one replica holds while expanding; it
// lapses after expandLock, when another may start again.
const (
	expandLockSuffix = "{replicas}:expanding"
	expandLock       = 10 * time.Minute
)

// expandAll writes every compact window record under the prefix back as a
// full ring, on every primary, so that an older release can read them all.
// Unfinalize calls it once no replica writes them; it is safe beside
// decisions (a record is rewritten whole, in one script). A full ring is
// five or six times a quiet key's compact record (ten million quiet keys:
// about 24 GB more), so it stops before a primary has less than a fifth of
// its maxmemory (or, with none, of the machine's memory) free
// (errExpandRoom): the fleet's own writes keep room, and the records left
// compact fail only an older release's decisions.
func (r *replicas) expandAll(ctx context.Context) error {
	match := globEscape(r.prefix) + "{*}:w:*"
	each := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			if m := readMemory(ctx, c); m.limit() > 0 && m.used > m.limit()/5*4 {
				return fmt.Errorf("%w (%s uses %d of the %d bytes it may): the rest stay compact; raise maxmemory and run 'petstore limits finalize --undo' again", errExpandRoom, c.Options().Addr, m.used, m.limit())
			}
			pipe := c.Pipeline()
			for _, k := range batch {
				expandScript.Run(ctx, pipe, []string{k})
			}
			_, err := pipe.Exec(ctx)
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 500 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	}
	if err := expandScript.Load(ctx, r.rdb).Err(); err != nil {
		return err
	}
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, each)
	case *redis.Client:
		return each(ctx, c)
	}
	return fmt.Errorf("ratelimit: cannot scan a %T for compact records", r.rdb)
}

// errExpandRoom is expandAll stopped for want of memory.
var errExpandRoom = errors.New("ratelimit: Redis is short of memory to write compact records back as full rings")

// globEscape escapes SCAN MATCH's special characters in s.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
