package ratelimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
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
		th, err := NewThrottle(rdb, lim, Options{clock: clk.Now, Timeout: 2 * time.Second})
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
		th, err := NewThrottle(nil, lim, Options{clock: clk.Now})
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
		open, err := NewThrottle(rdb, lim, Options{clock: clk.Now, Timeout: 2 * time.Second, Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer open.Close()
		closed, err := NewThrottle(rdb, lim, Options{clock: clk.Now, Timeout: 2 * time.Second, FailureMode: FailClosed})
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
