package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// BenchmarkServeWithWrk serves GET /v1/pets from this process, over real
// TCP, to wrk (another process, 2 threads, 32 connections), with the
// rate limiter off, on (a private redis-server) and replaced by
// redis_rate (a GCRA call per window on the same Redis: what an
// established limiter adds to the same stack), and with the rate-limit
// fields alone (fieldsOnly: what the contract's fields cost, whatever
// limiter sets them), in rotating rounds, for
// three workloads: 16 busy keys, 5,000 cold keys each well
// under its limits (no lease forms), and the same cold keys under a plan
// with the standard ban rule, as every built-in plan has (cold-ban). The
// whole stack runs as in production: access log (JSON, discarded),
// metrics, authentication.
// Reported per workload: requests/s off and on and their ratio, this
// process's CPU per request off and on (getrusage: the server's own
// work, without wrk's) and their difference (the limiter's cost per
// decision in the server), Redis's CPU per request (INFO CPU), the calls
// of the decision code per request and their time per request (INFO
// commandstats), the share of decisions served by a lease or a block,
// wrk's CPU per request, and the whole machine's busy CPU
// per request (/proc/stat): when the machine is saturated, on/off is the
// ratio of the two sides' machine CPU per request, whoever spends it;
// and for redis_rate its throughput against off, the server CPU it adds
// and its Redis CPU per request; for the fields alone their throughput
// against off (the ceiling of on/off), on against them (the limiter's
// own share) and the server CPU each adds.
//
//	go test -run '^$' -bench ServeWithWrk -benchtime 1x ./cmd/petstore/
//
// Each round runs wrk for wrkSeconds (BENCH_WRK_SECONDS, default 8), after BENCH_WRK_WARMUP
// seconds of it untimed (default none); -benchtime Nx runs N rotations of
// the four rounds per workload. It needs wrk (Debian's package) and redis-server.
// BENCH_WHOLE (say 1) adds a fifth side: the limiter with leases and
// blocks off (MaxLease 1), reported as whole/off, on/whole and its
// server and Redis CPU a request.
// BENCH_FINALIZED (say 1) finalizes the limiter's records first
// ('petstore limits finalize'; the limiter's sides only, redis_rate's
// unchanged). BENCH_FINALIZED_SIDE (say 1) instead adds a side: the
// limiter finalized (records of its own), beside the unfinalized one in
// the same rotating rounds, reported as finalized/on, its server and Redis
// CPU a request, and its Redis CPU as a share of on's.
// The sides send the specification's three rate-limit fields, as petstore
// does by default; BENCH_DRAFT_FIELDS (say 1) adds the IETF draft's two
// to every side (--ratelimit-draft-fields).
// BENCH_PIPELINES sets Options.Pipelines, BENCH_PIPELINE_HOLD (say
// 200us, or -1ns for none) Options.PipelineHold; BENCH_REDIS_DELAY (say 100us)
// puts the limiter's Redis that far away in each direction, through a
// proxy in this process (whose CPU then counts in the server's).
//
// BENCH_REDIS_CPU (say 1) runs the private redis-server on that core
// alone (taskset), as production runs Redis on machines of its own; run
// the benchmark itself on the other core, which wrk inherits, so that the
// server and wrk share one core and Redis never competes with them:
//
//	go test -c -o petstore.test ./cmd/petstore/
//	BENCH_REDIS_CPU=1 taskset -c 0 ./petstore.test -test.run '^$' -test.bench ServeWithWrk -test.benchtime 2x
//
// on/off then measures what the limiter costs a replica's own core.
func BenchmarkServeWithWrk(b *testing.B) {
	testenv.RedisAddr(b)
	draftFields := os.Getenv("BENCH_DRAFT_FIELDS") != ""
	for _, tool := range []string{"wrk", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed: %v", tool, err)
		}
	}
	for _, wl := range []struct {
		name string
		keys int
		plan string
		ban  string // the plan's ban setting: "off", or "" for the standard rule every built-in plan has
	}{
		// busy's limits stay out of reach: at 27,000 requests/s a minute of
		// 100,000 a key ran out within a round, and its 429s (cheap to
		// serve) failed the run.
		{"busy", 16, "{limit: 1000000, period: 1m}, {limit: 100000000, period: 24h}", "off"},
		{"cold", 5000, "{limit: 1000, period: 1m}, {limit: 100000, period: 24h}", "off"},
		{"cold-ban", 5000, "{limit: 1000, period: 1m}, {limit: 100000, period: 24h}", ""},
	} {
		b.Run(wl.name, func(b *testing.B) {
			dir := b.TempDir()
			rs := startPrivateRedis(b, dir)
			addr := rs.addr
			if d, err := time.ParseDuration(os.Getenv("BENCH_REDIS_DELAY")); err == nil && d > 0 {
				addr = startDelayProxy(b, rs.addr, d)
			}
			rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 32})
			defer rdb.Close()
			rtt := medianPing(b, rdb)
			def := "plans:\n  bench:\n    quotas: [" + wl.plan + "]\n"
			if wl.ban != "" {
				def += "    ban: " + wl.ban + "\n"
			}
			plans, err := plan.Parse([]byte(def))
			if err != nil {
				b.Fatal(err)
			}
			var yaml strings.Builder
			yaml.WriteString("keys:\n")
			keys := make([]string, wl.keys)
			for i := range keys {
				if keys[i], err = apikey.Generate(); err != nil {
					b.Fatal(err)
				}
				fmt.Fprintf(&yaml, "  - {key: %s, plan: bench}\n", keys[i])
			}
			static, err := apikey.ParseKeys([]byte(yaml.String()), plans)
			if err != nil {
				b.Fatal(err)
			}
			auth, err := apikey.NewAuthenticator(apikey.Options{Plans: plans, Keys: static})
			if err != nil {
				b.Fatal(err)
			}
			store := memstore.New()
			for i := range 100 {
				if _, _, err := store.Create(context.Background(), pet.NewPet{Name: fmt.Sprintf("pet %d", i), CategoryID: 1, Status: pet.StatusAvailable}, nil); err != nil {
					b.Fatal(err)
				}
			}
			pipelines, _ := strconv.Atoi(os.Getenv("BENCH_PIPELINES"))
			hold, _ := time.ParseDuration(os.Getenv("BENCH_PIPELINE_HOLD"))
			limReg := prometheus.NewRegistry()
			limiter, err := newLabelled("on", rdb, ratelimit.Options{Pipelines: pipelines, PipelineHold: hold, Registerer: limReg})
			if err != nil {
				b.Fatal(err)
			}
			defer limiter.Close()
			if os.Getenv("BENCH_FINALIZED") != "" {
				finalizeForBench(b, limiter, limReg)
			}
			script := writeWrkScript(b, dir, keys)
			log := slog.New(httpapi.NewJSONLogHandler(io.Discard, nil))

			// Each side's connections run under a profile label (side=on or
			// off; connection goroutines inherit it from Serve's), as do the
			// limiters' own goroutines (newLabelled), so that
			// -test.cpuprofile can be split: go tool pprof -tagfocus side=on.
			// The collector's workers carry none.
			serve := func(name string, l httpapi.Limiter) (url string, stop func()) {
				h := httpapi.NewServer(httpapi.Config{Store: store, Auth: auth, Limiter: l, Logger: log, Metrics: httpapi.NewMetrics(prometheus.NewRegistry()),
					DraftLimitFields: draftFields})
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
				go pprof.Do(context.Background(), pprof.Labels("side", name), func(context.Context) { _ = srv.Serve(ln) })
				return "http://" + ln.Addr().String(), func() { _ = srv.Close() }
			}
			type side struct {
				name              string
				limiter           httpapi.Limiter
				requests          float64
				elapsed, cpu, rcp time.Duration
				wrk, machine      time.Duration
				gc                float64 // the collector's CPU seconds (runtime/metrics)
				scripts           int64
				scriptUsec        float64
				p50, p99          time.Duration // summed over rounds
				rounds            int
				reg               prometheus.Gatherer // the limiter's metrics, nil for none
				counts            limiterCounts       // summed over the timed rounds
			}
			sides := []*side{{name: "off"}, {name: "on", limiter: limiter, reg: limReg}, {name: "redis_rate", limiter: redisRateLimiter{redis_rate.NewLimiter(rdb)}}, {name: "fields", limiter: fieldsOnly{}}}
			if os.Getenv("BENCH_WHOLE") != "" {
				whole, err := newLabelled("whole", rdb, ratelimit.Options{Pipelines: pipelines, PipelineHold: hold, MaxLease: 1, Prefix: "whole:", Registerer: prometheus.NewRegistry()})
				if err != nil {
					b.Fatal(err)
				}
				defer whole.Close()
				sides = append(sides, &side{name: "whole", limiter: whole})
			}
			var finReg *prometheus.Registry
			if os.Getenv("BENCH_FINALIZED_SIDE") != "" {
				finReg = prometheus.NewRegistry()
				fin, err := newLabelled("finalized", rdb, ratelimit.Options{Pipelines: pipelines, PipelineHold: hold, Prefix: "fin:", Registerer: finReg})
				if err != nil {
					b.Fatal(err)
				}
				defer fin.Close()
				finalizeForBench(b, fin, finReg)
				sides = append(sides, &side{name: "finalized", limiter: fin, reg: finReg})
			}
			sideNamed := func(name string) *side {
				for _, s := range sides {
					if s.name == name {
						return s
					}
				}
				return nil
			}
			checkSideFields(b, keys[0], func(name string, l httpapi.Limiter) string {
				url, stop := serve(name, l)
				b.Cleanup(stop)
				return url
			}, draftFields, sides[0].limiter, sides[1].limiter, sides[2].limiter, sides[3].limiter)
			b.ResetTimer()
			for i := range b.N {
				for k := range sides {
					s := sides[(i+k)%len(sides)]
					url, stop := serve(s.name, s.limiter)
					if wrkWarmup > 0 {
						// Untimed: the side's keys build the history
						// leases and blocks are sized on.
						runWrkFor(b, script, url, wrkWarmup)
					}
					calls0, usec0 := rs.scripts(b)
					lc0 := countsOf(b, s.reg)
					cpu0, rcpu0, gc0, m0 := processCPU(b), rs.cpu(b), gcCPU(), machineCPU()
					n, elapsed, p50, p99, wrk := runWrk(b, script, url)
					s.machine += machineCPU() - m0
					s.wrk += wrk
					s.p50 += p50
					s.p99 += p99
					s.rounds++
					s.cpu += processCPU(b) - cpu0
					s.gc += gcCPU() - gc0
					s.rcp += rs.cpu(b) - rcpu0
					calls1, usec1 := rs.scripts(b)
					s.counts.add(countsOf(b, s.reg), lc0)
					s.scripts += calls1 - calls0
					s.scriptUsec += usec1 - usec0
					s.requests += n
					s.elapsed += elapsed
					stop()
				}
			}
			b.StopTimer()
			off, on := sides[0], sides[1]
			perReq := func(d time.Duration, n float64) float64 { return float64(d.Microseconds()) / n }
			b.ReportMetric(rtt.Seconds()*1000, "redis-rtt-ms")
			b.ReportMetric(off.requests/off.elapsed.Seconds(), "off-req/s")
			b.ReportMetric(on.requests/on.elapsed.Seconds(), "on-req/s")
			b.ReportMetric((on.requests/on.elapsed.Seconds())/(off.requests/off.elapsed.Seconds()), "on/off")
			b.ReportMetric(perReq(off.cpu, off.requests), "off-server-cpu-us/req")
			b.ReportMetric(perReq(on.cpu, on.requests), "on-server-cpu-us/req")
			onAdded, onRedis := perReq(on.cpu, on.requests)-perReq(off.cpu, off.requests), perReq(on.rcp, on.requests)
			b.ReportMetric(onAdded, "limiter-server-cpu-us/req")
			b.ReportMetric(off.gc*1e6/off.requests, "off-gc-cpu-us/req")
			b.ReportMetric(on.gc*1e6/on.requests, "on-gc-cpu-us/req")
			b.ReportMetric(onRedis, "redis-cpu-us/req")
			b.ReportMetric(float64(on.scripts)/on.requests, "scripts/req")
			if c := on.counts; c.decided > 0 {
				b.ReportMetric(c.leased/c.decided, "leased/decision")
			}
			b.ReportMetric(on.scriptUsec/on.requests, "redis-script-us/req")
			// redis_rate in the same stack, the same rounds: what an
			// established Redis limiter (a GCRA call per window, no
			// batching) adds to the same server.
			rr := sides[2]
			b.ReportMetric((rr.requests/rr.elapsed.Seconds())/(off.requests/off.elapsed.Seconds()), "redis_rate/off")
			rrAdded, rrRedis := perReq(rr.cpu, rr.requests)-perReq(off.cpu, off.requests), perReq(rr.rcp, rr.requests)
			b.ReportMetric(rrAdded, "redis_rate-server-cpu-us/req")
			b.ReportMetric(rrRedis, "redis_rate-redis-cpu-us/req")
			// The same as shares of redis_rate's: what moves least from one
			// machine to the next, where the absolute figures move twofold.
			b.ReportMetric(onRedis/rrRedis, "on/redis_rate-redis-cpu")
			b.ReportMetric(onAdded/rrAdded, "on/redis_rate-server-cpu-added")
			// The rate-limit fields alone, no limiter behind them: what the
			// contract's fields cost the stack, the ceiling of on/off for
			// any limiter; on/fields is the limiter's own share.
			fl := sides[3]
			b.ReportMetric((fl.requests/fl.elapsed.Seconds())/(off.requests/off.elapsed.Seconds()), "fields/off")
			b.ReportMetric((on.requests/on.elapsed.Seconds())/(fl.requests/fl.elapsed.Seconds()), "on/fields")
			b.ReportMetric(perReq(fl.cpu, fl.requests)-perReq(off.cpu, off.requests), "fields-server-cpu-us/req")
			b.ReportMetric(perReq(on.cpu, on.requests)-perReq(fl.cpu, fl.requests), "limiter-own-server-cpu-us/req")
			b.ReportMetric(perReq(fl.wrk, fl.requests), "fields-wrk-cpu-us/req")
			// The same limiter with leases and blocks off (BENCH_WHOLE):
			// what they save, in the same rounds.
			if wh := sideNamed("whole"); wh != nil {
				b.ReportMetric((wh.requests/wh.elapsed.Seconds())/(off.requests/off.elapsed.Seconds()), "whole/off")
				b.ReportMetric((on.requests/on.elapsed.Seconds())/(wh.requests/wh.elapsed.Seconds()), "on/whole")
				b.ReportMetric(perReq(wh.cpu, wh.requests)-perReq(off.cpu, off.requests), "whole-server-cpu-us/req")
				b.ReportMetric(perReq(wh.rcp, wh.requests), "whole-redis-cpu-us/req")
			}
			// The limiter finalized (BENCH_FINALIZED_SIDE), in the same
			// rounds as the unfinalized one.
			if fs := sideNamed("finalized"); fs != nil {
				b.ReportMetric((fs.requests/fs.elapsed.Seconds())/(on.requests/on.elapsed.Seconds()), "finalized/on")
				b.ReportMetric((fs.requests/fs.elapsed.Seconds())/(off.requests/off.elapsed.Seconds()), "finalized/off")
				b.ReportMetric(perReq(fs.cpu, fs.requests)-perReq(off.cpu, off.requests), "finalized-server-cpu-us/req")
				b.ReportMetric(perReq(fs.rcp, fs.requests), "finalized-redis-cpu-us/req")
				b.ReportMetric(perReq(fs.rcp, fs.requests)/onRedis, "finalized/on-redis-cpu")
				b.ReportMetric(float64(fs.scripts)/fs.requests, "finalized-scripts/req")
				if c := fs.counts; c.decided > 0 {
					// Spent in process, from a lease or a block; sent to Redis.
					b.ReportMetric(c.leased/c.decided, "finalized-leased/decision")
					b.ReportMetric(c.trips/c.decided, "finalized-trips/decision")
				}
			}
			ms := func(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }
			b.ReportMetric(perReq(off.wrk, off.requests), "off-wrk-cpu-us/req")
			b.ReportMetric(perReq(on.wrk, on.requests), "on-wrk-cpu-us/req")
			if off.machine > 0 && on.machine > 0 {
				b.ReportMetric(perReq(off.machine, off.requests), "off-machine-cpu-us/req")
				b.ReportMetric(perReq(on.machine, on.requests), "on-machine-cpu-us/req")
				if fl.machine > 0 {
					b.ReportMetric(perReq(fl.machine, fl.requests), "fields-machine-cpu-us/req")
				}
				b.ReportMetric(off.machine.Seconds()/off.elapsed.Seconds(), "off-cores-busy")
				b.ReportMetric(on.machine.Seconds()/on.elapsed.Seconds(), "on-cores-busy")
			}
			b.ReportMetric(ms(off.p50, off.rounds), "off-p50-ms")
			b.ReportMetric(ms(on.p50, on.rounds), "on-p50-ms")
			b.ReportMetric(ms(off.p99, off.rounds), "off-p99-ms")
			b.ReportMetric(ms(on.p99, on.rounds), "on-p99-ms")
		})
	}
}

