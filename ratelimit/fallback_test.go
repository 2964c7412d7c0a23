package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// countPending locks every shard of f and returns its pending-keys count
// and the number of kept entries with pending admissions, read together.
func countPending(f *fallback) (counted int64, entries int64) {
	for i := range f.shards {
		f.shards[i].mu.Lock()
	}
	defer func() {
		for i := range f.shards {
			f.shards[i].mu.Unlock()
		}
	}()
	for i := range f.shards {
		for _, e := range f.shards[i].keys {
			if e.pending > 0 {
				entries++
			}
		}
	}
	return f.pendingKeys.Load(), entries
}

// TestFallbackPendingCountNeverLow: takePending skips its lookup while the
// count of keys with pending admissions reads zero, so that count must
// never read lower than the entries it stands for, or local admissions
// would not reach the shared windows and the degraded-mode bound would
// break. Goroutines decide, take, give back, forget and sweep keys at
// random, over a table small enough that some keys are not kept, while a
// checker locks every shard and compares the count with the entries. Keys
// of their own are decided by producers and handed to a consumer, whose
// takePending must then return every admission made since its last take.
func TestFallbackPendingCountNeverLow(t *testing.T) {
	t.Parallel()
	f := newFallback(2*memShards, func() int64 { return 1 })
	pl := compile(Policy{Name: "p", Windows: []Window{{Limit: 1_000_000_000, Period: time.Minute}, {Limit: 1_000_000_000, Period: time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	// The owned keys' plan keeps them past every sweep below.
	long := compile(Policy{Name: "long", Windows: []Window{{Limit: 1_000_000_000, Period: time.Minute}, {Limit: 1_000_000_000, Period: MaxPeriod}}}, DefaultBuckets, DefaultStrikeBuckets)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
	now := func() int64 { return clock.Add(1) }

	const producers, owned, rounds = 3, 8, 400
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var checks atomic.Int64

	// The checker: the count and the entries, under every shard lock.
	var checker sync.WaitGroup
	checker.Add(1)
	go func() {
		defer checker.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if c, e := countPending(f); c != e {
				t.Errorf("pending-keys count %d with %d entries pending", c, e)
				return
			}
			checks.Add(1)
		}
	}()

	// Random traffic on shared keys: every operation that moves pending.
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var taken []int64
			for range 20 * rounds {
				key := fmt.Sprintf("shared-%d", r.IntN(200))
				switch op := r.IntN(10); {
				case op < 5:
					f.decide(key, pl, now(), input{lease: noLease})
				case op < 7:
					if _, p := f.takePending(key, pl, now()); p > 0 {
						taken = append(taken, p)
					}
				case op < 8 && len(taken) > 0:
					f.restorePending(key, taken[len(taken)-1])
					taken = taken[:len(taken)-1]
				case op < 9:
					f.forget(key)
				default:
					f.sweep(now() + r.Int64N(2*time.Hour.Microseconds()))
				}
			}
		}()
	}

	// Producers and a consumer: a take that follows a decision sees it.
	type handed struct {
		key  string
		made int64         // admissions kept since the key's last take
		done chan struct{} // closed once taken: the key is its producer's again
	}
	queue := make(chan handed, producers)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(p), 11))
			for range rounds {
				key := fmt.Sprintf("owned-%d-%d", p, r.IntN(owned))
				n := 1 + r.Int64N(3)
				for range n {
					if v := f.decide(key, long, now(), input{lease: noLease}); v.outcome != Allowed {
						t.Errorf("%s: outcome %v under a limit of a billion", key, v.outcome)
						return
					}
				}
				sh := f.shard(key)
				sh.mu.Lock()
				e := sh.keys[key]
				made := int64(0)
				if e != nil {
					made = e.pending
				}
				sh.mu.Unlock()
				done := make(chan struct{})
				queue <- handed{key: key, made: made, done: done}
				<-done
			}
		}()
	}
	var consumer sync.WaitGroup
	consumer.Add(1)
	takes := 0
	go func() {
		defer consumer.Done()
		for h := range queue {
			if _, p := f.takePending(h.key, long, now()); p != h.made {
				t.Errorf("%s: take returned %d admissions, %d were pending", h.key, p, h.made)
			}
			takes++
			close(h.done)
		}
	}()
	wg.Wait()
	close(queue)
	consumer.Wait()
	close(stop)
	checker.Wait()
	if c, e := countPending(f); c != e {
		t.Fatalf("after the run: pending-keys count %d with %d entries pending", c, e)
	}
	// Taking every key leaves nothing pending, and the count at zero.
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		var keys []string
		for k := range sh.keys {
			keys = append(keys, k)
		}
		sh.mu.Unlock()
		for _, k := range keys {
			f.takePending(k, pl, now())
		}
	}
	if c, e := countPending(f); c != 0 || e != 0 {
		t.Fatalf("after taking every key: count %d, %d entries pending", c, e)
	}
	t.Logf("%d takes of handed keys, %d checks under every lock", takes, checks.Load())
}

