package ratelimit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// fakeClock is one clock for a test: the limiter's local time and, when a
// miniredis is attached, the server's TIME and TTLs.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	mini *miniredis.Miniredis
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
	if c.mini != nil {
		c.mini.SetTime(t)
	}
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	t := c.Now().Add(d)
	c.Set(t)
	return t
}

// commandCounter counts commands sent by a client, and among them the
// calls of the decision code (FCALL, EVALSHA and EVAL) in scripts.
type commandCounter struct{ n, scripts atomic.Int64 }

func (c *commandCounter) count(cmd redis.Cmder) {
	c.n.Add(1)
	if name := cmd.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
		c.scripts.Add(1)
	}
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// fixture is a Limiter on a miniredis with one shared fake clock.
type fixture struct {
	l    *Limiter
	mini *miniredis.Miniredis
	rdb  *redis.Client
	clk  *fakeClock
	cmds *commandCounter
	reg  *prometheus.Registry
	logs *testenv.Buffer
}

var epoch = time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	return newFixtureWith(t, opts, hooks{})
}

// newFixtureWith is newFixture with h's hooks beside its own (the clock,
// no heartbeats).
func newFixtureWith(t *testing.T, opts Options, h hooks) *fixture {
	t.Helper()
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	clk := &fakeClock{mini: m}
	clk.Set(epoch)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	cmds := &commandCounter{}
	rdb.AddHook(cmds)
	t.Cleanup(func() { _ = rdb.Close() })
	f := &fixture{mini: m, rdb: rdb, clk: clk, cmds: cmds, reg: prometheus.NewRegistry(), logs: &testenv.Buffer{}}
	h.clock = clk.Now
	// Heartbeats run on real time and would be counted among the scripts;
	// the fake clock's tests set the replica count themselves.
	h.noHeartbeat = true
	opts.Registerer = f.reg
	opts.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	if opts.Timeout == 0 {
		// miniredis runs Lua interpreted in Go, far slower than Redis; the
		// race detector slows it further.
		opts.Timeout = 2 * time.Second
	}
	l, err := newLimiter(rdb, opts, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	f.l = l
	return f
}

// fleet returns f's limiter and n-1 more on its Redis and clock, each
// counting n replicas and failing as f's does: a fleet on the fake clock.
func (f *fixture) fleet(t *testing.T, n int) []*Limiter {
	t.Helper()
	ls := []*Limiter{f.l}
	for range n - 1 {
		l, err := newLimiter(f.rdb, Options{Timeout: 2 * time.Second, Replicas: n, FailureMode: f.l.opts.FailureMode, MaxLease: f.l.opts.MaxLease, Registerer: prometheus.NewRegistry()}, hooks{clock: f.clk.Now, noHeartbeat: true, blocks: f.l.hooks.blocks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	return ls
}

func (f *fixture) allow(t *testing.T, key string, p Policy) Decision {
	t.Helper()
	d, err := f.l.Allow(context.Background(), key, p)
	if err != nil {
		t.Fatalf("Allow(%q): %v", key, err)
	}
	return d
}

func perMinute(n int64) Policy {
	return Policy{Name: "test", Windows: []Window{{Limit: n, Period: time.Minute}}}
}

// ceilSecond rounds d up to whole seconds, as the HTTP layer does.
func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1) / time.Second * time.Second
}

// metricValue reads a counter's or gauge's value.
func metricValue(t *testing.T, m prometheus.Metric) float64 { return testenv.MetricValue(t, m) }

// onEveryStore runs check on a limiter with opts over miniredis (the
// fixture, on its fake clock), over a real Redis, and without Redis, each
// with a registry of its own.
func onEveryStore(t *testing.T, opts Options, check func(t *testing.T, l *Limiter, reg *prometheus.Registry)) {
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, opts)
		check(t, f.l, f.reg)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
		t.Cleanup(func() { _ = rdb.Close() })
		reg := prometheus.NewRegistry()
		o := opts
		o.Prefix, o.Timeout, o.Registerer = randomPrefix(t), time.Second, reg
		l, err := New(rdb, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		check(t, l, reg)
	})
	t.Run("in process", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		o := opts
		o.Registerer = reg
		l, err := New(nil, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		check(t, l, reg)
	})
}

// onRealRedis runs one generated case per seed on a real Redis, in
// parallel, with periods up to 50 ms every other case (so that real time
// moves whole windows) and up to MaxPeriod otherwise.
func onRealRedis(t *testing.T, stream uint64, run func(t *testing.T, rdb *redis.Client, rng *rand.Rand, maxPeriod time.Duration)) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	rng := invariantRNG(t, stream)
	for c := range max(*invariantCases/4, 6) {
		maxPeriod := MaxPeriod
		if c%2 == 0 {
			maxPeriod = 50 * time.Millisecond
		}
		seed := rng.Uint64()
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			t.Parallel()
			run(t, rdb, rand.New(rand.NewPCG(seed, stream+1)), maxPeriod)
		})
	}
}

