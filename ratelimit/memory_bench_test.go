package ratelimit

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

var memoryKeys = flag.Int("memory.keys", 20_000, "API keys BenchmarkRedisMemory fills in each case")

// memoryFree is the built-in free plan (plan.Defaults: 60 a minute, 1,000
// a day, plan.StandardBan's rule), written out: internal/plan imports this
// package, so this package cannot import it.
var memoryFree = Policy{
	Name:    "free",
	Windows: []Window{{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}},
	Ban:     BanPolicy{Threshold: 20, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Max: time.Hour, Memory: 24 * time.Hour},
}

// memoryThree is a plan of three windows, with the ban rule plan.StandardBan
// would give it (a third of its tightest quota a minute).
var memoryThree = Policy{
	Name:    "three",
	Windows: []Window{{Limit: 10, Period: time.Second}, {Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}},
	Ban:     BanPolicy{Threshold: 200, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Max: time.Hour, Memory: 24 * time.Hour},
}

// memoryResult is what one case of BenchmarkRedisMemory measured.
type memoryResult struct {
	name              string
	requests, keys    int
	bytes, redisKeys  int64 // added by the fill
	fill, redisCPU    time.Duration
	decisions, leased int64
	refused           int64
}

func (r memoryResult) bytesPerKey() float64 { return float64(r.bytes) / float64(r.keys) }

// BenchmarkRedisMemory measures the Redis memory the limiter's records
// take per API key, as Redis accounts it: used_memory (INFO memory, less
// the clients' buffers) after -memory.keys keys have each sent the case's
// requests through a Limiter, less the same before, divided by the keys.
// It assumes nothing of the records' layout. Each case starts on a flushed
// private redis-server with a Limiter as a fleet runs it after its first
// minute (finalized: blocks in force), whose heartbeats, census and
// registry marks exist before the first reading, and Closes it (its
// give-backs sent) before the second. Keys are named as the service names
// them (key_ and 16 hex digits) and send one request each per pass, from
// compareCallers goroutines, so that a key's requests spread over the
// fill, as a key's do over a minute, and the limiter batches the
// concurrent ones into few round trips; each key's requests must fall
// within a minute.
//
// A record lives a little longer than its period after the key's last
// request: a 1 s window's for about a second. Active expiry is off while
// a case runs, so that the second reading holds every key as it was just
// after its last request, whatever the fill's and the reading's pace
// (nothing reads a record after the fill, so none is expired lazily).
//
// Also reported, per case: decisions per second of Redis CPU (INFO cpu,
// used_cpu_user and used_cpu_sys, over the fill: what one Redis core
// decides a second at this load; leased decisions, made in process,
// count too) and Redis keys per API key; and the free plan at 3 requests
// scaled to a million keys, marked extrapolated unless -memory.keys is
// 1000000 (Redis's key dictionaries grow in powers of two, so a scaled
// figure is off by a few tens of bytes a key).
//
//	PETSTORE_TEST_REDIS_ADDR=127.0.0.1:6379 go test ./ratelimit -run '^$' -bench RedisMemory -benchtime 1x -v
//	PETSTORE_TEST_REDIS_ADDR=127.0.0.1:6379 go test ./ratelimit -run '^$' -bench 'RedisMemory/free-3$' -benchtime 1x -v -args -memory.keys 1000000
func BenchmarkRedisMemory(b *testing.B) {
	testenv.RedisAddr(b)
	// DEBUG: SET-ACTIVE-EXPIRE, and HTSTATS, which shows whether a
	// dictionary is being rehashed.
	srv := startRedisServer(b, "--enable-debug-command", "local")
	probe := redis.NewClient(&redis.Options{Addr: srv.addr})
	b.Cleanup(func() { _ = probe.Close() })
	var results []memoryResult
	for _, c := range []struct {
		p        Policy
		requests int
	}{
		{memoryFree, 1}, {memoryFree, 3}, {memoryFree, 10}, {memoryFree, 60}, {memoryThree, 3},
	} {
		name := c.p.Name + "-" + strconv.Itoa(c.requests)
		b.Run(name, func(b *testing.B) {
			var r memoryResult
			for range b.N {
				r = fillMemory(b, srv.addr, probe, c.p, c.requests, *memoryKeys)
			}
			r.name = name
			results = append(results, r)
			b.ReportMetric(r.bytesPerKey(), "B/key")
			b.ReportMetric(float64(r.redisKeys)/float64(r.keys), "redis-keys/key")
			b.ReportMetric(float64(r.decisions)/r.redisCPU.Seconds(), "decisions/redis-cpu-s")
			if name == "free-3" {
				b.ReportMetric(r.bytesPerKey()*1e6/1e9, millionUnit(r.keys))
			}
		})
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\n%-8s %8s %9s %11s %11s %8s %12s %12s %8s %8s\n",
		"case", "requests", "keys", "redis keys", "bytes/key", "fill s", "decisions/s", "per cpu-s", "leased", "refused")
	for _, r := range results {
		fmt.Fprintf(&t, "%-8s %8d %9d %11.2f %11.0f %8.1f %12.0f %12.0f %7.1f%% %8d\n",
			r.name, r.requests, r.keys, float64(r.redisKeys)/float64(r.keys), r.bytesPerKey(), r.fill.Seconds(),
			float64(r.decisions)/r.fill.Seconds(), float64(r.decisions)/r.redisCPU.Seconds(),
			100*float64(r.leased)/float64(r.decisions), r.refused)
		if r.name == "free-3" {
			how := "measured"
			if r.keys != 1_000_000 {
				how = "extrapolated from " + strconv.Itoa(r.keys) + " keys"
			}
			fmt.Fprintf(&t, "free-3 at 1,000,000 keys: %.2f GB (%s)\n", r.bytesPerKey()*1e6/1e9, how)
		}
	}
	b.Log(t.String())
}

