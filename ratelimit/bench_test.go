package ratelimit

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Benchmarks run against a private redis-server (so that INFO
// commandstats and CONFIG RESETSTAT see only their own traffic); they
// need PETSTORE_TEST_REDIS_ADDR set like every Redis test, and the
// redis-server binary.

// The spec's plans (requests per minute and per day), with a ban rule.
var benchPlans = []Policy{
	{Name: "free", Windows: []Window{{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}},
	{Name: "pro", Windows: []Window{{Limit: 300, Period: time.Minute}, {Limit: 10_000, Period: 24 * time.Hour}}},
	{Name: "business", Windows: []Window{{Limit: 1000, Period: time.Minute}, {Limit: 100_000, Period: 24 * time.Hour}}},
}

var benchBan = BanPolicy{Threshold: 100, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Max: time.Hour, Memory: 24 * time.Hour}

func withBan(p Policy) Policy {
	p.Ban = benchBan
	return p
}

func benchRedis(b *testing.B) (*redis.Client, *commandCounter) {
	b.Helper()
	testenv.RedisAddr(b)
	s := startRedisServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 128})
	cmds := &commandCounter{}
	rdb.AddHook(cmds)
	b.Cleanup(func() { _ = rdb.Close() })
	return rdb, cmds
}

// cmdStat is one command's calls and total time from INFO commandstats.
type cmdStat struct {
	calls int64
	usec  float64
}

// commandStats returns one command's figures from INFO commandstats.
func commandStats(b *testing.B, rdb *redis.Client, name string) cmdStat {
	b.Helper()
	return allCommandStats(b, rdb)[name]
}

// decisionCalls returns the calls of the decision code Redis has run
// (FCALL, EVALSHA and EVAL).
func decisionCalls(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	var n int64
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		n += commandStats(b, rdb, name).calls
	}
	return n
}

func resetStats(b *testing.B, rdb *redis.Client) {
	b.Helper()
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// twoWindowRedisRate checks the same two windows with redis_rate: two
// GCRA calls, each with a burst of the window's limit.
func twoWindowRedisRate(ctx context.Context, rl *redis_rate.Limiter, key string, p Policy) (bool, error) {
	for _, w := range p.Windows {
		res, err := rl.Allow(ctx, key+":"+FormatPeriod(w.Period), redis_rate.Limit{Rate: int(w.Limit), Burst: int(w.Limit), Period: w.Period})
		if err != nil || res.Allowed == 0 {
			return false, err
		}
	}
	return true, nil
}

const benchKeys = 2000

func benchKey(i int64) string { return "key-" + strconv.FormatInt(i%benchKeys, 10) }

// BenchmarkAllow measures decisions of a two-window plan under
// concurrency (RunParallel with 32 goroutines per CPU), with allocations.
func BenchmarkAllow(b *testing.B) {
	p := benchPlans[2]
	b.Run("ratelimit", func(b *testing.B) {
		rdb, cmds := benchRedis(b)
		l, err := New(rdb, Options{Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ctx := context.Background()
		var i atomic.Int64
		var denied atomic.Int64
		resetStats(b, rdb)
		cmds.n.Store(0)
		b.ReportAllocs()
		b.SetParallelism(32)
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d, err := l.Allow(ctx, benchKey(i.Add(1)), p)
				if err != nil || d.Degraded {
					b.Errorf("%+v %v", d, err)
					return
				}
				if !d.Allowed() {
					denied.Add(1)
				}
			}
		})
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
		b.ReportMetric(float64(decisionCalls(b, rdb))/float64(b.N), "redis-cmds/decision")
		b.ReportMetric(float64(cmds.n.Load())/float64(b.N), "client-cmds/decision")
		if denied.Load() > 0 {
			b.Fatalf("%d decisions denied: the benchmark must measure admitted requests", denied.Load())
		}
	})
	b.Run("redis_rate", func(b *testing.B) {
		rdb, _ := benchRedis(b)
		rl := redis_rate.NewLimiter(rdb)
		ctx := context.Background()
		var i atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(32)
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if ok, err := twoWindowRedisRate(ctx, rl, benchKey(i.Add(1)), p); err != nil || !ok {
					b.Errorf("%v %v", ok, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	})
}

// BenchmarkAllowBusyKeys measures decisions for a few busy keys far from
// their limits (16 keys, at least 100 000/min and 100 times that a day,
// more when b.N is larger, so that no key nears its limit however fast
// the machine; 32 goroutines), with leasing on (the default) and off
// (MaxLease 1), each on its own Redis, and reports the script calls Redis
// ran per admitted request.
func BenchmarkAllowBusyKeys(b *testing.B) {
	for _, tc := range []struct {
		name     string
		maxLease int
	}{{"lease=on", 0}, {"lease=off", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			minute := min(MaxLimit, max(100_000, int64(b.N)))
			p := Policy{Name: "busy", Windows: []Window{{Limit: minute, Period: time.Minute}, {Limit: min(MaxLimit, 100*minute), Period: 24 * time.Hour}}}
			rdb, cmds := benchRedis(b)
			l, err := New(rdb, Options{Timeout: time.Second, MaxLease: tc.maxLease})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			var i, denied, leased atomic.Int64
			resetStats(b, rdb)
			cmds.n.Store(0)
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				key := "busy-" + strconv.FormatInt(i.Add(1)%16, 10)
				for pb.Next() {
					d, err := l.Allow(ctx, key, p)
					if err != nil || d.Degraded {
						b.Errorf("%+v %v", d, err)
						return
					}
					if !d.Allowed() {
						denied.Add(1)
					}
					if d.Leased {
						leased.Add(1)
					}
				}
			})
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			b.ReportMetric(float64(decisionCalls(b, rdb))/float64(b.N), "redis-cmds/decision")
			b.ReportMetric(float64(leased.Load())/float64(b.N), "leased/decision")
			if denied.Load() > 0 {
				b.Fatalf("%d decisions denied: the benchmark must measure admitted requests", denied.Load())
			}
		})
	}
}

