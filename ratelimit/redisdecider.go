package ratelimit

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// redisDecider is the decider on Redis; the script (decideCore, below) keeps
// the promise, deciding a batch atomically at one reading of Redis's clock.
// This file only packs requests into calls (one Cluster slot, at most
// scriptBatch each), pipelines them, loads the code when Redis lacks it, and
// decodes replies; the limiter packs and decodes on the requests' own
// goroutines.
type redisDecider struct {
	rdb     redis.UniversalClient
	prefix  string
	sc      script
	log     *slog.Logger
	cluster bool // a Redis Cluster: each call holds one slot's keys
	// noFunctions is set once Redis is found without Functions: EVALSHA then.
	noFunctions atomic.Bool
	// finalized gives the script's finalize argument; nil: never finalized.
	finalized func() any
}

func newRedisDecider(rdb redis.UniversalClient, prefix string, log *slog.Logger) *redisDecider {
	_, cluster := rdb.(*redis.ClusterClient)
	return &redisDecider{rdb: rdb, prefix: prefix, sc: decisionScript(), log: log, cluster: cluster}
}

// pack packs key's decision under pl: its records' names and its numbers.
func (r *redisDecider) pack(key string, pl *plan, in input) decision {
	return decision{keys: seedKeys(r.prefix, key, in.seed, stateKeys(r.prefix, key, pl)), pl: pl, nums: scriptNums(pl, in)}
}

// fin is the finalize argument for the calls about to be sent.
func (r *redisDecider) fin() any {
	if r.finalized == nil {
		return notFinalized
	}
	return r.finalized()
}

// call reads its reply as strings: as any, each would be boxed.
func (r *redisDecider) call(ctx context.Context, ds []decision, fin any) *redis.StringSliceCmd {
	command, name := "fcall", r.sc.fn
	if r.noFunctions.Load() {
		command, name = "evalsha", r.sc.sha
	}
	return redis.NewStringSliceCmd(ctx, batchCall(command, name, ds, fin)...)
}

// decide decides reqs in order into out. A failed decision fails the
// batch; the others' verdicts stand. It packs and decodes here, where the
// limiter does so on each request's goroutine; the round trip (send,
// answer) is the one the batcher makes.
func (r *redisDecider) decide(ctx context.Context, reqs []request, out []verdict) error {
	ds := make([]decision, len(reqs))
	for i, q := range reqs {
		ds[i] = r.pack(q.key, q.pl, q.in)
	}
	var failed error
	sent, _ := r.send(ctx, ds, func(i int) int { return r.slot(ds[i]) })
	sent.answer(func(i int, reply string, err error) {
		if err == nil {
			err = decodeInto(ds[i].pl, reply, &out[i])
		}
		if failed == nil {
			failed = err
		}
	})
	return failed
}

// slot is d's Redis Cluster slot; 0 outside a cluster.
func (r *redisDecider) slot(d decision) int {
	if !r.cluster {
		return 0
	}
	return keySlot(d.keys[0])
}

// send sends ds in order as one pipeline of script calls (scriptCalls: runs
// of one slot by slot(i), at most scriptBatch each), giving Redis the code if
// it lacks it, and returns the pipeline's error, if any.
func (r *redisDecider) send(ctx context.Context, ds []decision, slot func(i int) int) (sentCalls, error) {
	s := sentCalls{spans: scriptCalls(len(ds), slot)}
	s.cmds = make([]*redis.StringSliceCmd, len(s.spans))
	fin := r.fin()
	for k, c := range s.spans {
		s.cmds[k] = r.call(ctx, ds[c.from:c.to], fin)
	}
	pipe := r.rdb.Pipeline()
	for _, c := range s.cmds {
		_ = pipe.Process(ctx, c)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return s, r.retry(ctx, s.cmds)
	}
	return s, nil
}

// sentCalls is a pipeline's script calls, each deciding a span of its batch.
type sentCalls struct {
	spans []callSpan
	cmds  []*redis.StringSliceCmd
}