// TestFallbackKeepsItsBound checks the fail-open bound (README, "Failure
// modes") over generated plans, replica counts and traffic: a replica
// decides a key through Redis for a while, then Redis refuses every
// command, and each window of period W and limit L must find, among the
// replica's degraded admissions, at most max(1, ⌊L/N⌋) within any W, and
// at most ⌊R/N⌋ from the last shared answer (which left R) until W has
// passed since that answer's round trip began. Meanwhile each degraded
// admission reports that window's Remaining as R less the degraded
// admissions since (countDown), and none above L. Half the cases run with
// leases and blocks: an answer that granted a lease, or spent a
// block, left R as Redis counted it, the block whole (its unspent
// part is added to the Remaining the caller sees). A quarter of them
// run with blocks in force (finalized, as a fresh install of the chart
// runs) at a pace that earns blocks: a block is counted whole in every
// window, the short ones through their coarse records, and an answer that
// granted one left R as both records counted it.
func TestFallbackKeepsItsBound(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 8)
	local, blockLast := 0, 0
	for c := range testenv.Cases(t, 10, max(*invariantCases, 40)) {
		p := genPolicies(rng, 24*time.Hour)[0]
		n := int64(1 + rng.IntN(5))
		// Enough before the outage to spend part of small limits.
		before, during := rng.IntN(300), 100+rng.IntN(200)
		maxLease, cold, blocks := 1, false, false
		if c%2 == 1 {
			// The default: leases and blocks, with a long window to
			// count blocks in and, half the time, a pace that earns them.
			maxLease, cold = 0, rng.IntN(2) == 0
			if blocks = c%4 == 3; blocks {
				// A short window whose limit the traffic comes near, and
				// room for blocks of a few requests beside it (the
				// margin asks four times a block a replica).
				cold, before = true, 100+rng.IntN(300)
				p.Windows = slices.DeleteFunc(p.Windows, func(w Window) bool { return w.Period < 200*blockLife })
				p.Windows = append(p.Windows, Window{Limit: 8*n + rng.Int64N(600), Period: blockLife/2 + time.Duration(rng.Int64N(int64(190*blockLife))).Truncate(time.Millisecond)})
			}
			if cold || !slices.ContainsFunc(p.Windows, func(w Window) bool { return w.Period >= 200*blockLife }) {
				// A long window whose limit the traffic can come near, so
				// that its share ⌊R/N⌋ binds.
				p.Windows = slices.DeleteFunc(p.Windows, func(w Window) bool { return w.Period >= 200*blockLife })
				p.Windows = append(p.Windows, Window{Limit: 16 + rng.Int64N(400), Period: 200*blockLife + time.Duration(rng.Int64N(int64(MaxPeriod-200*blockLife)))})
			}
			if blocks && rng.IntN(3) == 0 {
				// A plan of short windows alone takes blocks too.
				p.Windows = p.Windows[:len(p.Windows)-1]
			}
		}
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			f := newFixtureWith(t, Options{Replicas: int(n), MaxLease: maxLease}, hooks{blocks: blocks})
			step := func() {
				w := p.Windows[rng.IntN(len(p.Windows))].Period
				switch rng.IntN(8) {
				case 0:
					f.clk.Add(time.Duration(rng.Int64N(int64(w) + 1)).Truncate(time.Microsecond))
				case 1, 2:
				default:
					f.clk.Add(time.Duration(rng.Int64N(int64(w)/50 + 1)).Truncate(time.Microsecond))
				}
			}
			var last Decision // the last answer from Redis, at lastAt
			var lastAt time.Time
			var held []int64 // per window, the block of last this replica holds
			for range before {
				if cold {
					f.clk.Add(time.Duration(rng.Int64N(int64(400 * time.Millisecond))).Truncate(time.Microsecond))
				} else {
					step()
				}
				at := f.clk.Now()
				d, err := f.l.Allow(context.Background(), "k", p)
				if err != nil || d.Degraded {
					t.Fatalf("%+v %v", d, err)
				}
				if d.Cached || d.Leased {
					continue
				}
				last, lastAt = d, at
				held = make([]int64, len(d.Windows))
				if f.l.lease == nil {
					continue
				}
				// After a round trip a lease left is the one it granted.
				for i := range held {
					held[i] = leaseLeft(f.l, "k")
				}
			}
			if blocks && blockLeft(f.l, "k") > 0 {
				blockLast++
			}
			// What each window's last shared answer left, R, as Redis
			// counted it, and of that this replica's share: ⌊R/N⌋ until a
			// period has passed since it.
			shared, share := map[time.Duration]int64{}, map[time.Duration]int64{}
			for i, lw := range last.Windows {
				shared[lw.Period] = lw.Remaining - held[i]
				share[lw.Period] = (lw.Remaining - held[i]) / n
			}
			f.mini.SetError("ERR injected: Redis refuses every command")
			if rng.IntN(2) == 0 {
				// The outage's first request a while after the last answer.
				w := p.Windows[rng.IntN(len(p.Windows))].Period
				f.clk.Add(time.Duration(rng.Int64N(int64(w) + 1)).Truncate(time.Microsecond))
			}
			var times []time.Time
			for range during {
				step()
				d, err := f.l.Allow(context.Background(), "k", p)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Degraded || !d.Allowed() {
					continue
				}
				x := f.clk.Now()
				times = append(times, x)
				local++
				// Each admission's Remaining counts down from the last shared
				// answer while its window holds that answer: R less the
				// degraded admissions since.
				for _, dw := range d.Windows {
					if dw.Remaining > dw.Limit {
						t.Fatalf("%v, %d replicas: degraded Remaining %d above the %s window's limit %d", p, n, dw.Remaining, dw.Period, dw.Limit)
					}
					if r, ok := shared[dw.Period]; ok && x.Sub(lastAt) < dw.Period && dw.Remaining != r-int64(len(times)) {
						t.Fatalf("%v, %d replicas: degraded Remaining %d in the %s window after %d degraded admissions since the last shared answer at %v, which left %d: want %d",
							p, n, dw.Remaining, dw.Period, len(times), lastAt, r, r-int64(len(times)))
					}
				}
				for _, w := range p.Windows {
					within := 0
					for _, y := range times {
						if y.After(x.Add(-w.Period)) {
							within++
						}
					}
					if max(1, w.Limit/n) < int64(within) {
						t.Fatalf("%v, %d replicas: %d degraded admissions within %s ending at %v, past max(1, ⌊%d/%d⌋)", p, n, within, w.Period, x, w.Limit, n)
					}
					// Every degraded admission came after the last answer.
					if s, ok := share[w.Period]; ok && x.Sub(lastAt) < w.Period && int64(len(times)) > s {
						t.Fatalf("%v, %d replicas: %d degraded admissions since the last shared answer at %v, which left ⌊R/%d⌋ = %d in the %s window",
							p, n, len(times), lastAt, n, s, w.Period)
					}
				}
			}
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("%d degraded admissions checked; in %d cases a block was held when Redis failed", local, blockLast)
	if local == 0 {
		t.Fatal("no degraded admission: the bound went unexercised")
	}
	if blockLast == 0 {
		t.Fatal("no case held a block when Redis failed: the bound went unexercised with blocks")
	}
}