// discardLogger drops what it is given.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// evalDecision makes one decision with the script exactly as the batcher
// sends it (a batch of one), with EVALSHA or, when the server does not
// know the script yet, EVAL, and returns the decision's own reply.
func evalDecision(ctx context.Context, rdb redis.Scripter, keys []string, pl *plan, in input) (any, error) {
	rs, err := evalBatch(ctx, rdb, []decision{{keys: keys, pl: pl, nums: scriptNums(pl, in)}})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// fcallBatch makes the decisions ds in one call of the decision Function
// (loading its library first), as the batcher does on a Redis with
// Functions on a replica that is not finalized, and returns their replies.
func fcallBatch(ctx context.Context, rdb redis.UniversalClient, ds []decision) ([]any, error) {
	b := &redisDecider{rdb: rdb, sc: decisionScript()}
	if err := b.loadFunction(ctx); err != nil {
		return nil, err
	}
	keys, args := batchCommand(ds)
	reply, err := rdb.FCall(ctx, b.sc.fn, keys, args...).Result()
	if err != nil {
		return nil, err
	}
	return batchReplies(reply, len(ds))
}

// evalBatch makes the decisions ds in one script call, as the batcher
// does where Redis has no Functions, and returns their replies.
func evalBatch(ctx context.Context, rdb redis.Scripter, ds []decision) ([]any, error) {
	return evalBatchArg(ctx, rdb, ds, "0")
}

// evalBatchArg is evalBatch with arg as the finalize argument (ARGV[2]).
func evalBatchArg(ctx context.Context, rdb redis.Scripter, ds []decision, arg string) ([]any, error) {
	sc := decisionScript()
	var keys []string
	for i := range ds {
		keys = append(keys, ds[i].keys...)
	}
	args := appendBatchArgs(nil, ds, arg)
	reply, err := rdb.EvalSha(ctx, sc.sha, keys, args...).Result()
	if isNoScript(err) {
		reply, err = rdb.Eval(ctx, sc.src, keys, args...).Result()
	}
	if err != nil {
		return nil, err
	}
	return batchReplies(reply, len(ds))
}

// olderBatch makes the decisions ds in one call of the release before
// records could be finalized, as its replicas do where Redis has no
// Functions: its arguments are this release's without the finalize
// argument (ARGV[2]), its records and replies the same.
func olderBatch(ctx context.Context, rdb redis.Scripter, ds []decision) ([]any, error) {
	sc, err := olderScript()
	if err != nil {
		return nil, err
	}
	keys, args := batchCommand(ds)
	args = slices.Delete(args, 1, 2)
	reply, err := sc.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return nil, err
	}
	return batchReplies(reply, len(ds))
}

// olderDecider decides as replicas of the release before records could
// be finalized do (olderBatch), on the records r names.
type olderDecider struct{ r *redisDecider }

func (o olderDecider) decide(ctx context.Context, reqs []request, out []verdict) error {
	ds := make([]decision, len(reqs))
	for i, q := range reqs {
		ds[i] = o.r.pack(q.key, q.pl, q.in)
	}
	replies, err := olderBatch(ctx, o.r.rdb, ds)
	if err != nil {
		return err
	}
	for i := range ds {
		if out[i], err = decode(ds[i].pl, replies[i]); err != nil {
			return err
		}
	}
	return nil
}

// silentServer listens on a loopback port, accepts connections and never
// reads or answers (a Redis that hangs), until the test ends; it returns
// its address.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	return ln.Addr().String()
}

// batchCommand returns the KEYS and ARGV of the script call batchCall
// makes, for calls made through go-redis's FCall and Eval.
func batchCommand(ds []decision) ([]string, []any) {
	return batchCommandArg(ds, notFinalized)
}

// batchCommandArg is batchCommand with arg as the finalize argument
// (ARGV[2]: notFinalized or compactRecords).
func batchCommandArg(ds []decision, arg any) ([]string, []any) {
	var keys []string
	for i := range ds {
		keys = append(keys, ds[i].keys...)
	}
	return keys, appendBatchArgs(nil, ds, arg)
}

// replicasOn returns n limiters sharing rdb under a fresh key prefix, as
// replicas counting replicas live ones, heartbeats off.
func replicasOn(t *testing.T, rdb redis.UniversalClient, n, replicas int) []*Limiter {
	t.Helper()
	return replicasWith(t, rdb, n, replicas, false)
}

// replicasWith is replicasOn with blocks in force or not.
func replicasWith(t *testing.T, rdb redis.UniversalClient, n, replicas int, blocks bool) []*Limiter {
	t.Helper()
	prefix := randomPrefix(t)
	var ls []*Limiter
	for range n {
		l, err := newLimiter(rdb, Options{Replicas: replicas, Prefix: prefix, Timeout: time.Second, Registerer: prometheus.NewRegistry()}, hooks{noHeartbeat: true, blocks: blocks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	return ls
}

// batchReplies returns the replies of a script call that decided n
// decisions, one per decision, as a test reads them (the batcher reads a
// call as an array of strings).
func batchReplies(reply any, n int) ([]any, error) {
	rs, ok := reply.([]any)
	if !ok || len(rs) != n {
		return nil, fmt.Errorf("ratelimit: unexpected script reply %T for %d decisions", reply, n)
	}
	return rs, nil
}

// decode is decodeInto for a test holding a reply as go-redis returns an
// untyped one (the batcher reads replies as strings).
func decode(pl *plan, reply any) (verdict, error) {
	var v verdict
	s, ok := reply.(string)
	if !ok {
		return v, fmt.Errorf("ratelimit: unexpected script reply %T", reply)
	}
	err := decodeInto(pl, s, &v)
	return v, err
}