// answer gives each decision sent its reply, or its call's error, in order.
func (s sentCalls) answer(f func(i int, reply string, err error)) {
	for k, c := range s.spans {
		rs, err := s.cmds[k].Val(), s.cmds[k].Err()
		if err == nil && len(rs) != c.to-c.from {
			err = fmt.Errorf("ratelimit: %d script replies for %d decisions", len(rs), c.to-c.from)
		}
		for i := c.from; i < c.to; i++ {
			reply := ""
			if err == nil {
				reply = rs[i-c.from]
			}
			f(i, reply, err)
		}
	}
}

// callSpan is one script call's decisions, from .. to-1 of a batch.
type callSpan struct{ from, to int }

// scriptCalls splits n decisions into calls: runs of one slot, ≤ scriptBatch.
func scriptCalls(n int, slot func(i int) int) []callSpan {
	var calls []callSpan
	for from := 0; from < n; {
		to := from + 1
		for to < n && to-from < scriptBatch && slot(to) == slot(from) {
			to++
		}
		calls = append(calls, callSpan{from, to})
		from = to
	}
	return calls
}

// retry resends the calls Redis refused for want of the decision code,
// once it has it, and returns the first error left.
func (r *redisDecider) retry(ctx context.Context, cmds []*redis.StringSliceCmd) error {
	var missing, unsupported, noscript bool
	for _, c := range cmds {
		switch err := c.Err(); {
		case err == nil:
		case isNoScript(err):
			noscript = true
		case isFunctionMissing(err):
			missing = true
		case isFunctionUnsupported(err):
			unsupported = true
		}
	}
	if missing && !unsupported {
		if err := r.loadFunction(ctx); err != nil && isFunctionUnsupported(err) {
			unsupported = true
		}
	}
	if unsupported && r.noFunctions.CompareAndSwap(false, true) {
		r.log.Info("ratelimit: Redis runs no Functions here; deciding with scripts (EVALSHA)", "reason", firstError(cmds))
	}
	if noscript || unsupported {
		// EVAL carries the source anyway; a load spares later NOSCRIPTs.
		_ = r.rdb.ScriptLoad(ctx, r.sc.src).Err()
	}
	if !missing && !unsupported && !noscript {
		return firstError(cmds)
	}
	again := func(command, name string, c *redis.StringSliceCmd) *redis.StringSliceCmd {
		return redis.NewStringSliceCmd(ctx, append([]any{command, name}, c.Args()[2:]...)...)
	}
	pipe := r.rdb.Pipeline()
	for i, c := range cmds {
		switch err := c.Err(); {
		case err == nil:
			continue
		case isFunctionMissing(err) && !unsupported:
			cmds[i] = again("fcall", r.sc.fn, c)
		case isNoScript(err) || isFunctionMissing(err) || isFunctionUnsupported(err):
			cmds[i] = again("eval", r.sc.src, c)
		default:
			continue
		}
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	return firstError(cmds)
}

// loadFunction loads the library on every master; already loaded is fine.
func (r *redisDecider) loadFunction(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, r.sc.library).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			err = nil
		}
		return err
	}
	return eachPrimary(ctx, r.rdb, load)
}

// eachPrimary runs f on every master of a Cluster, else on rdb itself.
func eachPrimary(ctx context.Context, rdb redis.UniversalClient, f func(context.Context, redis.Cmdable) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return f(ctx, c) })
	}
	return f(ctx, rdb)
}

func firstError(cmds []*redis.StringSliceCmd) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// isFunctionMissing reports a Function not loaded (a restart, FUNCTION FLUSH).
func isFunctionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// isFunctionUnsupported reports Redis before 7 or an ACL refusing Functions.
func isFunctionUnsupported(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(strings.ToLower(msg), "unknown command")
}