// newLabelled makes a limiter under the profile label of the side it
// serves (side=NAME), so that the goroutines it starts (its pipelines, the
// give-back sender, the sweep) carry the label as the side's connections
// do, and -tagfocus side=NAME counts its background work too.
func newLabelled(side string, rdb redis.UniversalClient, opts ratelimit.Options) (l *ratelimit.Limiter, err error) {
	pprof.Do(context.Background(), pprof.Labels("side", side), func(context.Context) { l, err = ratelimit.New(rdb, opts) })
	return l, err
}

// limiterCounts are a limiter's decisions, those spent from a lease or a
// block and those sent to Redis (each waits in a pipeline's queue), as
// its metrics count them.
type limiterCounts struct{ decided, leased, trips float64 }

// countsOf reads g's limiterCounts (none for a nil g).
func countsOf(b *testing.B, g prometheus.Gatherer) limiterCounts {
	if g == nil {
		return limiterCounts{}
	}
	return limiterCounts{
		decided: testenv.CounterSum(b, g, "petstore_ratelimit_decisions_total", nil),
		leased:  testenv.CounterSum(b, g, "petstore_ratelimit_leased_total", nil),
		trips:   float64(testenv.Histogram(b, g, "petstore_ratelimit_queue_wait_seconds").GetSampleCount()),
	}
}

