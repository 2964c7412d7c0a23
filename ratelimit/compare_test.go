package ratelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// BenchmarkCompareLimiters runs three limiters side by side on one
// private redis-server, in one run, for a two-window plan: this one,
// redis_rate (a GCRA call per window) and httprate-redis's counter (per
// window, a sliding-window estimate from two fixed-window counters: MGET
// of both, then MULTI INCRBY EXPIRE EXEC when admitted). Two workloads:
// busy (16 keys far from their limits, where this limiter leases) and
// cold (20,000 keys each well under its limits: each comes back too
// seldom for a lease to form, and every decision reaches Redis), and
// steady: the cold workload after 15 s of it, untimed, by which time each
// key's minute has counted enough of its requests for a block once blocks
// are in force (README, Trade-offs), as a key sending a few requests a
// second does in service; there this limiter runs beside itself with leases
// and blocks off, MaxLease 1, as "petstore-whole": what leases save a key
// this slow (unfinalized, nothing); and steady-fleet, the same on a fleet
// of four replicas sharing the Redis, each decision sent to one of them at
// random as a load balancer would, so that each replica sees a key a second
// or more apart; and steady-fleet-affinity, the same fleet behind a
// balancer that sends each key to one replica (by a hash of the key, as
// HAProxy's balance hdr(Authorization) does), so that each replica sees all
// of its keys' traffic; and slow-fleet and slow-fleet-affinity, both fleets
// with 40,000 keys, a few requests a second each (at the decisions a second
// of a machine of two cores): too slow to lease even on one replica; and
// warm-fleet and warm-fleet-affinity, both fleets with 1,000 keys, tens to
// hundreds of requests a second each: where leases form on one replica and
// less often on a quarter of its traffic; and
// cold-finalized and steady-finalized, cold and steady with this
// limiter's records finalized (compact: finalize.go; blocks aside) beside
// itself without, as "petstore-unfinalized"; and cold-blocks and steady-blocks, cold and
// steady with blocks in force (lease.go) beside this limiter without
// them, as "petstore-noblocks", and steady-blocks-minute, steady-blocks
// under a plan of a minute window alone, with no long window. The
// limiters take turns in rounds of b.N decisions from compareCallers
// goroutines, in a rotating order, so that load from elsewhere on the
// machine weighs on all alike. Reported
// per limiter: decisions/s, Redis CPU per decision (the server process's
// own user and system time, from INFO CPU, around each round), Redis
// command time per decision (INFO commandstats, usec of the commands the
// clients sent: a script's inner commands count in the script's time),
// the commands a script called per decision and their own time (a part
// of the script's: the rest is the script's code and its calls'
// plumbing), and the client's allocations and CPU per decision (this
// process's user and system time around each round, the collector's
// included: what a server spends on deciding, HTTP aside); and the ratio
// of this limiter's Redis CPU to redis_rate's.
//
//	PETSTORE_TEST_REDIS_ADDR=127.0.0.1:6379 go test ./ratelimit -run '^$' -bench CompareLimiters -benchtime 100000x
//
// httprate-redis (github.com/go-chi/httprate-redis) is not served by the
// Go module proxy this project builds with, so its counter is written
// here from its source: the same commands in the same round trips, and
// httprate's estimate (previous window's count weighted by the part of
// it still inside the sliding window, plus the current one's).
func BenchmarkCompareLimiters(b *testing.B) {
	testenv.RedisAddr(b)
	cold := Policy{Name: "cold", Windows: []Window{{Limit: 1000, Period: time.Minute}, {Limit: 100_000, Period: 24 * time.Hour}}}
	// warm: keys that lease on one replica (tens of requests a second
	// each) but seldom when spread over four.
	warm := Policy{Name: "warm", Windows: []Window{{Limit: 100_000, Period: time.Minute}, {Limit: 10_000_000, Period: 24 * time.Hour}}}
	// minute: a plan of a minute window alone, no long window to count a block in.
	minute := Policy{Name: "minute", Windows: []Window{{Limit: 1000, Period: time.Minute}}}
	others := []string{"redis_rate", "httprate-redis"}
	workloads := []struct {
		name     string
		keys     int
		p        Policy
		warm     time.Duration // each limiter decides the workload this long (all together, interleaved), untimed, first
		against  []string      // the contenders beside this limiter
		replicas int           // this limiter's (and petstore-whole's) replicas; 0 or 1: one
		affinity bool          // each key's decisions all made by one replica, chosen by its hash
		// finalized: this limiter writing compact records (finalize.go),
		// beside itself without (petstore-unfinalized).
		finalized bool
		// blocks: this limiter with blocks in force (lease.go), beside
		// itself without (petstore-noblocks).
		blocks bool
	}{
		{"busy", 16, Policy{Name: "busy", Windows: []Window{{Limit: 100_000, Period: time.Minute}, {Limit: 10_000_000, Period: 24 * time.Hour}}}, 0, others, 1, false, false, false},
		{"cold", 20_000, cold, 0, others, 1, false, false, false},
		// (Against itself alone: the longer the others' rounds, the more
		// of a key's minute slides out before its next, and the less
		// steady the workload.)
		{"steady", 20_000, cold, 15 * time.Second, []string{"petstore-whole"}, 1, false, false, false},
		{"steady-fleet", 10_000, cold, 15 * time.Second, []string{"petstore-whole"}, 4, false, false, false},
		{"steady-fleet-affinity", 10_000, cold, 15 * time.Second, []string{"petstore-whole"}, 4, true, false, false},
		{"slow-fleet", 40_000, cold, 15 * time.Second, []string{"petstore-whole"}, 4, false, false, false},
		{"slow-fleet-affinity", 40_000, cold, 15 * time.Second, []string{"petstore-whole"}, 4, true, false, false},
		{"warm-fleet", 1_000, warm, 5 * time.Second, []string{"petstore-whole"}, 4, false, false, false},
		{"warm-fleet-affinity", 1_000, warm, 5 * time.Second, []string{"petstore-whole"}, 4, true, false, false},
		{"cold-finalized", 20_000, cold, 0, []string{"petstore-unfinalized"}, 1, false, true, false},
		{"steady-finalized", 20_000, cold, 15 * time.Second, []string{"petstore-unfinalized"}, 1, false, true, false},
		{"cold-blocks", 20_000, cold, 0, []string{"petstore-noblocks"}, 1, false, false, true},
		{"steady-blocks", 20_000, cold, 15 * time.Second, []string{"petstore-noblocks"}, 1, false, false, true},
		{"steady-blocks-minute", 20_000, minute, 15 * time.Second, []string{"petstore-noblocks"}, 1, false, false, true},
	}
	for _, wl := range workloads {
		b.Run(wl.name, func(b *testing.B) {
			s := startRedisServer(b)
			rdb := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2 * compareCallers})
			b.Cleanup(func() { _ = rdb.Close() })
			// No heartbeats or registry refreshes: their scripts would be
			// counted in other limiters' rounds.
			limiter := func(prefix string, maxLease int, reg *prometheus.Registry, finalized, blocks bool) *Limiter {
				l, err := newLimiter(rdb, Options{Timeout: time.Second, Prefix: prefix, MaxLease: maxLease, Registerer: reg, Replicas: max(wl.replicas, 1)}, hooks{noHeartbeat: true, blocks: blocks})
				if err != nil {
					b.Fatal(err)
				}
				if finalized {
					// As read by a heartbeat, held for the benchmark.
					l.replicas.view.Store(&view{finalized: true, until: math.MaxInt64})
				}
				b.Cleanup(func() { _ = l.Close() })
				return l
			}
			// tally counts one fleet's leased decisions.
			type tally struct{ leased atomic.Int64 }
			allow := func(l *Limiter, t *tally) func(ctx context.Context, key string) (bool, error) {
				return func(ctx context.Context, key string) (bool, error) {
					d, err := l.Allow(ctx, key, wl.p)
					if d.Leased {
						t.leased.Add(1)
					}
					if err == nil && d.Degraded {
						err = fmt.Errorf("degraded decision: %+v", d)
					}
					return d.Allowed(), err
				}
			}
			// fleet is wl.replicas limiters on one prefix, each decision
			// made by one of them (at random, or by the key's hash), and
			// their registries, one each; t counts their leased decisions.
			fleet := func(prefix string, maxLease int, finalized, blocks bool, t *tally) (func(ctx context.Context, key string) (bool, error), []*prometheus.Registry) {
				n := max(wl.replicas, 1)
				regs := make([]*prometheus.Registry, n)
				replicas := make([]func(ctx context.Context, key string) (bool, error), n)
				for i := range replicas {
					regs[i] = prometheus.NewRegistry()
					replicas[i] = allow(limiter(prefix, maxLease, regs[i], finalized, blocks), t)
				}
				if n == 1 {
					return replicas[0], regs
				}
				if wl.affinity {
					seed := maphash.MakeSeed()
					return func(ctx context.Context, key string) (bool, error) {
						return replicas[maphash.String(seed, key)%uint64(n)](ctx, key)
					}, regs
				}
				return func(ctx context.Context, key string) (bool, error) {
					return replicas[rand.IntN(n)](ctx, key)
				}, regs
			}
			scripts := []string{"fcall", "evalsha", "eval"}
			// Ours keeps its metrics apart: what its leases and
			// blocks left unspent is read from them.
			var ourTally tally
			ours, regs := fleet("ours:", 0, wl.finalized, wl.blocks, &ourTally)
			counted := func(name string) float64 {
				var sum float64
				for _, reg := range regs {
					sum += testenv.CounterSum(b, reg, name, nil)
				}
				return sum
			}
			unspent := func() float64 { return counted("petstore_ratelimit_unspent_total") }
			givenBack := func() float64 { return counted("petstore_ratelimit_given_back_total") }
			contenders := []contender{{name: "petstore", commands: scripts, allow: ours}}
			for _, name := range wl.against {
				c := contender{name: name}
				switch name {
				case "redis_rate":
					c.commands, c.allow = []string{"evalsha", "eval"}, func(ctx context.Context, key string) (bool, error) {
						return twoWindowRedisRate(ctx, redis_rate.NewLimiter(rdb), "rr:"+key, wl.p)
					}
				case "httprate-redis":
					c.commands, c.allow = []string{"mget", "multi", "incrby", "expire", "exec"}, func(ctx context.Context, key string) (bool, error) {
						return httprateTwoWindows(ctx, rdb, "hr:"+key, wl.p, time.Now())
					}
				case "petstore-whole":
					// Leases and blocks off: every decision whole.
					c.commands = scripts
					c.allow, _ = fleet("whole:", 1, wl.finalized, false, new(tally))
				case "petstore-unfinalized":
					c.commands = scripts
					c.allow, _ = fleet("unfinalized:", 0, false, false, new(tally))
				case "petstore-noblocks":
					c.commands = scripts
					c.allow, _ = fleet("noblocks:", 0, wl.finalized, false, new(tally))
				}
				contenders = append(contenders, c)
			}
			keys := make([]string, wl.keys)
			for i := range keys {
				keys[i] = "key-" + strconv.Itoa(i)
			}
			warmTogether(b, contenders, keys, wl.warm)
			ourTally.leased.Store(0)
			unspent0, givenBack0 := unspent(), givenBack()
			const rounds = 3
			b.ResetTimer()
			for round := range rounds {
				for k := range contenders {
					c := &contenders[(round+k)%len(contenders)]
					c.run(b, rdb, keys)
				}
			}
			b.StopTimer()
			n := float64(rounds * b.N)
			_, clientCPU := testenv.ProcessCPU()
			for _, c := range contenders {
				b.ReportMetric(n/c.elapsed.Seconds(), c.name+"-decisions/s")
				b.ReportMetric(c.cpu.Seconds()*1e6/n, c.name+"-redis-cpu-us/decision")
				b.ReportMetric(c.usec/n, c.name+"-redis-cmd-us/decision")
				b.ReportMetric(float64(c.inner)/n, c.name+"-script-cmds/decision")
				b.ReportMetric(c.innerUsec/n, c.name+"-script-cmd-us/decision")
				b.ReportMetric(float64(c.mallocs)/n, c.name+"-allocs/decision")
				if clientCPU {
					b.ReportMetric(c.client.Seconds()*1e6/n, c.name+"-client-cpu-us/decision")
				}
			}
			// The ratios of one machine's figures, measured in the same
			// rounds: steadier from machine to machine than either.
			for _, c := range contenders[1:] {
				b.ReportMetric(contenders[0].cpu.Seconds()/c.cpu.Seconds(), "petstore/"+c.name+"-redis-cpu")
				if clientCPU {
					b.ReportMetric(contenders[0].client.Seconds()/c.client.Seconds(), "petstore/"+c.name+"-client-cpu")
				}
			}
			// (Counted from this limiter's decisions only, not from
			// petstore-whole's or petstore-unfinalized's.)
			b.ReportMetric(float64(ourTally.leased.Load())/n, "petstore-leased/decision")
			// Counted when a replica lets them go: those of leases and
			// blocks still held at the end are not in it.
			b.ReportMetric((unspent()-unspent0)/n, "petstore-unspent/decision")
			// (Of them, those Redis took back: they count no longer.)
			b.ReportMetric((givenBack()-givenBack0)/n, "petstore-given-back/decision")
			b.ReportMetric(n/float64(contenders[0].scripts), "petstore-decisions/script-call")
		})
	}
}