// BenchmarkScriptCost compares the server time of one decision (two
// windows and bans), made alone in a call of the decision Function and of
// the script, with redis_rate's single GCRA call, by the usec and calls of
// fcall and evalsha in INFO commandstats, on the same Redis in the same
// run. The three alternate in blocks of scriptCostBlock calls, so that
// load from elsewhere on the machine weighs on all alike. Each goes over
// the same 2000 keys (its own records), one call at a time, as slow keys
// (which do not lease) reach Redis when no other decision shares their
// call: most calls find the key's state written by its previous call, a
// few create it, and the minute window's head moves on some calls and not
// on others.
func BenchmarkScriptCost(b *testing.B) {
	rdb, _ := benchRedis(b)
	ctx := context.Background()
	pl := compile(withBan(benchPlans[2]), DefaultBuckets, DefaultStrikeBuckets)
	sc := decisionScript()
	if err := rdb.ScriptLoad(ctx, sc.src).Err(); err != nil {
		b.Fatal(err)
	}
	if err := (&redisDecider{rdb: rdb, sc: sc}).loadFunction(ctx); err != nil {
		b.Fatal(err)
	}
	rl := redis_rate.NewLimiter(rdb)
	lim := redis_rate.PerMinute(1000)
	one := func(prefix string, i int) ([]string, []any) {
		return batchCommand([]decision{{keys: stateKeys(prefix, benchKey(int64(i)), pl), pl: pl, nums: scriptNums(pl, input{lease: noLease})}})
	}
	kinds := []struct {
		name, cmd string
		call      func(i int) error
	}{
		{"function", "fcall", func(i int) error {
			keys, args := one("f:", i)
			return rdb.FCall(ctx, sc.fn, keys, args...).Err()
		}},
		{"script", "evalsha", func(i int) error {
			keys, args := one("s:", i)
			return rdb.EvalSha(ctx, sc.sha, keys, args...).Err()
		}},
		{"gcra", "evalsha", func(i int) error {
			_, err := rl.Allow(ctx, benchKey(int64(i)), lim)
			return err
		}},
	}
	usec := make([]float64, len(kinds))
	calls := make([]int64, len(kinds))
	b.ResetTimer()
	for start := 0; start < b.N; start += scriptCostBlock {
		end := min(start+scriptCostBlock, b.N)
		for k, kind := range kinds {
			before := commandStats(b, rdb, kind.cmd)
			for i := start; i < end; i++ {
				if err := kind.call(i); err != nil {
					b.Fatal(err)
				}
			}
			after := commandStats(b, rdb, kind.cmd)
			calls[k] += after.calls - before.calls
			usec[k] += after.usec - before.usec
		}
	}
	b.StopTimer()
	per := func(k int) float64 { return usec[k] / float64(calls[k]) }
	b.ReportMetric(per(0), "function-usec/call")
	b.ReportMetric(per(1), "script-usec/call")
	b.ReportMetric(per(2), "gcra-usec/call")
	b.ReportMetric(per(0)/per(2), "function/gcra")
	b.ReportMetric(per(1)/per(2), "script/gcra")
}