// add adds to c what the counts grew by from before to now.
func (c *limiterCounts) add(now, before limiterCounts) {
	c.decided += now.decided - before.decided
	c.leased += now.leased - before.leased
	c.trips += now.trips - before.trips
}

// redisRateLimiter decides each window of a policy with redis_rate (a
// GCRA call each, its burst the window's limit), one after the other, and
// states the result as a Decision, so that the response carries the same
// rate-limit fields: the third side of BenchmarkServeWithWrk.
type redisRateLimiter struct{ rl *redis_rate.Limiter }

func (r redisRateLimiter) Allow(ctx context.Context, key string, p ratelimit.Policy) (ratelimit.Decision, error) {
	d := ratelimit.Decision{Outcome: ratelimit.Allowed, Windows: make([]ratelimit.WindowState, len(p.Windows)), Time: time.Now()}
	for i, w := range p.Windows {
		res, err := r.rl.Allow(ctx, "rr:"+key+":"+ratelimit.FormatPeriod(w.Period), redis_rate.Limit{Rate: int(w.Limit), Burst: int(w.Limit), Period: w.Period})
		if err != nil {
			return ratelimit.Decision{}, err
		}
		d.Windows[i] = ratelimit.WindowState{Window: w, Remaining: int64(res.Remaining), Reset: d.Time.Add(res.ResetAfter)}
		if d.Windows[i].Remaining <= d.Windows[d.Binding].Remaining {
			d.Binding = i
		}
		if res.Allowed == 0 {
			d.Outcome, d.RetryAfter = ratelimit.Limited, res.RetryAfter
			break
		}
	}
	return d, nil
}

