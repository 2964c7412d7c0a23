package ratelimit

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// BenchmarkNearLimit prices leases in Redis CPU for keys close to their
// limits, where they are smallest and most often refused by the margin
// (lease.go): nearLimitKeys keys, each with a per-minute limit of 600 to
// 6,000 and Poisson arrivals at 80-99% of it, spread at random over a
// fleet of replicas, as in TestLeasesRefuseLittleBelowTheLimit but on
// real Redis and real time. Two sides take the same arrivals at the same
// moments, each on a private redis-server of its own, so that the load
// from elsewhere on the machine weighs on both alike: the limiter as it
// ships ("leases") and the same with leases and blocks off,
// MaxLease 1 ("whole"). After a minute of warming, by when every window
// holds a minute of its traffic, a measured half minute reports per side:
// Redis CPU per decision (the server process's own time, INFO CPU),
// script calls per decision, the share of decisions leased and the share
// refused, and the ratio of the two sides' Redis CPU.
//
//	PETSTORE_TEST_REDIS_ADDR=127.0.0.1:6379 go test ./ratelimit -run '^$' -bench NearLimit -benchtime 1x
func BenchmarkNearLimit(b *testing.B) {
	testenv.RedisAddr(b)
	for _, replicas := range []int{1, 4} {
		b.Run("replicas="+strconv.Itoa(replicas), func(b *testing.B) {
			for range b.N {
				nearLimitRound(b, replicas)
			}
		})
	}
}

const (
	nearLimitKeys    = 40
	nearLimitWarm    = time.Minute
	nearLimitMeasure = 30 * time.Second
)

// nearLimitSide is one limiter fleet on its own redis-server, and what it
// decided while measured.
type nearLimitSide struct {
	name                            string
	rdb                             *redis.Client
	replicas                        []*Limiter
	measuring                       atomic.Bool
	decisions, refused, leased, bad atomic.Int64
	cpu                             time.Duration
	scripts                         int64
}

func nearLimitRound(b *testing.B, replicas int) {
	sides := []*nearLimitSide{{name: "leases"}, {name: "whole"}}
	for i, s := range sides {
		srv := startRedisServer(b)
		s.rdb = redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 64})
		b.Cleanup(func() { _ = s.rdb.Close() })
		maxLease := 0 // the default
		if i == 1 {
			maxLease = 1
		}
		for range replicas {
			l, err := newLimiter(s.rdb, Options{Timeout: time.Second, Replicas: replicas, MaxLease: maxLease, Registerer: prometheus.NewRegistry()}, hooks{noHeartbeat: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			s.replicas = append(s.replicas, l)
		}
	}
	b.ResetTimer()
	ctx := context.Background()
	start := time.Now()
	stop := start.Add(nearLimitWarm + nearLimitMeasure)
	var requests sync.WaitGroup
	var keys sync.WaitGroup
	for k := range nearLimitKeys {
		// Limits and fractions spread over their ranges, in different
		// orders, so that a key's limit says nothing of its fraction.
		limit := int64(600 + 5400*k/(nearLimitKeys-1))
		frac := 0.80 + 0.19*float64(k*17%nearLimitKeys)/float64(nearLimitKeys-1)
		p := Policy{Name: "near", Windows: []Window{{Limit: limit, Period: time.Minute}}}
		rate := float64(limit) / 60 * frac // a second
		key := "key-" + strconv.Itoa(k)
		rng := rand.New(rand.NewPCG(uint64(k), 1))
		keys.Add(1)
		go func() {
			defer keys.Done()
			at := start
			for {
				at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
				if !at.Before(stop) {
					return
				}
				time.Sleep(time.Until(at))
				r := rng.IntN(replicas)
				for _, s := range sides {
					requests.Add(1)
					go func() {
						defer requests.Done()
						// Counted by when it was sent.
						measured := s.measuring.Load()
						d, err := s.replicas[r].Allow(ctx, key, p)
						if !measured {
							return
						}
						switch {
						case err != nil || d.Degraded:
							s.bad.Add(1)
						case !d.Allowed():
							s.refused.Add(1)
						case d.Leased:
							s.leased.Add(1)
						}
						s.decisions.Add(1)
					}()
				}
			}
		}()
	}
	// Measure from the end of the warm-up to the end of the arrivals.
	time.Sleep(time.Until(start.Add(nearLimitWarm)))
	type snapshot struct {
		cpu     time.Duration
		scripts int64
	}
	snap := func(s *nearLimitSide) snapshot {
		st := allCommandStats(b, s.rdb)
		return snapshot{redisCPU(b, s.rdb), st["fcall"].calls + st["evalsha"].calls + st["eval"].calls}
	}
	before := make([]snapshot, len(sides))
	for i, s := range sides {
		before[i] = snap(s)
		s.measuring.Store(true)
	}
	keys.Wait()
	requests.Wait()
	for i, s := range sides {
		s.measuring.Store(false)
		after := snap(s)
		s.cpu = after.cpu - before[i].cpu
		s.scripts = after.scripts - before[i].scripts
	}
	b.StopTimer()
	for _, s := range sides {
		n := float64(s.decisions.Load())
		if bad := s.bad.Load(); bad > 0 {
			b.Fatalf("%s: %d decisions failed or degraded", s.name, bad)
		}
		b.ReportMetric(n/nearLimitMeasure.Seconds(), s.name+"-decisions/s")
		b.ReportMetric(s.cpu.Seconds()*1e6/n, s.name+"-redis-cpu-us/decision")
		b.ReportMetric(float64(s.scripts)/n, s.name+"-script-calls/decision")
		b.ReportMetric(float64(s.leased.Load())/n, s.name+"-leased/decision")
		b.ReportMetric(float64(s.refused.Load())/n, s.name+"-refused/decision")
	}
	b.ReportMetric(sides[0].cpu.Seconds()/sides[1].cpu.Seconds(), "leases/whole-redis-cpu")
}
