package ratelimit

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// leaseLeft returns the admissions left in key's lease.
func leaseLeft(l *Limiter, key string) int64 {
	sh := l.lease.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		return e.left
	}
	return 0
}

// TestLeaseEndsWithItsBucket takes a lease and checks that it is spent
// only until it ends (here the lease life, inside a 3s bucket), less the
// microsecond the server's clock resolution costs: 2µs before, a request
// is answered from it; 1µs before, Redis decides again.
// Remaining counts down as if every request had gone to Redis, and the
// window's reset is measured from the lease's end.
func TestLeaseEndsWithItsBucket(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := Policy{Name: "lease", Windows: []Window{{Limit: 200, Period: 10 * time.Minute}, {Limit: 100_000, Period: 24 * time.Hour}}}
	// The start of a 3s bucket of the 10-minute window.
	t0 := epoch.Truncate(time.Hour).Add(time.Hour)
	f.clk.Set(t0)
	var leaseAt time.Time
	for i := range 40 {
		before := f.cmds.scripts.Load()
		d := f.allow(t, "k", p)
		if !d.Allowed() || d.Windows[0].Remaining != int64(199-i) {
			t.Fatalf("request %d: %+v, want admitted with %d remaining", i, d, 199-i)
		}
		if !d.Time.Equal(f.clk.Now()) {
			t.Fatalf("request %d decided at %s, want %s", i, d.Time, f.clk.Now())
		}
		if sent := f.cmds.scripts.Load() > before; sent == d.Leased {
			t.Fatalf("request %d: leased %v, but a command sent: %v", i, d.Leased, sent)
		}
		if !d.Leased && leaseLeft(f.l, "k") >= 2 {
			leaseAt = f.clk.Now()
			break
		}
		f.clk.Add(10 * time.Millisecond)
	}
	if leaseAt.IsZero() {
		t.Fatal("no lease of 3 or more for a key sending 100 requests/s")
	}
	leased := testenv.CounterSum(t, f.reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "lease"})
	end := leaseAt.Add(leaseLife)
	f.clk.Set(end.Add(-2 * time.Microsecond))
	before := f.cmds.scripts.Load()
	d := f.allow(t, "k", p)
	if !d.Leased || f.cmds.scripts.Load() != before || !d.Time.Equal(f.clk.Now()) {
		t.Fatalf("2µs before the lease ends: %+v (%d commands), want answered from the lease", d, f.cmds.scripts.Load()-before)
	}
	if got := testenv.CounterSum(t, f.reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "lease"}); got != leased+1 {
		t.Fatalf("leased_total %v after a leased admission, want %v", got, leased+1)
	}
	u, err := f.l.Usage(context.Background(), "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if want := end.Add(10 * time.Minute); u.Windows[0].Reset.Before(want) {
		t.Fatalf("reset %s, want no earlier than the lease's end plus the period, %s", u.Windows[0].Reset, want)
	}
	f.clk.Set(end.Add(-time.Microsecond))
	before = f.cmds.scripts.Load()
	left := leaseLeft(f.l, "k")
	d = f.allow(t, "k", p)
	if d.Leased || f.cmds.scripts.Load() == before || left == 0 {
		t.Fatalf("1µs before the lease's end (%d left in it): %+v, want a round trip", left, d)
	}
	// The admissions left in the lease stay counted, so Remaining drops
	// by them.
	u, _ = f.l.Usage(context.Background(), "k", p)
	if d.Windows[0].Remaining > u.Windows[0].Remaining+d.Windows[0].Limit {
		t.Fatalf("remaining %d after the lease vs %d in Redis", d.Windows[0].Remaining, u.Windows[0].Remaining)
	}
}

// TestLeaseStopsNearTheLimit checks that a key nearing its limit is decided
// one request per round trip, so that it gets exactly its limit.
func TestLeaseStopsNearTheLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 2})
	p := perMinute(300)
	admitted, leased := 0, 0
	var last Decision
	for range 400 {
		d := f.allow(t, "k", p)
		if d.Allowed() {
			admitted++
		}
		if d.Leased {
			leased++
			// A lease is granted only while 4·k·Replicas remain.
			if d.Windows[0].Remaining < 4*2 {
				t.Fatalf("leased admission with %d remaining", d.Windows[0].Remaining)
			}
		}
		last = d
		f.clk.Add(time.Millisecond)
	}
	if admitted != 300 || leased == 0 || last.Outcome != Limited {
		t.Fatalf("admitted %d (%d leased), last %+v: want exactly the limit, some of it leased", admitted, leased, last)
	}
}

