package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The decider on Redis. Its promise is the decision code's (script.go):
// every request of a batch is decided atomically on the server, in order,
// at one reading of the server's clock, against the records format.go
// describes. This file does the rest and nothing more: it packs requests
// into script calls (one Redis Cluster slot and at most scriptBatch
// decisions a call), sends them in one pipeline, gives Redis the decision
// code when it lacks it, and decodes the replies. The batcher (batch.go)
// gathers concurrent requests into its pipelines; the limiter packs and
// decodes them on the requests' own goroutines (pack, decodeInto).
type redisDecider struct {
	rdb    redis.UniversalClient
	prefix string
	sc     script
	log    *slog.Logger
	// noFunctions is set once Redis is found without Functions (before
	// Redis 7, or an ACL that refuses FCALL or FUNCTION LOAD): the calls
	// then go as scripts (EVALSHA).
	noFunctions atomic.Bool
	// finalized is the script's finalize argument (finalize.go); nil:
	// never finalized.
	finalized func() any
}

func newRedisDecider(rdb redis.UniversalClient, prefix string, log *slog.Logger) *redisDecider {
	return &redisDecider{rdb: rdb, prefix: prefix, sc: decisionScript(), log: log}
}

// pack returns the decision the script makes for key under pl asked in:
// its records (names, when the caller has them: stateKeys under pl; the
// records of the periods in.seed names follow) and its numbers.
func (r *redisDecider) pack(key string, pl *plan, in input, names []string) decision {
	if names == nil {
		names = stateKeys(r.prefix, key, pl)
	}
	return decision{keys: seedKeys(r.prefix, key, in.seed, names), pl: pl, nums: scriptNums(pl, in)}
}

// fin is the finalize argument of the calls about to be sent.
func (r *redisDecider) fin() any {
	if r.finalized == nil {
		return notFinalized
	}
	return r.finalized()
}

// call returns the script call that decides ds, decisions of one slot
// (at most scriptBatch), with the finalize argument fin. Its reply is
// read as an array of strings, one a decision: a reply read as any would
// box each string (an allocation a decision).
func (r *redisDecider) call(ctx context.Context, ds []decision, fin any) *redis.StringSliceCmd {
	command, name := "fcall", r.sc.fn
	if r.noFunctions.Load() {
		command, name = "evalsha", r.sc.sha
	}
	return redis.NewStringSliceCmd(ctx, batchCall(command, name, ds, fin)...)
}

// send sends cmds (call) in one pipeline and returns the first error.
// The code runs as a Function (FCALL) unless Redis has none; a server
// that has not loaded the Function (a new or restarted server, FUNCTION
// FLUSH) is given it and asked again, and so is one that does not know
// the script (NOSCRIPT after SCRIPT FLUSH, a restart or a failover), with
// EVAL (retry).
func (r *redisDecider) send(ctx context.Context, cmds []*redis.StringSliceCmd) error {
	pipe := r.rdb.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return r.retry(ctx, cmds)
	}
	return nil
}

// decide decides reqs in order into out (decider): in calls of at most
// scriptBatch decisions, each of one Redis Cluster slot, sent in one
// pipeline. A
// decision that failed fails the batch; the others' verdicts stand.
func (r *redisDecider) decide(ctx context.Context, reqs []request, out []verdict) error {
	ds := make([]decision, len(reqs))
	for i, q := range reqs {
		ds[i] = r.pack(q.key, q.pl, q.in, nil)
	}
	fin := r.fin()
	_, cluster := r.rdb.(*redis.ClusterClient)
	slot := func(i int) int {
		if !cluster {
			return 0
		}
		return keySlot(ds[i].keys[0])
	}
	var cmds []*redis.StringSliceCmd
	var from []int
	for i := 0; i < len(ds); {
		j := i + 1
		for j < len(ds) && j-i < scriptBatch && slot(j) == slot(i) {
			j++
		}
		cmds, from = append(cmds, r.call(ctx, ds[i:j], fin)), append(from, i)
		i = j
	}
	from = append(from, len(ds))
	err := r.send(ctx, cmds)
	for k, c := range cmds {
		rs, cerr := c.Val(), c.Err()
		if cerr == nil && len(rs) != from[k+1]-from[k] {
			cerr = fmt.Errorf("ratelimit: %d script replies for %d decisions", len(rs), from[k+1]-from[k])
		}
		if cerr != nil {
			err = cerr
			continue
		}
		for j, s := range rs {
			if derr := decodeInto(ds[from[k]+j].pl, s, &out[from[k]+j]); derr != nil && err == nil {
				err = derr
			}
		}
	}
	return err
}

// retry sends again the calls of a pipeline (batchCall) that Redis
// refused for want of the decision code, once it has it, and returns the
// pipeline's error after: the first call's error, if any.
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
		// EVAL below carries the source anyway, so a failed load costs
		// nothing; a successful one spares the next pipelines another
		// NOSCRIPT.
		_ = r.rdb.ScriptLoad(ctx, r.sc.src).Err()
	}
	if !missing && !unsupported && !noscript {
		return firstError(cmds)
	}
	// The same call under another command and name: its key count, keys
	// and arguments as they were.
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

// loadFunction loads the decision code's library (on every master of a
// cluster); one that another replica loaded first is no error.
func (r *redisDecider) loadFunction(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, r.sc.library).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			err = nil
		}
		return err
	}
	if cc, ok := r.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, r.rdb)
}

// firstError returns the first error of cmds.
func firstError(cmds []*redis.StringSliceCmd) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// isFunctionMissing reports whether err says the server has not loaded
// the Function (a new or restarted server, FUNCTION FLUSH).
func isFunctionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// isFunctionUnsupported reports whether err says the server cannot run
// Functions for this client: a server before Redis 7, or an ACL that
// refuses FCALL or FUNCTION LOAD.
func isFunctionUnsupported(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(strings.ToLower(msg), "unknown command")
}