// millionUnit names the metric of a million keys' gigabytes (10⁹ bytes):
// extrapolated unless keys is a million.
func millionUnit(keys int) string {
	if keys == 1_000_000 {
		return "GB/1M-keys"
	}
	return "extrapolated-GB/1M-keys"
}

// fillMemory flushes the server at addr, starts a Limiter on it, fills
// keys keys with requests each under p, and returns what it measured.
func fillMemory(b *testing.B, addr string, probe *redis.Client, p Policy, requests, keys int) memoryResult {
	b.StopTimer()
	ctx := context.Background()
	if err := probe.FlushAll(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	if err := probe.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "0").Err(); err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2 * compareCallers})
	defer rdb.Close()
	l, err := New(rdb, Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	// The steady state of a fleet: it finalizes by itself after
	// FinalizeAfter (a minute), and a short window then has a coarse
	// record beside its own.
	if _, _, err := l.Finalize(ctx); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !l.blocksOn(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("blocks not in force 10 s after Finalize")
		}
	}
	// A key of the plan's own, so that its registry marks and the decision
	// code exist before the first reading, then time for a heartbeat and a
	// marking to write them.
	for range requests {
		if _, err := l.Allow(ctx, "key_warm", p); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(2*heartbeatEvery + registryEvery)
	mem0, keys0 := recordMemory(b, probe)

	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("key_%016x", i)
	}
	var decisions, leased, refused, failed atomic.Int64
	// When each key sent its first request and had its last answered.
	first, last := make([]time.Time, keys), make([]time.Time, keys)
	cpu0 := redisCPU(b, probe)
	b.StartTimer()
	start := time.Now()
	for pass := range requests {
		inParallel(int64(keys), func(i int64) bool {
			if pass == 0 {
				first[i] = time.Now()
			}
			d, err := l.Allow(ctx, names[i], p)
			if err != nil || d.Degraded {
				failed.Add(1)
				return false
			}
			if pass == requests-1 {
				last[i] = time.Now()
			}
			decisions.Add(1)
			if d.Leased {
				leased.Add(1)
			}
			if !d.Allowed() {
				refused.Add(1)
			}
			return true
		})
	}
	fill := time.Since(start)
	b.StopTimer()
	cpu := redisCPU(b, probe) - cpu0
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d decisions failed or were made without Redis: their records are missing", n)
	}
	var spread time.Duration
	for i := range first {
		spread = max(spread, last[i].Sub(first[i]))
	}
	if spread > time.Minute {
		b.Errorf("a key's requests spread over %v, more than a minute: use fewer -memory.keys", spread.Round(time.Second))
	}
	_ = l.Close()
	waitRehashed(b, probe)
	mem1, keys1 := recordMemory(b, probe)
	return memoryResult{
		requests: requests, keys: keys,
		bytes: mem1 - mem0, redisKeys: keys1 - keys0,
		fill: fill, redisCPU: cpu,
		decisions: decisions.Load(), leased: leased.Load(), refused: refused.Load(),
	}
}

// recordMemory returns Redis's used_memory less its clients' buffers (the
// limiter's connections come and go), and the number of keys.
func recordMemory(b *testing.B, rdb *redis.Client) (bytes, keys int64) {
	b.Helper()
	ctx := context.Background()
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	fields := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			fields[k] = n
		}
	}
	keys, err = rdb.DBSize(ctx).Result()
	if err != nil {
		b.Fatal(err)
	}
	return fields["used_memory"] - fields["mem_clients_normal"], keys
}

// waitRehashed waits until no dictionary of database 0 is being rehashed:
// while one is, both of its tables are allocated.
func waitRehashed(b *testing.B, rdb *redis.Client) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := rdb.Do(ctx, "DEBUG", "HTSTATS", "0").Text()
		if err != nil {
			b.Fatal(err)
		}
		if !strings.Contains(s, "rehashing target") {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("database 0 still rehashing after a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