// nums appends a block ask's numbers past the five every ask has (scriptNums).
func (a *blockAsk) nums(pl *plan, b []byte) []byte {
	for _, v := range [5]int64{a.replicas, leaseMargin, minBlock, 2 * a.rtt, int64(pl.shortWindows())} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// Script modes.
const (
	modeDecide int64 = 0
	modePeek   int64 = 1
	// modeBlock decides, and counts a block (lease.go).
	modeBlock int64 = 2
)

// scriptNums packs one decision's numbers (decideCore's ARGV[1]): mode, extra
// strikes, lease asked, per-window adds (if any, or seeding), seeding numbers.
// A plain decision sends none: the script reads the defaults.
func scriptNums(pl *plan, in input) []byte {
	mode := modeDecide
	if in.peek {
		mode = modePeek
	} else if in.block != nil {
		mode = modeBlock
	}
	seed := in.seed.numbers()
	adds := slices.ContainsFunc(in.add, func(a int64) bool { return a != 0 })
	if mode == modeDecide && in.extra == 0 && in.lease == noLease && len(seed) == 0 && !adds {
		return nil
	}
	b := make([]byte, 0, 8*(10+len(pl.windows)+len(seed)))
	ask := [5]int64{mode, in.extra, in.lease.want, in.lease.need, in.lease.life}
	if mode == modeBlock {
		// A block: at most max, for blockLife; its own numbers follow.
		ask = [5]int64{mode, in.extra, in.block.max, 1, blockLife.Microseconds()}
	}
	for _, v := range ask {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	if mode == modeBlock {
		b = in.block.nums(pl, b)
	}
	if len(seed) > 0 || adds {
		for i := range pl.windows {
			var a int64
			if i < len(in.add) {
				a = in.add[i]
			}
			b = binary.BigEndian.AppendUint64(b, uint64(a))
		}
	}
	for _, v := range seed {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

type decision struct {
	keys []string
	pl   *plan
	nums []byte
}

// scriptBatch caps a call's decisions so it holds Redis well under a ms.
const scriptBatch = 64

// batchCall returns one script call deciding ds in order (decideCore). Keys go
// as pointers, which go-redis writes as strings: none is copied or boxed.
func batchCall(command, name string, ds []decision, fin any) []any {
	nkeys := 0
	for i := range ds {
		nkeys += len(ds[i].keys)
	}
	// Room for one plan's arguments, as a batch mostly has.
	cmd := make([]any, 0, 3+nkeys+5)
	cmd = append(cmd, command, name, nkeys)
	for i := range ds {
		for j := range ds[i].keys {
			cmd = append(cmd, &ds[i].keys[j])
		}
	}
	return appendBatchArgs(cmd, ds, fin)
}

// appendBatchArgs appends the ARGV deciding ds: the decisions' numbers,
// each behind its key count, plan index and number count; fin (when the
// records were finalized, µs, or "0"); each distinct plan's arguments, once.
func appendBatchArgs(args []any, ds []decision, fin any) []any {
	nbytes := 0
	for i := range ds {
		nbytes += 24 + len(ds[i].nums)
	}
	calls := make([]byte, 0, nbytes)
	plans := make([]*plan, 0, 4)
	for i := range ds {
		d := &ds[i]
		p := slices.Index(plans, d.pl)
		if p < 0 {
			p = len(plans)
			plans = append(plans, d.pl)
		}
		calls = binary.BigEndian.AppendUint64(calls, uint64(len(d.keys)))
		calls = binary.BigEndian.AppendUint64(calls, uint64(p+1))
		calls = binary.BigEndian.AppendUint64(calls, uint64(len(d.nums)/8))
		calls = append(calls, d.nums...)
	}
	args = append(args, calls, fin)
	for _, pl := range plans {
		args = append(args, pl.argv[:]...)
	}
	return args
}

// replyFields is the 8-byte integers in a full reply under pl (decideCore).
func (pl *plan) replyFields() int {
	n := 5 + 2*(len(pl.windows)+len(pl.candidates))
	if pl.ban.on {
		n += 4
	}
	if len(pl.candidates) > 0 {
		n += 4
	}
	if pl.cban.on {
		n += 4
	}
	return n
}

// shortReply reports whether an n-byte reply under pl is short, with the
// ban fields, or bare (decideCore). Lengths never collide: a full reply has
// at least four fields more than a short, which has three more than bare.
func (pl *plan) shortReply(n int) (short, banFields bool) {
	if len(pl.candidates) > 0 {
		return false, false
	}
	bare := 8 * (1 + 2*len(pl.windows))
	switch {
	case n == bare:
		return true, false
	case pl.ban.on && n == bare+8*3:
		return true, true
	}
	return false, false
}

// decodeInto decodes reply s under pl into out, unchanged on an error.
func decodeInto(pl *plan, s string, out *verdict) error {
	if strings.HasPrefix(s, "E") {
		return fmt.Errorf("ratelimit: script: %s", s[1:])
	}
	short, banFields := pl.shortReply(len(s))
	if !short && len(s) != 8*pl.replyFields() {
		return fmt.Errorf("ratelimit: unexpected script reply (%d bytes)", len(s))
	}
	at := 0
	next := func() int64 {
		v := int64(binary.BigEndian.Uint64([]byte(s[at : at+8])))
		at += 8
		return v
	}
	v := out
	// A caller may lend the windows' slice.
	buf := v.win
	if short {
		// One admission: Allowed, no wait, no lease, no new ban.
		*v = verdict{outcome: Allowed, granted: 1, now: next()}
	} else {
		*v = verdict{outcome: Outcome(next())}
		v.retry = next()
		v.now = next()
		v.granted = next()
		v.leaseEnd = next()
		banFields = pl.ban.on
		if banFields {
			v.newBan = next() == 1
		}
	}
	if banFields {
		v.strikes = next()
		v.banUntil = next()
		v.offences = next()
	}
	if len(pl.candidates) > 0 {
		v.cOutcome = Outcome(next())
		v.cAdm = next()
		v.cLim = next()
		v.cBan = next()
		if pl.cban.on {
			v.cNewBan = next() == 1
			v.cStrikes = next()
			v.cBanUntil = next()
			v.cOffences = next()
		}
	}
	window := func(r *ring) winVerdict {
		w := winVerdict{used: next()}
		w.remaining = max(r.limit-w.used, 0)
		w.reset = next()
		return w
	}
	if cap(buf) >= len(pl.windows) {
		v.win = buf[:len(pl.windows)]
	} else {
		v.win = make([]winVerdict, len(pl.windows))
	}
	for i := range v.win {
		v.win[i] = window(&pl.windows[i])
	}
	if len(pl.candidates) > 0 {
		v.cwin = make([]winVerdict, len(pl.candidates))
		for i := range v.cwin {
			v.cwin[i] = window(&pl.candidates[i])
		}
	}
	return nil
}

// isNoScript reports a lost script (SCRIPT FLUSH, a restart, a failover).
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.Contains(err.Error(), "NOSCRIPT"))
}

// decideCore is the decision code, the Lua files of lua/ as one chunk. It
// decides a batch (one pipeline flush, one Cluster slot) atomically, in order,
// at one reading of the server's clock, as keyState.decide (state.go) does, on
// format.go's records; a batch's decisions for one key see each other's writes.
//
// decide (lua/decide.lua) serves every request, each window's rules written
// once (lua/window.lua). It touches only the bytes it needs (GETRANGE,
// SETRANGE): Redis's Lua hashes every string it makes. No key is ever left
// without a TTL.
//
// KEYS, per decision: the ban record, the window records in plan order, the
// candidate window records, the candidate ban record (if any), the coarse
// records (lease.go), the other periods' records (registry.go; seeding.nums
// indexes them as if without the coarse records). All in its key's slot.
//
// ARGV[1], per decision, 8-byte big-endian: its KEYS count, its plan (from 1),
// how many numbers follow, then: mode (0 decide, 1 peek, 2 decide and count a
// block), extra strikes, lease want, need and life (µs), which in mode 2 are
// the largest block, 1 and the block's life, followed by the block's ask
// (blockAsk.nums); then, if any, per window the admissions made without Redis
// (input.add) and seeding.nums. A plain decision (mode 0, no strikes, a lease
// of one) sends none.
//
// ARGV[2]: "c" while finalized (compact records), else "0". ARGV[3p..3p+2]:
// plan p's numbers, ban and candidate ban multipliers. The numbers: window
// count; per window limit, period, bucket width, n, offset unit (µs), TTL (ms);
// the ban rule (banRule.appendNums); the candidate window count and the same
// six per candidate; the candidate ban rule; with blocks, the coarse count and
// per coarse record its window's index, period, width, n, unit and TTL.
//
// Leases: a decision counts want admissions at once when every window has need
// (>= want) left, else one, in every window's current bucket; they may be spent
// until the earliest end of those buckets, at most life after now, recorded as
// the bucket's last event (which only grows). A block (mode 2) counts the
// request in every window and its admissions at its end, in the long windows'
// records and the short ones' coarse records (none is granted without them);
// its size and end come back as a lease's (granted: 1 + size).
//
// Reply: a string per decision, in order, of 8-byte big-endian signed integers
// (decode), times in µs. Short form (admitted alone, no candidates: most
// replies): now; with a ban rule, strikes, ban end, offences; per window used
// and reset. Bare: short without the ban fields (no ban rule, or all 0). Whole,
// only what the plan has: outcome, retry, now, granted, lease end; with a ban
// rule, new ban, strikes, ban end, offences; with candidates, their outcome and
// admitted, limited and banned counts, and with a candidate ban rule a new ban,
// strikes, ban end, offences; per window, then per candidate window, used and
// reset. A failed decision is "E" and the error; the others go on.
var decideCore = joinDecisionCode()

// joinDecisionCode joins the decision code's files in their order.
func joinDecisionCode() string {
	return codecLua + layoutLua + ringLua + windowLua + banLua + blockSizeLua + decideFnLua + runLua
}

// The decision code's files, in order: each uses those before it. codec.lua
// starts every script; layout.lua, the records' layout, follows it in every
// script that reads records.
var (
	//go:embed lua/codec.lua
	codecLua string
	//go:embed lua/layout.lua
	layoutLua string
	//go:embed lua/ring.lua
	ringLua string
	//go:embed lua/window.lua
	windowLua string
	//go:embed lua/ban.lua
	banLua string
	//go:embed lua/blocksize.lua
	blockSizeLua string
	//go:embed lua/decide.lua
	decideFnLua string
	//go:embed lua/run.lua
	runLua string
)

// decideLua is decideCore as a script (EVAL, EVALSHA).
var decideLua = asScript(decideCore)

func asScript(core string) string {
	return core + "\nreturn run(_G.KEYS, _G.ARGV)\n"
}

// decideLibrary returns decideCore as Function library lib registering fn: its
// code runs once, at load, where a script re-creates its helpers every call.
func decideLibrary(lib, fn string) string {
	return "#!lua name=" + lib + "\n" + decideCore + `
redis.register_function('` + fn + `', function(keys, args) return run(keys, args) end)
`
}

// script is the decision code as a script and as a Function library, named by a
// digest of the code: releases whose code differs load their own side by side.
type script struct {
	src, sha    string
	library, fn string
}

// decisionScript returns the decision code.
func decisionScript() script {
	sum := sha1.Sum([]byte(decideLua))
	sha := hex.EncodeToString(sum[:])
	core := sha1.Sum([]byte(decideCore))
	name := "petstore_ratelimit_" + hex.EncodeToString(core[:8])
	return script{src: decideLua, sha: sha, library: decideLibrary(name, name+"_decide"), fn: name + "_decide"}
}
