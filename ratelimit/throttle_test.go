package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

func TestThrottle(t *testing.T) {
	t.Parallel()
	lim := ThrottleLimit{Rate: 2, Burst: 3, Period: time.Second}
	check := func(t *testing.T, th *Throttle, clk *fakeClock) {
		t.Helper()
		ctx := context.Background()
		// Throttled only looks: asked many times, it spends nothing.
		for range 10 {
			if th, err := th.Throttled(ctx, "10.0.0.1"); err != nil || th {
				t.Fatalf("Throttled with the whole burst left: %v %v", th, err)
			}
		}
		for i := range 3 {
			d, err := th.Allow(ctx, "10.0.0.1")
			if err != nil || !d.Allowed() || d.Windows[0].Remaining != int64(2-i) {
				t.Fatalf("burst request %d: %+v %v", i, d, err)
			}
		}
		d, err := th.Allow(ctx, "10.0.0.1")
		if err != nil || d.Outcome != Limited || d.RetryAfter <= 0 || d.RetryAfter > 500*time.Millisecond {
			t.Fatalf("over the burst: %+v %v, want limited for up to one emission interval", d, err)
		}
		if thr, err := th.Throttled(ctx, "10.0.0.1"); err != nil || !thr {
			t.Fatalf("Throttled over the burst: %v %v", thr, err)
		}
		if d, _ := th.Allow(ctx, "10.0.0.2"); !d.Allowed() {
			t.Fatalf("another address: %+v", d)
		}
		clk.Add(d.RetryAfter)
		if d, _ := th.Allow(ctx, "10.0.0.1"); !d.Allowed() {
			t.Fatalf("after RetryAfter: %+v", d)
		}
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		m := miniredis.RunT(t)
		clk := &fakeClock{mini: m}
		clk.Set(epoch)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		defer rdb.Close()
		th, err := newThrottle(rdb, "ip", "address throttling", lim, Options{Timeout: 2 * time.Second}, hooks{clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer th.Close()
		check(t, th, clk)
		keys := m.Keys()
		if len(keys) != 2 || keys[0] != "rate:petstore:rl:ip:{10.0.0.1}" {
			t.Fatalf("keys %v", keys)
		}
	})
	t.Run("local", func(t *testing.T) {
		t.Parallel()
		clk := &fakeClock{}
		clk.Set(epoch)
		th, err := newThrottle(nil, "ip", "address throttling", lim, Options{}, hooks{clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer th.Close()
		check(t, th, clk)
	})
	t.Run("failure modes", func(t *testing.T) {
		t.Parallel()
		m := miniredis.RunT(t)
		clk := &fakeClock{mini: m}
		clk.Set(epoch)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		defer rdb.Close()
		open, err := newThrottle(rdb, "ip", "address throttling", lim, Options{Timeout: 2 * time.Second, Replicas: 3}, hooks{clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer open.Close()
		closed, err := newThrottle(rdb, "ip", "address throttling", lim, Options{Timeout: 2 * time.Second, FailureMode: FailClosed}, hooks{clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer closed.Close()
		m.SetError("LOADING Redis is loading the dataset in memory")
		ctx := context.Background()
		d, err := open.Allow(ctx, "a")
		if err != nil || !d.Allowed() || !d.Degraded || d.Windows[0].Limit != 1 {
			t.Fatalf("fail-open: %+v %v, want degraded with burst ceil(3/3)", d, err)
		}
		if d, _ := open.Allow(ctx, "a"); d.Allowed() {
			t.Fatalf("fail-open second request within the local burst of 1: %+v", d)
		}
		if _, err := closed.Allow(ctx, "a"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("fail-closed: %v", err)
		}
	})
	if _, err := NewThrottle(nil, ThrottleLimit{}, Options{}); err == nil {
		t.Fatal("a zero limit must be refused")
	}
}

// TestNamedThrottle: a named throttle keeps its own state and figures, so
// it never spends another throttle's budget for the same key.
func TestNamedThrottle(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	opts := Options{Timeout: 2 * time.Second, Registerer: reg}
	lim := ThrottleLimit{Rate: 1, Burst: 1, Period: time.Hour}
	ip, err := NewThrottle(rdb, lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer ip.Close()
	named, err := NewNamedThrottle(rdb, "rate_limit", lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	ctx := context.Background()
	for i, want := range []Outcome{Allowed, Limited} {
		d, err := named.Allow(ctx, "key_1")
		if err != nil || d.Outcome != want {
			t.Fatalf("named throttle, request %d: %+v %v, want %s", i+1, d, err, want)
		}
	}
	if d, err := ip.Allow(ctx, "key_1"); err != nil || !d.Allowed() {
		t.Fatalf("the ip throttle spent by the named one: %+v %v", d, err)
	}
	if keys := m.Keys(); len(keys) != 2 || keys[0] != "rate:petstore:rl:ip:{key_1}" || keys[1] != "rate:petstore:rl:rate_limit:{key_1}" {
		t.Fatalf("keys %v", keys)
	}
	met, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		plan, outcome string
		want          float64
	}{{"rate_limit", "allowed", 1}, {"rate_limit", "limited", 1}, {"ip", "allowed", 1}, {"ip", "limited", 0}} {
		if got := metricValue(t, met.decisions.WithLabelValues(c.plan, c.outcome)); got != c.want {
			t.Errorf("decisions_total{plan=%q,outcome=%q} = %v, want %v", c.plan, c.outcome, got, c.want)
		}
	}
	for _, name := range []string{"", "IP", "a b", "x{y}", "rate:limit"} {
		if _, err := NewNamedThrottle(nil, name, lim, Options{}); err == nil {
			t.Errorf("throttle name %q accepted", name)
		}
	}
}

// TestThrottleKeepsItsRate checks a Throttle's promise over generated
// limits and traffic, shared (redis_rate's script on miniredis, and on a
// real Redis by real time) and in process: between any two admissions t1
// and t2, at most Burst + ⌊(t2-t1)/τ⌋ are admitted (τ = Period/Rate, the
// GCRA bound, by the server's clock when shared); a refused request's
// Retry-After is enough (the retry then is admitted); and Throttled,
// which spends nothing, answers as Allow would at the same instant
// (shared, but for the instant a budget reopens).
func TestThrottleKeepsItsRate(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 7)
	type setup struct {
		name  string
		cases int
		make  func(t *testing.T, lim ThrottleLimit) (th *Throttle, advance func(time.Duration), now func() time.Time)
	}
	fake := func(mini bool) func(t *testing.T, lim ThrottleLimit) (*Throttle, func(time.Duration), func() time.Time) {
		return func(t *testing.T, lim ThrottleLimit) (*Throttle, func(time.Duration), func() time.Time) {
			clk := &fakeClock{}
			var client redis.UniversalClient // nil: in process
			if mini {
				m := miniredis.RunT(t)
				clk.mini = m
				rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
				t.Cleanup(func() { _ = rdb.Close() })
				client = rdb
			}
			clk.Set(epoch)
			th, err := newThrottle(client, "ip", "address throttling", lim, Options{Timeout: 2 * time.Second, Registerer: prometheus.NewRegistry()}, hooks{clock: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = th.Close() })
			return th, func(d time.Duration) { clk.Add(d) }, clk.Now
		}
	}
	setups := []setup{{"miniredis", max(*invariantCases, 40), fake(true)}, {"local", max(*invariantCases, 40), fake(false)}}
	if os.Getenv(testenv.RedisVar) != "" || testenv.InCI() {
		setups = append(setups, setup{"redis", 6, func(t *testing.T, lim ThrottleLimit) (*Throttle, func(time.Duration), func() time.Time) {
			rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
			t.Cleanup(func() { _ = rdb.Close() })
			th, err := NewThrottle(rdb, lim, Options{Prefix: randomPrefix(t), Timeout: time.Second, Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = th.Close() })
			// The wall clock, which the server's TIME reads on this host: a
			// time sync that steps or slews it moves both alike.
			return th, time.Sleep, func() time.Time { return time.Now().Round(0) }
		}})
	}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			for c := range s.cases {
				lim := ThrottleLimit{Rate: 1 + rng.IntN(200), Burst: 1 + rng.IntN(50), Period: genPeriod(rng, time.Hour)}
				steps := 300
				if s.name == "redis" {
					// Real time: emission intervals of 20-100 ms, a few
					// seconds a case.
					lim = ThrottleLimit{Rate: 1 + rng.IntN(50), Burst: 1 + rng.IntN(10)}
					lim.Period = time.Duration(lim.Rate) * time.Duration(20+rng.IntN(81)) * time.Millisecond
					steps = 60
				}
				tau := lim.Period / time.Duration(lim.Rate)
				t.Run(fmt.Sprintf("case%d-%d-per-%s-burst-%d", c, lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
					th, advance, now := s.make(t, lim)
					ctx := context.Background()
					// Each admission's time lies between its send and its
					// answer (the same instant on a fake clock).
					var sent []time.Time
					allow := func() Decision {
						t.Helper()
						s0 := now()
						d, err := th.Allow(ctx, "a")
						if err != nil || d.Degraded {
							t.Fatalf("%+v %v", d, err)
						}
						if !d.Allowed() {
							return d
						}
						x := now()
						for i := len(sent) - 1; i >= 0; i-- {
							n := len(sent) - i + 1 // admissions from the i-th to this one
							span := x.Sub(sent[i])
							if s.name == "miniredis" {
								// The server reads the clock to the µs.
								span += time.Microsecond
							}
							if n > lim.Burst+int(span/tau) {
								t.Fatalf("%d admissions within %s (from %v to %v), past burst %d + %s/τ (τ %s)",
									n, span, sent[i], x, lim.Burst, span, tau)
							}
						}
						sent = append(sent, s0)
						return d
					}
					for range steps {
						var dt time.Duration
						switch rng.IntN(6) {
						case 0:
						case 1, 2:
							dt = time.Duration(rng.Int64N(int64(tau) + 1))
						case 3:
							dt = tau
						case 4:
							dt = time.Duration(rng.Int64N(int64(tau)*int64(lim.Burst) + 1))
						default:
							dt = time.Duration(rng.Int64N(int64(lim.Period) + 1))
						}
						if s.name == "redis" {
							dt = min(dt, 150*time.Millisecond)
						} else {
							dt = dt.Truncate(time.Microsecond)
						}
						advance(dt)
						if s.name != "redis" && rng.IntN(4) == 0 {
							// The peek, then the request it describes, at the
							// same instant. Shared, redis_rate's floating
							// point may still say throttled at the very
							// instant a budget reopens (README): the request
							// is then admitted as the budget's last (its key
							// reset a whole burst of emission intervals away).
							thr, err := th.Throttled(ctx, "a")
							if err != nil {
								t.Fatal(err)
							}
							d := allow()
							if thr == d.Allowed() {
								reset := d.Windows[0].Reset.Sub(now())
								boundary := s.name != "local" && thr && (reset-time.Duration(lim.Burst)*tau).Abs() <= 2*time.Microsecond
								if !boundary {
									t.Fatalf("Throttled said %v, then Allow at the same instant %+v (reset in %s, burst of intervals %s)", thr, d, reset, time.Duration(lim.Burst)*tau)
								}
							}
							continue
						}
						d := allow()
						if d.Allowed() || rng.IntN(3) > 0 {
							continue
						}
						if d.RetryAfter <= 0 {
							t.Fatalf("refused with Retry-After %s", d.RetryAfter)
						}
						// Honour Retry-After (to the microsecond, redis_rate's
						// arithmetic being in floating point): admitted.
						advance(d.RetryAfter + time.Microsecond)
						if d := allow(); !d.Allowed() {
							t.Fatalf("refused again after waiting its Retry-After: %+v", d)
						}
					}
					if len(sent) == 0 {
						t.Fatal("nothing admitted")
					}
				})
				if t.Failed() {
					return
				}
			}
		})
	}
}
