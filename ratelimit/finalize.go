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

// Finalized, a replica writes records in two ways an older release cannot
// follow, both in force together under one mark:
//   - Blocks are granted (lease.go). An older release neither reads nor writes
//     coarse records, so it would admit without the blocks others spend. Coarse
//     records are read while the mark is read at all, and for blockLife and
//     heartbeatTTL after the last grant, while blocks may still be spent. A
//     rollback without Unfinalize may let a short window overshoot by the blocks
//     being spent, for up to blockLife.
//   - New window records are written compact (format.go), and read in either
//     form always. Unfinalize writes them back as full rings (expandAll) once no
//     replica writes them, so that an older release can read every one.
//
// Replicas of this release also beat in PREFIX{replicas}:final4; the census less
// it is the older replicas. The 4 is the level: releases before this one
// finalized in steps of their own (the censuses :final to :final3, the marks
// :finalized to :finalized3), and each counts only the replicas in its own
// census, so this release and those count each other as older and none
// finalizes beside another. A later release whose finalized writes this one
// cannot follow takes the next level.
const (
	finalCensusSuffix = "{replicas}:final4"
	finalMarkSuffix   = "{replicas}:finalized4"
)

// The mark and the hold outlive a lost dataset (Redis restarted empty,
// flushed, failed over): finalizing is the operator's word that no older
// release runs, and a lost dataset does not start one. A heartbeat that finds a
// dataset token other than the one it last read restores, where missing and at
// its own time, the mark it held in force, and the hold (heldMarks); records
// older than the mark were lost too. A loss just after Unfinalize would
// restore what was undone, so Unfinalize removes the mark again after
// heartbeatTTL; if a replica cut off meanwhile restores it later, the census
// holds it out of force.
const datasetSuffix = "{replicas}:dataset"

// holdSuffix is the operator's hold: no replica finalizes by itself while set.
const holdSuffix = "{replicas}:hold"

