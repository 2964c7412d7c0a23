package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// TestIntegrationStrictAcrossReplicas hammers one key from several
// limiters (replicas, each with its own connection pool) and checks, by
// the Redis clock, that no interval of any window admitted too many.
func TestIntegrationStrictAcrossReplicas(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	prefix := randomPrefix(t)
	p := Policy{Name: "strict", Windows: []Window{{Limit: 25, Period: 200 * time.Millisecond}, {Limit: 60, Period: time.Second}}}
	ctx := context.Background()
	var (
		mu       sync.Mutex
		times    []int64
		degraded int // admitted alone: a round trip over the 1 s timeout
		wg       sync.WaitGroup
	)
	stop := time.Now().Add(3 * time.Second)
	for r := range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		l, err := New(rdb, Options{Prefix: prefix, Timeout: time.Second, CacheSize: []int{0, 0, -1}[r]})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					d, err := l.Allow(ctx, "hot", p)
					if err != nil {
						t.Errorf("decision %+v %v", d, err)
						return
					}
					// Only shared decisions carry Redis's clock and are held
					// to the windows here; one made alone (a machine so
					// loaded that a round trip took over a second) is
					// bounded as the degraded mode states, elsewhere.
					if d.Allowed() {
						mu.Lock()
						if d.Degraded {
							degraded++
						} else {
							times = append(times, d.Time.UnixMicro())
						}
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(times)
	for _, w := range p.Windows {
		checkStrict(t, times, w)
	}
	// Three seconds at 60/s: nearly 180 admissions when the limiter is not
	// needlessly strict.
	if len(times)+degraded < 150 {
		t.Fatalf("only %d admitted in 3s under 60/s", len(times)+degraded)
	}
	t.Logf("%d admitted through Redis, %d alone", len(times), degraded)
}

// TestIntegrationLeasesStrictAcrossReplicas hammers one key from three
// limiters that lease (Replicas: 3) until both windows refuse, and checks
// by the Redis clock (the lease's server time plus local time elapsed for
// leased admissions) that no interval of any window admitted too many.
func TestIntegrationLeasesStrictAcrossReplicas(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	prefix := randomPrefix(t)
	p := Policy{Name: "lease", Windows: []Window{{Limit: 2000, Period: time.Second}, {Limit: 5000, Period: 5 * time.Second}}}
	ctx := context.Background()
	var (
		mu               sync.Mutex
		times            []int64
		leased, rejected int
		wg               sync.WaitGroup
	)
	// Drive the key until it is refused (its limits reached), for at least
	// 3 s: a loaded machine takes longer to get there.
	begin := time.Now()
	running := func() bool {
		mu.Lock()
		defer mu.Unlock()
		el := time.Since(begin)
		return el < 3*time.Second || (rejected == 0 && el < 20*time.Second)
	}
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		// 20 buckets: leases last up to 50ms, longer than a round trip
		// even on a loaded machine.
		l, err := New(rdb, Options{Prefix: prefix, Timeout: time.Second, Replicas: 3, Buckets: 20})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for running() {
					d, err := l.Allow(ctx, "hot", p)
					if err != nil || d.Degraded {
						t.Errorf("decision %+v %v", d, err)
						return
					}
					mu.Lock()
					if d.Allowed() {
						times = append(times, d.Time.UnixMicro())
					} else {
						rejected++
					}
					if d.Leased {
						leased++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(times)
	for _, w := range p.Windows {
		checkStrict(t, times, w)
	}
	t.Logf("%d admitted (%d leased), %d rejected", len(times), leased, rejected)
	if leased == 0 || rejected == 0 {
		t.Fatalf("%d leased, %d rejected: want leases, and the key driven over its limits", leased, rejected)
	}
	// Leases left unspent count as admissions: a few, not many. Whichever
	// window refused, it had admitted nearly its limit.
	if a, b := maxWithin(times, time.Second), maxWithin(times, 5*time.Second); a < 1800 && b < 4500 {
		t.Fatalf("at most %d admitted in a second (2000/s) and %d in 5 s (5000/5s): unspent leases wasted too much", a, b)
	}
}

// TestIntegrationTimeout checks that a Redis that never answers holds a
// decision no longer than Options.Timeout, whatever the client's own
// (here very long) timeouts.
func TestIntegrationTimeout(t *testing.T) {
	t.Parallel()
	testenv.RedisAddr(t)
	rdb := redis.NewClient(&redis.Options{Addr: silentServer(t), ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxRetries: -1})
	defer rdb.Close()
	const timeout = 50 * time.Millisecond
	// Generous slack for a loaded machine: without the bound a decision
	// would wait for the client's one-minute read timeout.
	const slack = 400 * time.Millisecond
	for _, mode := range []FailureMode{FailOpen, FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			l, err := New(rdb, Options{Timeout: timeout, FailureMode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for i := range 3 {
				start := time.Now()
				d, err := l.Allow(context.Background(), fmt.Sprint("k", i), perMinute(5))
				elapsed := time.Since(start)
				if elapsed > timeout+slack {
					t.Fatalf("decision took %s, bound is %s", elapsed, timeout)
				}
				switch mode {
				case FailOpen:
					if err != nil || !d.Degraded || !d.Allowed() {
						t.Fatalf("fail-open: %+v %v", d, err)
					}
				case FailClosed:
					if !errors.Is(err, ErrUnavailable) {
						t.Fatalf("fail-closed: %v", err)
					}
				}
			}
			th, err := NewThrottle(rdb, ThrottleLimit{Rate: 1, Burst: 1, Period: time.Second}, Options{Timeout: timeout, FailureMode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer th.Close()
			start := time.Now()
			_, err = th.Allow(context.Background(), "10.1.1.1")
			if elapsed := time.Since(start); elapsed > timeout+slack {
				t.Fatalf("throttle decision took %s", elapsed)
			}
			if mode == FailClosed && !errors.Is(err, ErrUnavailable) {
				t.Fatalf("throttle fail-closed: %v", err)
			}
		})
	}
}

// TestIntegrationStallAndRestart stalls a real redis-server (SIGSTOP),
// resumes it, then restarts it empty, and checks the limiter falls back
// within its timeout and returns to shared limiting by itself each time.
func TestIntegrationStallAndRestart(t *testing.T) {
	t.Parallel()
	testenv.RedisAddr(t)
	s := startRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	l, err := New(rdb, Options{Prefix: randomPrefix(t), Timeout: 50 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	p := perMinute(10)
	// shared waits for a shared decision and returns its remaining count,
	// which must be from base-locals-slack to base-locals, where locals
	// counts the requests admitted locally while it waited: they are added
	// to the shared window by that round trip. A decision that timed out
	// on the client may still have run on the server (slack).
	shared := func(base, slack int64) int64 {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		var locals int64
		for {
			d, err := l.Allow(ctx, "k", p)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Degraded {
				r := d.Windows[0].Remaining
				if r > base-locals || r < base-locals-slack {
					t.Fatalf("shared decision with %d remaining, want %d to %d (%d admitted locally meanwhile)", r, base-locals-slack, base-locals, locals)
				}
				return r
			}
			if d.Allowed() {
				locals++
			}
			if time.Now().After(deadline) {
				t.Fatal("no shared decision within 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	r := shared(9, 1)
	r = shared(r-1, 1)

	s.signal(t, syscall.SIGSTOP)
	start := time.Now()
	d, err := l.Allow(ctx, "k", p)
	if elapsed := time.Since(start); elapsed > 500*time.Millisecond {
		t.Fatalf("decision against a stalled redis took %s", elapsed)
	}
	if err != nil || !d.Degraded || d.Windows[0].Limit != 10 {
		t.Fatalf("during the stall: %+v %v", d, err)
	}
	s.signal(t, syscall.SIGCONT)
	// The stalled request was decided locally; Redis may still run it once
	// it resumes, as its command was already sent, and the admission made
	// locally is added with the next round trip: counted once, or twice
	// (never too few).
	var stalled int64
	if d.Allowed() {
		stalled = 1
	}
	shared(r-1-stalled, 1+stalled)

	s.stop()
	s.start(t) // empty: no keys, no scripts
	shared(9, 1)
}

// TestIntegrationCluster runs the limiter on a three-master Redis Cluster
// built from redis-server processes: every call must touch a single slot
// (a key's records share its hash tag, and a batch is split by slot), the
// Function must reach every master, and Unban must reach a subscriber on
// any node.
func TestIntegrationCluster(t *testing.T) {
	t.Parallel()
	testenv.RedisAddr(t)
	var servers []*redisServer
	var addrs []string
	for range 3 {
		s := startRedisServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		servers = append(servers, s)
		addrs = append(addrs, s.addr)
	}
	ctx := context.Background()
	ranges := [][2]int64{{0, 5460}, {5461, 10922}, {10923, 16383}}
	var nodes []*redis.Client
	for i, s := range servers {
		c := redis.NewClient(&redis.Options{Addr: s.addr})
		defer c.Close()
		nodes = append(nodes, c)
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", ranges[i][0], ranges[i][1]).Err(); err != nil {
			t.Fatalf("ADDSLOTSRANGE: %v", err)
		}
	}
	for _, s := range servers[1:] {
		if err := nodes[0].ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(s.port)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, c := range nodes {
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ready: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	l, err := New(cc, Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := Policy{Name: "c", Windows: []Window{{Limit: 2, Period: time.Minute}, {Limit: 100, Period: time.Hour}},
		Ban: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Hour}}
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("key-", i)
			for j := range 3 {
				d, err := l.Allow(ctx, key, p)
				if err != nil || d.Degraded || (j < 2) != d.Allowed() {
					t.Errorf("%s request %d: %+v %v", key, j, d, err)
				}
			}
		}()
	}
	wg.Wait()
	for i := range 300 {
		keys := stateKeys(l.opts.Prefix, fmt.Sprint("key-", i), compile(p, DefaultBuckets, DefaultStrikeBuckets))
		a, _ := nodes[0].ClusterKeySlot(ctx, keys[0]).Result()
		for _, k := range keys[1:] {
			if b, _ := nodes[0].ClusterKeySlot(ctx, k).Result(); a != b {
				t.Fatalf("%v hash to slots %d and %d", keys, a, b)
			}
		}
	}
	for i, c := range nodes {
		if n, _ := c.DBSize(ctx).Result(); n == 0 {
			t.Errorf("node %d holds no keys: keys did not spread over the cluster", i)
		}
		// Every master was given the decision Function, and ran it.
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err != nil || len(libs) != 1 {
			t.Errorf("node %d: libraries %v %v, want the decision library", i, libs, err)
		}
	}
	if l.batch.dec.noFunctions.Load() {
		t.Error("Functions turned off on a Redis 7 cluster")
	}
	// Give-backs across the masters, in one batch, two a key: a call a
	// slot, each routed to its slot, the script loaded on every master
	// that lacks it, each run once.
	gp := compile(Policy{Name: "g", Windows: []Window{{Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	applied := l.back.applied.Load()
	for i := range 30 {
		key := fmt.Sprint("g-", i)
		reply, err := evalDecision(ctx, cc, stateKeys(l.opts.Prefix, key, gp), gp, input{lease: leaseAsk{want: 10, need: 10, life: 1_000_000}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := decode(gp, reply)
		if err != nil || v.granted != 10 {
			t.Fatalf("%s: lease of 10: %+v %v", key, v, err)
		}
		l.back.add(giveBack{key: key, windows: gp.windows, at: v.now, n: 3})
		l.back.add(giveBack{key: key, windows: gp.windows, at: v.now, n: 1})
	}
	// (The limiter's own sender may take some of them: wait for all.)
	l.back.flush(2 * time.Second)
	for end := time.Now().Add(5 * time.Second); l.back.applied.Load() < applied+60 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 30 {
		rec, err := cc.Get(ctx, stateKeys(l.opts.Prefix, fmt.Sprint("g-", i), gp)[1]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, total, hc, _ := readRing(t, rec, windowRingAt); total != 6 || hc != 6 {
			t.Fatalf("g-%d after giving back 4 of 10: total %d, head count %d, want 6", i, total, hc)
		}
	}
	// A Reset on a cluster: the records go and the key is marked, in one
	// script on its slot.
	if err := l.Reset(ctx, "g-0", Policy{Name: "g", Windows: []Window{{Limit: 1000, Period: time.Minute}}}); err != nil {
		t.Fatal(err)
	}
	if n, err := cc.Exists(ctx, stateKeys(l.opts.Prefix, "g-0", gp)[1]).Result(); err != nil || n != 0 {
		t.Fatalf("g-0's record after a Reset: %d, %v", n, err)
	}
	if mark, err := cc.Get(ctx, resetMarkKey(l.opts.Prefix, "g-0")).Int64(); err != nil || mark <= 0 {
		t.Fatalf("g-0's reset mark: %d, %v", mark, err)
	}
	// A ban, lifted through another limiter on the same cluster.
	if d, _ := l.Allow(ctx, "key-0", p); d.Outcome != Banned {
		t.Fatalf("want key-0 banned after two rejections over threshold 1: %+v", d)
	}
	other, err := New(cc, Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	time.Sleep(200 * time.Millisecond) // let the subscription settle
	if err := other.Unban(ctx, "key-0"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Second)
	for {
		d, err := l.Allow(ctx, "key-0", p)
		if err == nil && d.Outcome == Limited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Unban: %+v %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// maxWithin returns the most admission times (µs, ascending) that any
// interval of length d holds.
func maxWithin(times []int64, d time.Duration) int {
	best, lo := 0, 0
	for hi := range times {
		for times[hi]-times[lo] >= d.Microseconds() {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}