// TestLeaseDroppedOnPolicyChange checks a lease taken under one policy is
// not spent under another.
func TestLeaseDroppedOnPolicyChange(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	p := perMinute(10_000)
	for range 20 {
		f.allow(t, "k", p)
	}
	if leaseLeft(f.l, "k") == 0 {
		t.Fatal("no lease after 20 requests at once")
	}
	q := perMinute(20_000)
	before := f.cmds.scripts.Load()
	if d := f.allow(t, "k", q); d.Leased || f.cmds.scripts.Load() == before || d.Windows[0].Limit != 20_000 {
		t.Fatalf("after a policy change: %+v, want decided by Redis under the new policy", d)
	}
}

// TestMaxLeaseOneDisablesLeasing checks Options.MaxLease: 1 sends every
// admission to Redis.
func TestMaxLeaseOneDisablesLeasing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{MaxLease: 1})
	p := perMinute(10_000)
	f.allow(t, "warm-up", p) // loads the script if the preload has not yet
	before := f.cmds.scripts.Load()
	for range 50 {
		if d := f.allow(t, "k", p); d.Leased {
			t.Fatalf("leased with MaxLease 1: %+v", d)
		}
	}
	if n := f.cmds.scripts.Load() - before; n != 50 {
		t.Fatalf("%d commands for 50 admissions, want 50", n)
	}
}

// TestLeasesStrictAcrossReplicas runs three limiters (replicas) on one
// key with bursty random traffic, on one clock, and checks every window
// over the actual admission times: leased admissions included, and
// whichever replica granted them.
func TestLeasesStrictAcrossReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{Replicas: 3, Buckets: 10, CacheSize: -1})
	var ls []*Limiter
	ls = append(ls, f.l)
	for _, cache := range []int{0, -1} {
		l, err := New(f.rdb, Options{Replicas: 3, Buckets: 10, CacheSize: cache, clock: f.clk.Now, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls = append(ls, l)
	}
	p := Policy{Name: "s", Windows: []Window{{Limit: 300, Period: time.Second}, {Limit: 1200, Period: 5 * time.Second}}}
	rng := rand.New(rand.NewPCG(5, 6))
	ctx := context.Background()
	var admitted []int64
	leased, limited := 0, 0
	before := f.cmds.scripts.Load()
	for range 6000 {
		// Bursts at ~400/s, lulls at ~100/s.
		mean := 2500 * time.Microsecond
		if f.clk.Now().UnixMilli()/700%3 == 0 {
			mean = 10 * time.Millisecond
		}
		f.clk.Add(time.Duration(rng.ExpFloat64() * float64(mean)))
		d, err := ls[rng.IntN(len(ls))].Allow(ctx, "k", p)
		if err != nil || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		switch {
		case d.Leased:
			leased++
		case !d.Allowed():
			limited++
		}
		if d.Allowed() {
			// Redis reads its clock in µs: a lease's times may be up to
			// 1µs early.
			if dt := f.clk.Now().Sub(d.Time); dt < 0 || dt >= time.Microsecond {
				t.Fatalf("admission at %s reported at %s", f.clk.Now(), d.Time)
			}
			admitted = append(admitted, f.clk.Now().UnixMicro())
		}
	}
	slices.Sort(admitted)
	for _, w := range p.Windows {
		checkStrict(t, admitted, w)
	}
	cmds := f.cmds.scripts.Load() - before
	t.Logf("%d admitted (%d leased), %d limited, %d commands", len(admitted), leased, limited, cmds)
	if leased < len(admitted)/4 || limited == 0 {
		t.Fatalf("%d of %d admissions leased, %d limited: traffic did not exercise leases near the limit", leased, len(admitted), limited)
	}
}

// TestLeasePacingAdmitsNearlyAll paces a busy key at exactly its limit with
// leasing on: leases taken while the window was filling must not cost the
// steady state more than 1%.
func TestLeasePacingAdmitsNearlyAll(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{CacheSize: -1})
	p := perMinute(1500)
	step := time.Minute / 1500
	n, leased := 0, 0
	total := 4 * 1500
	for i := range total {
		f.clk.Set(epoch.Add(time.Duration(i) * step))
		d := f.allow(t, "pace", p)
		if d.Leased {
			leased++
		}
		if d.Allowed() && i >= 1500 {
			n++
		}
	}
	frac := float64(n) / float64(total-1500)
	t.Logf("paced at 25/s: %.4f of the limit admitted, %d leased", frac, leased)
	if leased == 0 {
		t.Fatal("no leases: the test does not exercise them")
	}
	if frac < 0.99 {
		t.Fatalf("admitted %.4f of the limit", frac)
	}
}