// scriptCostBlock is how many calls of one kind BenchmarkScriptCost makes
// before switching to the other.
const scriptCostBlock = 500

// BenchmarkFloodRejected floods one key from many goroutines and reports
// the Redis commands sent per rejected request.
func BenchmarkFloodRejected(b *testing.B) {
	rdb, cmds := benchRedis(b)
	l, err := New(rdb, Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p := withBan(benchPlans[0])
	p.Ban.Threshold = 1000
	ctx := context.Background()
	var rejected, banned atomic.Int64
	resetStats(b, rdb)
	cmds.n.Store(0)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := l.Allow(ctx, "flood", p)
			if err != nil || d.Degraded {
				b.Errorf("%+v %v", d, err)
				return
			}
			if !d.Allowed() {
				rejected.Add(1)
			}
			if d.Outcome == Banned {
				banned.Add(1)
			}
		}
	})
	b.StopTimer()
	calls := decisionCalls(b, rdb)
	if r := rejected.Load(); r > 0 {
		b.ReportMetric(float64(cmds.n.Load())/float64(r), "client-cmds/rejection")
		b.ReportMetric(float64(calls)/float64(r), "redis-cmds/rejection")
	}
	if b.N > 2000 && banned.Load() == 0 {
		b.Fatalf("no ban after %d rejections over a threshold of 1000", rejected.Load())
	}
}

// BenchmarkMemoryPerKey reports MEMORY USAGE of one key's state (every
// Redis key of it, with a ban rule and strikes recorded) for the spec's
// plans, and for the business plan with two candidate windows and a
// candidate ban policy, whose records it also reports apart (what a
// candidate adds per key, and drops when it is removed).
func BenchmarkMemoryPerKey(b *testing.B) {
	withCandidate := withBan(benchPlans[2])
	withCandidate.Name = "business+candidate"
	// A candidate minute of one, so that the locally answered rejection
	// is its strike and every record exists.
	withCandidate.Candidate = []Window{{Limit: 1, Period: time.Minute}, {Limit: 50_000, Period: 24 * time.Hour}}
	withCandidate.CandidateBan = benchBan
	for _, p := range append(slices.Clone(benchPlans), withCandidate) {
		b.Run(p.Name, func(b *testing.B) {
			rdb, _ := benchRedis(b)
			ctx := context.Background()
			if !p.Ban.Enabled() {
				p = withBan(p)
			}
			pl := compile(p, DefaultBuckets, DefaultStrikeBuckets)
			var total, candidate int64
			for i := range b.N {
				keys := stateKeys("m:", benchKey(int64(i)), pl)
				// One admission and one locally answered rejection carried
				// as a strike: the ban records exist.
				if _, err := evalDecision(ctx, rdb, keys, pl, input{extra: 1, lease: noLease}); err != nil {
					b.Fatal(err)
				}
				for j, k := range keys {
					n, err := rdb.MemoryUsage(ctx, k).Result()
					if err != nil {
						b.Fatal(err)
					}
					if ttl, _ := rdb.PTTL(ctx, k).Result(); ttl <= 0 {
						b.Fatalf("%s has no TTL", k)
					}
					total += n
					if j > len(pl.windows) {
						candidate += n
					}
				}
			}
			b.ReportMetric(float64(total)/float64(b.N), "bytes/key")
			if len(pl.candidates) > 0 {
				b.ReportMetric(float64(candidate)/float64(b.N), "candidate-bytes/key")
			}
		})
	}
}