// checkSideFields fails the benchmark unless the sides answer with the
// same header fields but for the three rate-limit fields (five with
// draftFields), which every side with a limiter (on, redis_rate, fields)
// sends and off does not: else the sides' ratios would compare different
// responses. serve starts a side's server and returns its address.
func checkSideFields(b *testing.B, key string, serve func(string, httpapi.Limiter) string, draftFields bool, off, on, rr, fields httpapi.Limiter) {
	b.Helper()
	names := func(name string, l httpapi.Limiter) []string {
		req, err := http.NewRequest(http.MethodGet, serve(name+"-check", l)+"/v1/pets?limit=20", nil)
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: status %d", name, resp.StatusCode)
		}
		var ns []string
		for n := range resp.Header {
			if n != "Date" && n != "X-Request-Id" {
				ns = append(ns, n)
			}
		}
		slices.Sort(ns)
		return ns
	}
	want := names("on", on)
	for _, side := range []struct {
		name string
		l    httpapi.Limiter
	}{{"redis_rate", rr}, {"fields", fields}} {
		if got := names(side.name, side.l); !slices.Equal(got, want) {
			b.Fatalf("%s answers with fields %v, on with %v", side.name, got, want)
		}
	}
	limitFields := []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}
	if !draftFields {
		limitFields = limitFields[2:]
	}
	withoutLimit := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return slices.Contains(limitFields, n) })
	if len(withoutLimit) != len(want)-len(limitFields) || !draftFields && (slices.Contains(want, "Ratelimit") || slices.Contains(want, "Ratelimit-Policy")) {
		b.Fatalf("on answers with fields %v, want the rate-limit fields %v among them, and no other", want, limitFields)
	}
	if got := names("off", off); !slices.Equal(got, withoutLimit) {
		b.Fatalf("off answers with fields %v, want %v", got, withoutLimit)
	}
}

