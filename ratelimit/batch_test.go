package ratelimit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestBatchDecidesManyKeysInOneCall: a flush of the batcher is one script
// call per scriptBatch decisions, and each decision gets its own verdict,
// the same as if it had been sent alone: the batch is checked against
// the reference deciding the same requests in the same order at the
// batch's time, over generated plans and keys (some repeated, so that
// later decisions see earlier ones' writes) under several plans in one
// call, on miniredis and a real Redis.
func TestBatchDecidesManyKeysInOneCall(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"miniredis", "redis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			var rdb *redis.Client
			set := func(time.Time) {}
			if backend == "redis" {
				rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
				t.Cleanup(func() { _ = rdb.Close() })
			} else {
				m, c := newMini(t, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
				rdb, set = c, m.SetTime
			}
			if err := rdb.ScriptLoad(context.Background(), decideLua).Err(); err != nil {
				t.Fatal(err)
			}
			if backend == "redis" {
				if err := (&redisDecider{rdb: rdb, sc: decisionScript()}).loadFunction(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			cmds := &commandCounter{}
			rdb.AddHook(cmds)
			prefix := randomPrefix(t)
			rng := rand.New(rand.NewPCG(7, 8))
			var policies []Policy
			for range 4 {
				policies = append(policies, genPolicies(rng, time.Hour)...)
			}
			var plans []*plan
			for i, p := range policies {
				p.Name = fmt.Sprint("p", i)
				if i%3 == 0 {
					p.Candidate = []Window{{Limit: 1 + rng.Int64N(40), Period: time.Duration(1+rng.Int64N(60)) * time.Second}}
				}
				plans = append(plans, compile(p, DefaultBuckets, DefaultStrikeBuckets))
			}
			ref := map[string]*keyState{}
			now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			for round := range 30 {
				now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
				set(now)
				type asked struct {
					key string
					pl  *plan
					in  input
				}
				var as []asked
				var ds []decision
				for range 1 + rng.IntN(150) {
					// Each key keeps its plan: the reference would start a
					// key's new periods from its others (seeding, which
					// the script does only when the registry asks).
					k := rng.IntN(20)
					key, pl := fmt.Sprint("k", k), plans[k%len(plans)]
					in := input{lease: noLease, extra: int64(rng.IntN(2))}
					if rng.IntN(4) == 0 {
						w := 2 + rng.Int64N(30)
						in.lease = leaseAsk{want: w, need: w, life: 1 + rng.Int64N(500_000)}
					}
					if rng.IntN(10) == 0 {
						in.peek = true
					}
					as = append(as, asked{key, pl, in})
					ds = append(ds, decision{keys: stateKeys(prefix, key, pl), pl: pl, nums: scriptNums(pl, in)})
				}
				before := cmds.scripts.Load()
				b := &batcher{dec: &redisDecider{rdb: rdb, sc: decisionScript(), log: discardLogger}, timeout: 5 * time.Second, observe: func(time.Duration, error) {}, waited: func(time.Duration) {}}
				b.dec.noFunctions.Store(backend == "miniredis")
				calls := make([]*call, len(ds))
				for i := range ds {
					calls[i] = &call{decision: ds[i], done: make(chan struct{}, 1)}
				}
				b.exec(context.Background(), calls)
				if got, want := cmds.scripts.Load()-before, int64((len(ds)+scriptBatch-1)/scriptBatch); got != want {
					t.Fatalf("round %d: %d script calls for %d decisions, want %d", round, got, len(ds), want)
				}
				var at int64
				for i, c := range calls {
					<-c.done
					if c.err != nil {
						t.Fatalf("round %d decision %d: %v", round, i, c.err)
					}
					got, err := decode(as[i].pl, c.reply)
					if err != nil {
						t.Fatal(err)
					}
					if i%scriptBatch == 0 {
						at = got.now
					}
					if got.now != at {
						t.Fatalf("round %d: decision %d at %d, its script call's first at %d", round, i, got.now, at)
					}
					st := ref[as[i].key]
					if st == nil {
						st = &keyState{}
						ref[as[i].key] = st
					}
					want := st.decide(as[i].pl, got.now, as[i].in)
					if !equalVerdicts(got, want) {
						t.Fatalf("round %d decision %d (key %s, plan %s, %+v):\nscript    %+v\nreference %+v", round, i, as[i].key, as[i].pl.name, as[i].in, got, want)
					}
				}
			}
		})
	}
}