// BenchmarkSparseKeys measures the decisions of keys that come back
// seldom: b.N keys each decide once, and again a while later, from
// compareCallers goroutines; the second pass is measured. Two cases:
//
//   - one-bucket: a bucket width of the minute window later (a key's
//     second request in a period, or any of its first burst): every event
//     of each window is in its head bucket, the records' headers say so,
//     and no slot is read. (A window whose events span several buckets
//     costs a slot read more: BenchmarkCompareLimiters, cold.)
//   - expired: a period and then some later (a key that calls less often
//     than once a period), here of a one-second window beside the day:
//     the record of that window expired two buckets after its last event
//     slid out, and is written anew, whole, in one SET.
//   - returning: keys that decided in two buckets of a ten-second window
//     come back half a period later: the hundred buckets the head moves
//     over leave the window, and are read and summed (mostly zeros, as a
//     cold key's are).
//
// Reported: decisions/s, Redis time per decision in the decision code
// (INFO commandstats) and the commands it called per decision.
//
//	PETSTORE_TEST_REDIS_ADDR=127.0.0.1:6379 go test ./ratelimit -run '^$' -bench SparseKeys -benchtime 40000x
func BenchmarkSparseKeys(b *testing.B) {
	testenv.RedisAddr(b)
	for _, c := range []struct {
		name string
		p    Policy
		// pauses come between the passes; the last pass is measured.
		pauses []time.Duration
	}{
		{"one-bucket", benchPlans[2], []time.Duration{time.Minute/DefaultBuckets + 10*time.Millisecond}},
		{"expired", Policy{Name: "second", Windows: []Window{{Limit: 1000, Period: time.Second}, {Limit: 100_000, Period: 24 * time.Hour}}}, []time.Duration{time.Second + 3*time.Second/DefaultBuckets + 10*time.Millisecond}},
		{"returning", Policy{Name: "ten", Windows: []Window{{Limit: 1000, Period: 10 * time.Second}, {Limit: 100_000, Period: 24 * time.Hour}}}, []time.Duration{2 * 10 * time.Second / DefaultBuckets, 5 * time.Second}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := startRedisServer(b)
			rdb := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2 * compareCallers})
			b.Cleanup(func() { _ = rdb.Close() })
			l, err := newLimiter(rdb, Options{Timeout: time.Second}, hooks{noHeartbeat: true})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = "sparse-" + strconv.Itoa(i)
			}
			pass := func() time.Duration {
				return inParallel(int64(len(keys)), func(i int64) bool {
					d, err := l.Allow(context.Background(), keys[i], c.p)
					if err != nil || d.Degraded || !d.Allowed() {
						b.Errorf("%+v %v", d, err)
						return false
					}
					return true
				})
			}
			for _, p := range c.pauses {
				pass()
				time.Sleep(p)
			}
			stats0 := allCommandStats(b, rdb)
			b.ResetTimer()
			elapsed := pass()
			b.StopTimer()
			stats1 := allCommandStats(b, rdb)
			n := float64(b.N)
			var code, inner float64
			for name, st := range stats1 {
				switch name {
				case "info":
				case "fcall", "evalsha", "eval":
					code += st.usec - stats0[name].usec
				default:
					inner += float64(st.calls - stats0[name].calls)
				}
			}
			b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
			b.ReportMetric(code/n, "redis-code-us/decision")
			b.ReportMetric(inner/n, "script-cmds/decision")
		})
	}
}

// BenchmarkPlanLookup measures finding a request's compiled plan, which
// every decision does first: the spec's three plans with the ban rule,
// looked up from every CPU at once (RunParallel), as a replica's requests
// do. Needs no Redis.
//
//	go test ./ratelimit -run '^$' -bench PlanLookup -count 6
func BenchmarkPlanLookup(b *testing.B) {
	met, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	c := newPlanCache()
	opts := Options{Buckets: DefaultBuckets, StrikeBuckets: DefaultStrikeBuckets}
	var policies []Policy
	for _, p := range benchPlans {
		policies = append(policies, withBan(p))
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine's own copies, as each request carries its own.
		ps := make([]Policy, len(policies))
		for i, p := range policies {
			ps[i] = p.clone()
		}
		i := int(n.Add(1))
		for pb.Next() {
			i++
			if _, err := c.get(&ps[i%len(ps)], &opts, met); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