// fieldsOnly admits every request at once, in process, with the
// decision a limiter would give it (the policy's windows, one request
// spent of each, a clock read for their resets), so that the response
// carries the same rate-limit fields: the fourth side of
// BenchmarkServeWithWrk, the contract's fields without a limiter.
type fieldsOnly struct{}

func (fieldsOnly) Allow(_ context.Context, _ string, p ratelimit.Policy) (ratelimit.Decision, error) {
	d := ratelimit.Decision{Outcome: ratelimit.Allowed, Windows: make([]ratelimit.WindowState, len(p.Windows)), Time: time.Now()}
	for i, w := range p.Windows {
		d.Windows[i] = ratelimit.WindowState{Window: w, Remaining: w.Limit - 1, Reset: d.Time.Add(w.Period)}
		if d.Windows[i].Remaining <= d.Windows[d.Binding].Remaining {
			d.Binding = i
		}
	}
	return d, nil
}

// wrkSeconds is how long each wrk round runs: 8, or BENCH_WRK_SECONDS
// (a cold key reserves its day window once its minute shows its rate:
// rounds of 30 s or more show that steady state).
var wrkSeconds = func() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_WRK_SECONDS")); err == nil && n > 0 {
		return n
	}
	return 8
}()

// wrkWarmup is how long wrk runs, untimed, before each timed round:
// BENCH_WRK_WARMUP seconds, none by default. A side's keys otherwise
// start each round with the history of their last round, two or more
// rounds ago (the lease table keeps an idle key 10 s at most), and what a
// key reserves is sized on that history.
var wrkWarmup = func() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_WRK_WARMUP")); err == nil && n > 0 {
		return n
	}
	return 0
}()