// TestFallbackForgetsAnOutage: the rings a replica keeps for local
// decisions while Redis is unreachable go with each key's next shared
// verdict, so an outage leaves no memory behind for the day its longest
// window lasts; a key admitted locally between taking its pending
// admissions and that verdict keeps its rings, and the admission still
// reaches the next round trip.
func TestFallbackForgetsAnOutage(t *testing.T) {
	t.Parallel()
	f := newFallback(1<<16, func() int64 { return 2 })
	pl := compile(Policy{Name: "free", Windows: []Window{{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	shared := func(key string, at int64) {
		v := verdict{outcome: Allowed, now: at, win: []winVerdict{{remaining: 50}, {remaining: 900}}}
		f.remember(key, pl, at, &v)
	}
	withRings := func() (n int) {
		for i := range f.shards {
			for _, e := range f.shards[i].keys {
				if e.state != nil {
					n++
				}
			}
		}
		return n
	}
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		shared(keys[i], now)
	}
	// The outage: every key decided locally, some more than once.
	admitted := map[string]int64{}
	for _, k := range keys {
		for range 1 + rng.IntN(3) {
			now += 1000
			if f.decide(k, pl, now, input{}).outcome == Allowed {
				admitted[k]++
			}
		}
	}
	if got := withRings(); got != len(keys) {
		t.Fatalf("%d of %d keys hold local rings during the outage", got, len(keys))
	}
	// Redis answers again: each key's next round trip takes its pending
	// admissions; for some, a local admission lands before the verdict.
	late := map[string]bool{}
	for _, k := range keys {
		now += 1000
		add, n := f.takePending(k, pl, now)
		if n != admitted[k] || (n > 0 && add[0] != n) {
			t.Fatalf("%s: took %v covering %d, want %d admissions", k, add, n, admitted[k])
		}
		if rng.IntN(4) == 0 && f.decide(k, pl, now, input{}).outcome == Allowed {
			late[k] = true
		}
		shared(k, now)
	}
	if got := withRings(); got != len(late) {
		t.Fatalf("%d keys hold local rings after Redis answered, want %d (those admitted locally since their take)", got, len(late))
	}
	for k := range late {
		now += 1000
		if _, n := f.takePending(k, pl, now); n != 1 {
			t.Fatalf("%s: its late local admission took %d, want 1", k, n)
		}
		shared(k, now)
	}
	if got := withRings(); got != 0 {
		t.Fatalf("%d keys still hold local rings once every admission reached Redis", got)
	}
}