// compareCallers is the number of goroutines deciding at once.
const compareCallers = 64

// inParallel calls do(i) for every i in [0, n) from compareCallers
// goroutines, each taking the next i, and returns how long they took. A
// goroutine stops at the first false do returns.
func inParallel(n int64, do func(i int64) bool) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range compareCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				if !do(i) {
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// contender is one limiter of BenchmarkCompareLimiters with its totals.
type contender struct {
	name     string
	commands []string // the commands it sends (INFO commandstats names)
	allow    func(ctx context.Context, key string) (bool, error)
	elapsed  time.Duration
	cpu      time.Duration // Redis process CPU
	usec     float64       // Redis command time
	scripts  int64         // calls of the decision code (FCALL, EVALSHA and EVAL)
	// Commands its scripts call (every command counted but those it sends
	// and the benchmark's INFO): how many and their own time, which is
	// part of the script's.
	inner     int64
	innerUsec float64
	mallocs   uint64
	// client is this process's CPU over its rounds: the limiter's own,
	// its pipelines' and the collector's, without Redis's.
	client time.Duration
}

// run makes b.N decisions over keys, in turn, from compareCallers
// goroutines, and adds what they cost to c's totals.
func (c *contender) run(b *testing.B, rdb *redis.Client, keys []string) {
	ctx := context.Background()
	cpu0, stats0 := redisCPU(b, rdb), allCommandStats(b, rdb)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	client0, _ := testenv.ProcessCPU()
	var denied atomic.Int64
	elapsed := inParallel(int64(b.N), func(i int64) bool {
		ok, err := c.allow(ctx, keys[i%int64(len(keys))])
		if err != nil {
			b.Error(err)
			return false
		}
		if !ok {
			denied.Add(1)
		}
		return true
	})
	c.elapsed += elapsed
	client1, _ := testenv.ProcessCPU()
	c.client += client1 - client0
	runtime.ReadMemStats(&ms1)
	c.mallocs += ms1.Mallocs - ms0.Mallocs
	c.cpu += redisCPU(b, rdb) - cpu0
	stats1 := allCommandStats(b, rdb)
	for _, name := range c.commands {
		c.usec += stats1[name].usec - stats0[name].usec
	}
	for name, st := range stats1 {
		if name != "info" && !slices.Contains(c.commands, name) {
			c.inner += st.calls - stats0[name].calls
			c.innerUsec += st.usec - stats0[name].usec
		}
	}
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		c.scripts += stats1[name].calls - stats0[name].calls
	}
	if n := denied.Load(); n > 0 {
		b.Fatalf("%s denied %d decisions: the workload must stay under its limits", c.name, n)
	}
}