// heldMarks is what the last heartbeat found: the mark in force, token and hold.
type heldMarks struct {
	mark, dataset, hold string
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

// view is what this replica's last heartbeat read of the mark, which holds
// until until (Unix ns): records written compact (finalized), blocks granted,
// coarse records read; coarse records are read regardless until readUntil,
// while blocks granted here may still be spent.
type view struct {
	finalized, grant, read bool
	until, readUntil       int64
}

// grantsBlocks reports whether blocks are in force on this replica.
func (r *replicas) grantsBlocks() bool {
	if r == nil {
		return false
	}
	v := r.view.Load()
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
	v := r.view.Load()
	if v == nil {
		return false
	}
	now := time.Now().UnixNano()
	return v.read && now < v.until || now < v.readUntil
}

// errNoRedis answers, without Redis, what only Redis keeps.
var errNoRedis = errors.New("ratelimit: no Redis configured")

// The script's argument ARGV[2]: a trailing "c" has it write new window
// records compact (run.lua).
var notFinalized, compactRecords any = "0", "c"

// finalized returns ARGV[2]: compactRecords while finalized, else notFinalized.
func (r *replicas) finalized() any {
	if r == nil {
		return notFinalized
	}
	v := r.view.Load()
	if v == nil || !v.finalized || time.Now().UnixNano() >= v.until {
		return notFinalized
	}
	return compactRecords
}

// observe takes a heartbeat's mark (µs, 0: none) and older count, read at at.
func (r *replicas) observe(mark, older int64, at time.Time) {
	on := mark > 0 && older == 0
	v := &view{finalized: on, grant: on, read: mark > 0, until: at.Add(heartbeatTTL).UnixNano()}
	if old := r.view.Load(); old != nil {
		v.readUntil = old.readUntil
	}
	if on {
		v.readUntil = at.Add(heartbeatTTL + blockLife).UnixNano()
	}
	r.view.Store(v)
	r.met.olderReplicas.Set(float64(older))
	r.met.finalizeMark.Set(boolGauge(mark > 0))
	r.met.finalized.Set(boolGauge(on))
	r.met.blocksInForce.Set(boolGauge(on))
	if mark > 0 && older > 0 && r.warned.CompareAndSwap(false, true) && r.log != nil {
		r.log.Warn("ratelimit: records are finalized but replicas of an older release are live: no blocks are granted and new records are full rings; run 'petstore limits finalize --undo' before rolling back",
			"older_replicas", older)
	} else if older == 0 {
		r.warned.Store(false)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// forget drops what a failed heartbeat may have hidden: the run towards
// finalizing by itself, and block grants. Compact records are written until
// the view lapses, heartbeatTTL after the heartbeat that read it, as it would
// had this heartbeat been slow rather than failed (the rule at the top of this
// file). Dropped at once, a heartbeat that failed across a Redis restart had
// every key this replica decided over the next second write its records as
// full rings: a free key's day record stayed one (1,225 bytes, not 19) until
// its next bucket, up to seven minutes on.
func (r *replicas) forget() {
	r.allClear.Store(0)
	// Blocks granted meanwhile may still be spent elsewhere.
	if old := r.view.Load(); old != nil {
		v := *old
		v.grant, v.read = false, false
		r.view.Store(&v)
	}
	r.met.blocksInForce.Set(0)
}

// finalizeScript (lua/finalize.lua) drops census members silent for ARGV[1] ms
// and, if no older replica (in KEYS[1], not KEYS[2]) is live, sets the mark
// KEYS[3] where unset to the server's µs. ARGV[2] "auto" is refused while the
// hold KEYS[4] is set; an operator's run lifts it. Reply: the mark (0:
// refused), older count, set already, refused by the hold.
var finalizeScript = redis.NewScript(finalizeLua)

//go:embed lua/finalize.lua
var finalizeLua string

// runFinalize runs finalizeScript for r, auto (by itself) or an operator's.
func runFinalize(ctx context.Context, r *replicas, auto bool) ([]int64, error) {
	mode := "operator"
	if auto {
		mode = "auto"
	}
	res, err := finalizeScript.Run(ctx, r.rdb, []string{r.key, r.final, r.mark, r.hold}, heartbeatTTL.Milliseconds(), mode).Int64Slice()
	if err == nil && len(res) != 4 {
		err = fmt.Errorf("ratelimit: unexpected finalize reply %v", res)
	}
	return res, err
}

// OlderReplicasError is Finalize's refusal: older replicas are live.
type OlderReplicasError struct{ Count int64 }

func (e *OlderReplicasError) Error() string {
	return fmt.Sprintf("ratelimit: %d live replica(s) of an older release; finalize once the rollout is done", e.Count)
}

// Finalize sets the mark if missing, lifts any hold, and returns the mark's
// time and whether it was set already. It refuses with *OlderReplicasError
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
// Unfinalizing after the call. It holds finalizing back, removes the mark,
// waits heartbeatTTL for every replica to read it gone, removes it again if
// it is back as it was (heldMarks), and writes compact records back.
func (l *Limiter) Unfinalize(ctx context.Context) error {
	if l.rdb == nil {
		return errNoRedis
	}
	r := l.replicas
	tctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	pipe := l.rdb.TxPipeline()
	pipe.SetNX(tctx, r.hold, holdValue(), 0)
	mark := pipe.Get(tctx, r.mark)
	del := pipe.Del(tctx, r.mark)
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
	if err := unmarkScript.Run(tctx, l.rdb, []string{r.mark}, mark.Val()).Err(); err != nil {
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

// unmarkScript (lua/unmark.lua) removes KEYS[1] only if it still holds ARGV[1].
var unmarkScript = redis.NewScript(unmarkLua)

//go:embed lua/unmark.lua
var unmarkLua string

// Unfinalizing is how long after Unfinalize every replica has stopped writing
// finalized records and reading coarse records, and every block has ended.
const Unfinalizing = 2*heartbeatTTL + blockLife

// FinalizeStatus is what the census and the mark say now.
type FinalizeStatus struct {
	// Finalized and Held are when the mark and the hold were set.
	Finalized, Held time.Time
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
	final := pipe.ZCount(ctx, r.final, from, "+inf")
	mark := pipe.Get(ctx, r.mark)
	hold := pipe.Get(ctx, r.hold)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return st, err
	}
	st.Replicas = all.Val()
	st.Older = max(all.Val()-final.Val(), 0)
	if us, err := strconv.ParseInt(mark.Val(), 10, 64); err == nil && us > 0 {
		st.Finalized = time.UnixMicro(us)
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

// memory is what INFO memory says of a primary's room (bytes); zero, or
// empty, where it does not say (miniredis, an ACL refusing INFO).
type memory struct {
	used, maxmemory, machine int64
	policy                   string // maxmemory-policy
}

func readMemory(ctx context.Context, c redis.Cmdable) memory {
	info, _ := c.Info(ctx, "memory").Result()
	return memoryFields(info)
}

// memoryFields reads memory from the text of INFO memory.
func memoryFields(info string) memory {
	var m memory
	for _, line := range strings.Split(info, "\n") {
		name, value, _ := strings.Cut(strings.TrimSpace(line), ":")
		n, _ := strconv.ParseInt(value, 10, 64)
		switch name {
		case "used_memory":
			m.used = n
		case "maxmemory":
			m.maxmemory = n
		case "total_system_memory":
			m.machine = n
		case "maxmemory_policy":
			m.policy = value
		}
	}
	return m
}

// limit is the most a primary may use: its maxmemory or, with none, the
// machine's memory; 0 when INFO does not say.
func (m memory) limit() int64 {
	if m.maxmemory > 0 {
		return m.maxmemory
	}
	return m.machine
}

// full reports a primary that refuses writes (OOM), or is within 1% of
// doing so: one at its maxmemory under noeviction. Other policies evict.
// Such a primary takes a write now and then, as keys expire; the 1% lets
// room build up before decisions resume.
func (m memory) full() bool {
	return m.policy == "noeviction" && m.maxmemory > 0 && m.used > m.maxmemory-m.maxmemory/100
}