// equalVerdicts compares verdicts, treating nil and empty candidate
// windows alike.
func equalVerdicts(a, b verdict) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// TestBatchIsolatesAFailingDecision: a decision that fails in the script
// (here its window record is cut short, as no release writes it) gets its
// error, and the decisions before and after it in the same call are made.
func TestBatchIsolatesAFailingDecision(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"miniredis", "redis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			var rdb *redis.Client
			if backend == "redis" {
				rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
				t.Cleanup(func() { _ = rdb.Close() })
			} else {
				_, rdb = newMini(t, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
			}
			ctx := context.Background()
			prefix := randomPrefix(t)
			pl := compile(Policy{Name: "b", Windows: []Window{{Limit: 5, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
			// A header whose head is long past, with counts, and no slots
			// to drop them from.
			bad := stateKeys(prefix, "bad", pl)[1]
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			hdr := string([]byte{formatVersion}) + packNums([]int64{now.UnixMicro()/pl.windows[0].gran - 1})
			hdr += string([]byte{0, 0, 0, 5, 0, 0, 0, 1, 0, 0})
			if err := rdb.Set(ctx, bad, hdr, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			var ds []decision
			keys := []string{"a", "bad", "c"}
			for _, key := range keys {
				ds = append(ds, decision{keys: stateKeys(prefix, key, pl), pl: pl, nums: scriptNums(pl, input{lease: noLease})})
			}
			replies, err := evalBatch(ctx, rdb, ds)
			if err != nil {
				t.Fatal(err)
			}
			for i, key := range keys {
				v, err := decode(pl, replies[i])
				switch {
				case key == "bad" && err == nil:
					t.Errorf("%s: %+v; want an error", key, v)
				case key != "bad" && (err != nil || v.outcome != Allowed || v.win[0].used != 1):
					t.Errorf("%s: %+v, %v; want it admitted", key, v, err)
				}
			}
		})
	}
}

// TestKeySlotMatchesRedis: the batcher groups decisions by the slot Redis
// Cluster gives their records; CLUSTER KEYSLOT of a cluster-enabled
// redis-server is the judge, on keys with and without hash tags, empty
// tags, unclosed and nested braces, and binary bytes.
func TestKeySlotMatchesRedis(t *testing.T) {
	t.Parallel()
	testenv.RedisAddr(t)
	s := startRedisServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	keys := []string{"", "a", "petstore:rl:{key_1}:w:60000000:300000", "{}", "{}x", "x{}y{z}", "{{a}}", "a{b", "a}b{c}", "{a}{b}", "\x00\xff{\x80}"}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab{}:\x00\xfe"
	for range 300 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := rdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Fatalf("keySlot(%q) = %d, CLUSTER KEYSLOT %d", k, got, want)
		}
	}
}

// TestFunctionsLoadedAndFallback: on a Redis with Functions the limiter
// decides with its library (FCALL), loading it on a new server and again
// after FUNCTION FLUSH, without a degraded decision or a breaker failure;
// where Functions are refused (an ACL without FCALL and FUNCTION, or
// miniredis, which has none) it decides with the script (EVALSHA) and
// says so once.
func TestFunctionsLoadedAndFallback(t *testing.T) {
	t.Parallel()
	testenv.RedisAddr(t)
	s := startRedisServer(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: s.addr})
	t.Cleanup(func() { _ = admin.Close() })
	calls := func(name string) int64 {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+name+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	p := perMinute(100)
	decide := func(l *Limiter, key string, remaining int64) {
		t.Helper()
		d, err := l.Allow(ctx, key, p)
		if err != nil || d.Degraded || !d.Allowed() || d.Windows[0].Remaining != remaining {
			t.Fatalf("%s: %+v %v; want a shared admission with %d remaining", key, d, err, remaining)
		}
	}

	logs := &testenv.Buffer{}
	l, err := newLimiter(admin, Options{Prefix: randomPrefix(t), Timeout: time.Second, MaxLease: 1, Logger: slog.New(slog.NewTextHandler(logs, nil))}, hooks{noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	decide(l, "a", 99)
	if n := calls("fcall"); n == 0 {
		t.Fatal("no FCALL on a Redis with Functions")
	}
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decide(l, "a", 98)
	libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || len(libs[0].Functions) != 1 || libs[0].Functions[0].Name != decisionScript().fn {
		t.Fatalf("after FUNCTION FLUSH and a decision: libraries %+v %v; want the decision library again", libs, err)
	}
	if l.breaker.isOpen() || l.breaker.failing.Load() || strings.Contains(logs.String(), "no Functions") {
		t.Fatalf("a missing Function must neither count as a failure nor turn Functions off:\n%s", logs)
	}

	// A user that may not run or load Functions: scripts, said once.
	if err := admin.Do(ctx, "ACL", "SETUSER", "scripts-only", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	limited := redis.NewClient(&redis.Options{Addr: s.addr, Username: "scripts-only", Password: "pw"})
	t.Cleanup(func() { _ = limited.Close() })
	logs2 := &testenv.Buffer{}
	l2, err := newLimiter(limited, Options{Prefix: randomPrefix(t), Timeout: time.Second, MaxLease: 1, Logger: slog.New(slog.NewTextHandler(logs2, nil))}, hooks{noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	before := calls("evalsha") + calls("eval")
	decide(l2, "b", 99)
	decide(l2, "b", 98)
	if !l2.batch.dec.noFunctions.Load() || calls("evalsha")+calls("eval") < before+2 || strings.Count(logs2.String(), "no Functions") != 1 {
		t.Fatalf("without Functions: noFunctions %v, scripts %d, logs:\n%s", l2.batch.dec.noFunctions.Load(), calls("evalsha")+calls("eval")-before, logs2)
	}

	// miniredis has no Functions at all.
	f := newFixture(t, Options{MaxLease: 1})
	for i := range 2 {
		if d := f.allow(t, "c", p); d.Degraded || d.Windows[0].Remaining != int64(99-i) {
			t.Fatalf("on miniredis: %+v", d)
		}
	}
	if !f.l.batch.dec.noFunctions.Load() {
		t.Fatal("miniredis: Functions still on")
	}
}

// behindAStuckCall makes, under opts, one decision whose call never
// returns (Redis is silent) and, after settle, queued decisions behind
// it, each answered degraded. It returns the limiter's metrics once
// every decision has been sent (its queue wait observed) and the limiter
// has been closed, so that every call has ended and been observed too.
func behindAStuckCall(t *testing.T, opts Options, settle time.Duration, queued int) *prometheus.Registry {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: silentServer(t), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	l, err := newLimiter(rdb, opts, hooks{noHeartbeat: true, sendOnce: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	allow := func(key string) {
		defer wg.Done()
		if d, err := l.Allow(context.Background(), key, perMinute(5)); err != nil || !d.Degraded {
			t.Errorf("%s: %+v %v", key, d, err)
		}
	}
	wg.Add(1)
	go allow("first")
	time.Sleep(settle) // the first call is in flight
	for i := range queued {
		wg.Add(1)
		go allow(fmt.Sprint("queued", i))
	}
	wg.Wait()
	// Callers have had their degraded answers before the decisions behind
	// the stuck call are sent.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := testenv.Histogram(t, reg, "petstore_ratelimit_queue_wait_seconds").GetSampleCount()
		if n == uint64(queued+1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("observed %d waits, want %d", n, queued+1)
		}
	}
	return reg
}

// TestQueueWaitMeasured checks that petstore_ratelimit_queue_wait_seconds
// observes every decision with the time it waited for a pipeline: with
// one pipeline, stuck on a Redis that never answers, the decisions made
// meanwhile wait until its call times out.
func TestQueueWaitMeasured(t *testing.T) {
	t.Parallel()
	reg := behindAStuckCall(t, Options{Timeout: 300 * time.Millisecond, Pipelines: 1}, 50*time.Millisecond, 3)
	h := testenv.Histogram(t, reg, "petstore_ratelimit_queue_wait_seconds")
	var short uint64
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() >= 0.1 {
			short = b.GetCumulativeCount()
			break
		}
	}
	// The first waited for nothing, the others for the rest of its call
	// (about 250 ms): generous bounds for a loaded machine.
	if short != 1 {
		t.Errorf("%d waits under 0.1 s (bucket), want 1: %v", short, h)
	}
	if h.GetSampleSum() < 3*0.15 {
		t.Errorf("waits sum to %.3f s, want the three queued ones at least 0.15 s each", h.GetSampleSum())
	}
}

// TestPipelineHoldGathersBehindACallInFlight: while a call is in flight,
// the decisions that queue behind it wait (at most PipelineHold) and then
// go together in one call, where every free pipeline would otherwise
// send its own. Here the first call never returns (a silent Redis):
// three decisions queued behind it are sent together once the oldest has
// waited the hold, not at once and not after the stuck call.
func TestPipelineHoldGathersBehindACallInFlight(t *testing.T) {
	t.Parallel()
	const hold = 150 * time.Millisecond
	reg := behindAStuckCall(t, Options{Timeout: 600 * time.Millisecond, Pipelines: 4, PipelineHold: hold}, 30*time.Millisecond, 3)
	// Two calls: the stuck one, and one for the three queued behind it.
	if n := testenv.Histogram(t, reg, "petstore_ratelimit_redis_duration_seconds").GetSampleCount(); n != 2 {
		t.Errorf("%d calls, want 2: the three queued decisions should have gone together", n)
	}
	// The three waited about the hold (the oldest the whole hold, the
	// others a little less), never the stuck call's whole timeout:
	// generous bounds for a loaded machine.
	if sum := testenv.Histogram(t, reg, "petstore_ratelimit_queue_wait_seconds").GetSampleSum(); sum < 3*0.08 || sum > 3*0.45 {
		t.Errorf("waits sum to %.3f s, want the three queued ones near the %v hold each", sum, hold)
	}
}

// TestPipelineHoldReleasedWhenCallsEnd: a hold far longer than the
// decision timeout costs nothing when Redis answers, because a held batch
// goes as soon as the calls in flight are answered. Concurrent callers on
// a real Redis all get shared answers, well inside the timeout.
func TestPipelineHoldReleasedWhenCallsEnd(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	defer rdb.Close()
	l, err := newLimiter(rdb, Options{Prefix: randomPrefix(t), Timeout: 5 * time.Second, Pipelines: 4, PipelineHold: time.Hour}, hooks{noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				d, err := l.Allow(context.Background(), fmt.Sprintf("k%d-%d", g, i), perMinute(5))
				if err != nil || d.Degraded || !d.Allowed() {
					t.Errorf("caller %d, decision %d: %+v %v", g, i, d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := time.Since(start); e > 4*time.Second {
		t.Errorf("640 decisions took %v", e)
	}
}

// TestPipelineHoldEndsWhenACallIsQueued: a held batch does not wait for
// the calls in flight once a whole script call's worth of decisions is
// queued, so a busy Redis always has the next call waiting. Here the
// call in flight never returns and the hold is an hour: a call's worth
// of decisions queued behind it still goes at once, together.
func TestPipelineHoldEndsWhenACallIsQueued(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	reg := behindAStuckCall(t, Options{Timeout: timeout, Pipelines: 4, PipelineHold: time.Hour}, 30*time.Millisecond, scriptBatch)
	// Released by the hold, they would wait an hour; by the call in
	// flight, its whole timeout. Generous bound for a loaded machine.
	if mean := testenv.Histogram(t, reg, "petstore_ratelimit_queue_wait_seconds").GetSampleSum() / scriptBatch; mean > timeout.Seconds()/4 {
		t.Errorf("queued decisions waited %.3f s on average, want well under the %v a stuck call takes", mean, timeout)
	}
}

// TestBatchAnswersEveryDecisionOfAMalformedReply: a script call whose
// reply is not one string a decision (too few strings, too many, or not
// an array at all: a server running other code under the decision code's
// name) fails every decision it carried with an error, none with another
// decision's reply, and the batcher goes on.
func TestBatchAnswersEveryDecisionOfAMalformedReply(t *testing.T) {
	t.Parallel()
	pl := compile(perMinute(10), DefaultBuckets, DefaultStrikeBuckets)
	for _, c := range []struct{ name, src, want string }{
		{"one string fewer", "return {'x'}", "1 script replies for 2 decisions"},
		{"one string more", "return {'x', 'y', 'z'}", "3 script replies for 2 decisions"},
		{"not an array", "return 7", "parse"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, rdb := newMini(t, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
			sum := sha1.Sum([]byte(c.src))
			b := &batcher{dec: &redisDecider{rdb: rdb, sc: script{src: c.src, sha: hex.EncodeToString(sum[:])}, log: discardLogger}, timeout: 5 * time.Second,
				observe: func(time.Duration, error) {}, waited: func(time.Duration) {}}
			b.dec.noFunctions.Store(true)
			calls := make([]*call, 2)
			for i := range calls {
				calls[i] = &call{decision: decision{keys: stateKeys("p:", fmt.Sprint("k", i), pl), pl: pl}, done: make(chan struct{}, 1)}
			}
			b.exec(context.Background(), calls)
			for i, cl := range calls {
				<-cl.done
				if cl.err == nil || !strings.Contains(cl.err.Error(), c.want) {
					t.Fatalf("decision %d: reply %q, error %v; want an error saying %q", i, cl.reply, cl.err, c.want)
				}
			}
		})
	}
}

// TestLongCallKeepsItsRecords: decisions of one call for the same key
// see each other's writes, even when the call outlasts the key's
// records. A call decides a key of a 1 ms window (its record's TTL is a
// few ms); the next, in the same pipeline, thousands of other keys'
// decisions first (tens of ms on Redis's clock), then that key again
// and again: its first moves the record's head and sets its expiry.
// Each must count one more than the one before: the call's time is its
// start, and a record whose expiry Redis's clock had passed would be
// gone for the rest of the call (as it was while expiries were set as
// times, from the call's start: PEXPIREAT).
func TestLongCallKeepsItsRecords(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	sc := decisionScript()
	if err := (&redisDecider{rdb: rdb, sc: sc}).loadFunction(ctx); err != nil {
		t.Fatal(err)
	}
	prefix := randomPrefix(t)
	tiny := compile(Policy{Name: "tiny", Windows: []Window{{Limit: 1000, Period: time.Millisecond}}}, DefaultBuckets, DefaultStrikeBuckets)
	other := compile(perMinute(1000), DefaultBuckets, DefaultStrikeBuckets)
	for _, fin := range []any{notFinalized, compactRecords} {
		key := fmt.Sprint("tiny", fin)
		first := []decision{{keys: stateKeys(prefix, key, tiny), pl: tiny, nums: scriptNums(tiny, input{lease: noLease})}}
		var long []decision
		for i := range 3000 {
			long = append(long, decision{keys: stateKeys(prefix, fmt.Sprint("o", i), other), pl: other, nums: scriptNums(other, input{lease: noLease})})
		}
		const mine = 40
		for range mine {
			long = append(long, first[0])
		}
		pipe := rdb.Pipeline()
		var cmds []*redis.Cmd
		for _, ds := range [][]decision{first, long} {
			keys, args := batchCommandArg(ds, fin)
			cmds = append(cmds, pipe.FCall(ctx, sc.fn, keys, args...))
		}
		began := time.Now()
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		replies, err := batchReplies(cmds[1].Val(), len(long))
		if err != nil {
			t.Fatal(err)
		}
		var used0 int64
		for j := range mine {
			v, err := decode(tiny, replies[len(long)-mine+j])
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 {
				used0 = v.win[0].used
			}
			if want := used0 + int64(j); v.win[0].used != want {
				t.Fatalf("ARGV[2] %q: decision %d of %d for one key, after %d others, in calls of %s: used %d, want %d", fin, j+1, mine, len(long)-mine, took, v.win[0].used, want)
			}
		}
		t.Logf("ARGV[2] %q: the key's first decision in the long call counted %d; the calls took %s", fin, used0, took)
	}
}