// warmTogether makes decisions over keys for d per contender (all of
// them, together, for d times their number), counting nothing, from
// compareCallers goroutines, every contender's interleaved with the
// others': each key reaches each contender at the same pace, and no
// contender idles while another warms (one warmed before another would
// have had its blocks lapse, flattering the other's rounds).
func warmTogether(b *testing.B, contenders []contender, keys []string, d time.Duration) {
	if d <= 0 {
		return
	}
	ctx := context.Background()
	n := int64(len(contenders))
	end := time.Now().Add(d * time.Duration(n))
	inParallel(1<<62, func(i int64) bool {
		c := &contenders[i%n]
		if _, err := c.allow(ctx, keys[(i/n)%int64(len(keys))]); err != nil {
			b.Error(err)
			return false
		}
		return time.Now().Before(end)
	})
}

// redisCPU returns the Redis server process's user and system CPU time.
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// allCommandStats returns INFO commandstats by command name.
func allCommandStats(b *testing.B, rdb *redis.Client) map[string]cmdStat {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, _ := strings.Cut(rest, ":")
		var st cmdStat
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[name] = st
	}
	return out
}

// httprateTwoWindows decides one request with httprate's sliding-window
// counter over Redis, as httprate-redis stores it, for each of p's
// windows: the counts of the current and the previous fixed window
// (MGET); the estimate is the previous count weighted by the part of the
// previous window still inside the sliding one, plus the current count;
// under the limit, the request is counted (MULTI INCRBY EXPIRE EXEC).
func httprateTwoWindows(ctx context.Context, rdb *redis.Client, key string, p Policy, now time.Time) (bool, error) {
	for _, w := range p.Windows {
		cur := now.Truncate(w.Period)
		prev := cur.Add(-w.Period)
		ck := key + ":" + strconv.FormatInt(cur.Unix(), 10)
		pk := key + ":" + strconv.FormatInt(prev.Unix(), 10)
		vals, err := rdb.MGet(ctx, ck, pk).Result()
		if err != nil {
			return false, err
		}
		count := func(v any) float64 {
			s, _ := v.(string)
			n, _ := strconv.Atoi(s)
			return float64(n)
		}
		elapsed := now.Sub(cur)
		rate := count(vals[1])*float64(w.Period-elapsed)/float64(w.Period) + count(vals[0])
		if rate >= float64(w.Limit) {
			return false, nil
		}
		pipe := rdb.TxPipeline()
		pipe.IncrBy(ctx, ck, 1)
		pipe.Expire(ctx, ck, 3*w.Period)
		if _, err := pipe.Exec(ctx); err != nil {
			return false, err
		}
	}
	return true, nil
}