// writeWrkScript writes a wrk script that sends every request with the
// next key in turn (each thread starting elsewhere in the list) and
// returns its path.
func writeWrkScript(b *testing.B, dir string, keys []string) string {
	var s strings.Builder
	s.WriteString("local keys = {\n")
	for _, k := range keys {
		fmt.Fprintf(&s, "%q,\n", k)
	}
	s.WriteString(`}
local i = 0
function init(args) i = math.random(#keys) end
function request()
  i = i % #keys + 1
  return wrk.format("GET", "/v1/pets?limit=20", {["Authorization"] = "Bearer " .. keys[i]})
end
`)
	p := filepath.Join(dir, "keys.lua")
	if err := os.WriteFile(p, []byte(s.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	return p
}

var (
	wrkRequests = regexp.MustCompile(`(\d+) requests in ([\d.]+)(\w+)`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkErrors   = regexp.MustCompile(`Socket errors: .*`)
	wrkP50      = regexp.MustCompile(`\s50%\s+([\d.]+[mun]?s)`)
	wrkP99      = regexp.MustCompile(`\s99%\s+([\d.]+[mun]?s)`)
)

// runWrk runs wrk against url for wrkSeconds and returns the requests it
// completed, the time they took, the median and 99th percentile of their
// latency and wrk's own CPU time. Every answer must be 2xx: the workloads
// stay under their limits.
func runWrk(b *testing.B, script, url string) (n float64, d, p50, p99, cpu time.Duration) {
	return runWrkFor(b, script, url, wrkSeconds)
}

// runWrkFor is runWrk for secs seconds.
func runWrkFor(b *testing.B, script, url string, secs int) (n float64, d, p50, p99, cpu time.Duration) {
	cmd := exec.Command("wrk", "--latency", "-t", "2", "-c", "32", "-d", strconv.Itoa(secs)+"s", "-s", script, url+"/v1/pets?limit=20")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		b.Fatalf("wrk: %s answers were not 2xx:\n%s", m[1], out)
	}
	if m := wrkErrors.Find(out); m != nil {
		b.Fatalf("wrk: %s\n%s", m, out)
	}
	m := wrkRequests.FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk: no request count in:\n%s", out)
	}
	n, _ = strconv.ParseFloat(string(m[1]), 64)
	d, err = time.ParseDuration(string(m[2]) + string(m[3]))
	if err != nil {
		b.Fatalf("wrk: %v in:\n%s", err, out)
	}
	for _, q := range []struct {
		re *regexp.Regexp
		to *time.Duration
	}{{wrkP50, &p50}, {wrkP99, &p99}} {
		m := q.re.FindSubmatch(out)
		if m == nil {
			b.Fatalf("wrk: no latency distribution in:\n%s", out)
		}
		if *q.to, err = time.ParseDuration(string(m[1])); err != nil {
			b.Fatalf("wrk: %v in:\n%s", err, out)
		}
	}
	return n, d, p50, p99, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// machineCPU returns the CPU time every core of the machine has spent
// busy (not idle, waiting for I/O or stolen by the hypervisor) since
// boot, from /proc/stat, or 0 where there is none. Its unit, USER_HZ, is
// 100 a second on Linux.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0
		}
		// User, nice, system, then idle and iowait (not busy), irq and
		// softirq; steal is the hypervisor's, and guest time is already
		// counted in user time.
		if i != 3 && i != 4 && i < 7 {
			busy += n
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// medianPing returns the median of 200 PING round trips on rdb, one at a
// time: the limiter's distance from Redis, with BENCH_REDIS_DELAY.
func medianPing(b *testing.B, rdb *redis.Client) time.Duration {
	rtts := make([]time.Duration, 200)
	for i := range rtts {
		start := time.Now()
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
		rtts[i] = time.Since(start)
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}

// processCPU returns this process's user and system CPU time.
func processCPU(b *testing.B) time.Duration {
	cpu, ok := testenv.ProcessCPU()
	if !ok {
		b.Fatal("this system's CPU time is not read")
	}
	return cpu
}

// gcCPU returns the CPU seconds the collector has spent so far, as the
// runtime estimates them: the share of a side's server CPU that GOGC and
// GOMEMLIMIT act on.
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64()
}

// privateRedis is a redis-server this benchmark starts and stops.
type privateRedis struct {
	addr string
	rdb  *redis.Client
}

func startPrivateRedis(b *testing.B, dir string) *privateRedis {
	port := testenv.FreePort(b)
	args := []string{"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	if cpu := os.Getenv("BENCH_REDIS_CPU"); cpu != "" {
		args = append([]string{"taskset", "-c", cpu}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	testenv.EndWithTest(cmd)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	r := &privateRedis{addr: "127.0.0.1:" + strconv.Itoa(port)}
	r.rdb = redis.NewClient(&redis.Options{Addr: r.addr})
	b.Cleanup(func() { _ = r.rdb.Close() })
	for deadline := time.Now().Add(10 * time.Second); r.rdb.Ping(context.Background()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("redis-server on %s did not start", r.addr)
		}
	}
	return r
}

// cpu returns the server's user and system CPU time (INFO CPU).
func (r *privateRedis) cpu(b *testing.B) time.Duration {
	info, err := r.rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// scripts returns the calls of the decision code the server has run
// (FCALL, EVALSHA and EVAL) and the time they took (µs), from INFO
// commandstats.
func (r *privateRedis) scripts(b *testing.B) (calls int64, usec float64) {
	info, err := r.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		for _, name := range []string{"cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"} {
			rest, ok := strings.CutPrefix(line, name)
			if !ok {
				continue
			}
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "calls":
					c, _ := strconv.ParseInt(v, 10, 64)
					calls += c
				case "usec":
					u, _ := strconv.ParseFloat(v, 64)
					usec += u
				}
			}
		}
	}
	return calls, usec
}

// finalizeForBench finalizes l's records and waits for its heartbeat to
// put the mark in force (its gauge, in reg).
func finalizeForBench(b *testing.B, l *ratelimit.Limiter, reg *prometheus.Registry) {
	b.Helper()
	ctx := context.Background()
	if _, _, err := l.Finalize(ctx); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testenv.CounterSum(b, reg, "petstore_ratelimit_records_finalized", nil) != 1 {
		if time.Now().After(deadline) {
			b.Fatal("the finalize mark never came into force")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
