package ratelimit

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestGiveBackKeepsEveryBucketAtLeastAdmitted checks what giving back
// promises (giveback.go) on the records themselves, over generated plans
// and traffic, on miniredis and on real Redis: leases of every size are
// granted at random times, part of each is spent, and the rest is given
// back at once or after the head has moved, perhaps past the bucket's
// slot. After every step, every bucket a window record stores counts
// exactly what the test admitted in it plus what it did not give back
// (so never less than what was admitted: the windows stay strict), and
// the window's total is the sum of those buckets: a give-back taken off
// the wrong slot, taken twice, taken from a bucket already slid out (whose
// slot now holds a later bucket), or left off the total is caught.
func TestGiveBackKeepsEveryBucketAtLeastAdmitted(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"miniredis", "redis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			rng := invariantRNG(t, 113)
			// (make fuzz runs 50 times as many.)
			cases, steps := *invariantCases, 300
			if backend == "redis" {
				cases, steps = max(*invariantCases/5, 8), 200
			}
			var taken, gone int
			for c := range cases {
				tk, gn := giveBackCase(t, backend, rng, c, steps)
				taken, gone = taken+tk, gone+gn
			}
			// Both kinds of give-back must have been tried.
			t.Logf("%d windows given back to, %d whose bucket had slid out", taken, gone)
			if taken == 0 || gone == 0 {
				t.Fatalf("%d windows given back to, %d whose bucket had slid out: want both", taken, gone)
			}
		})
	}
}

// giveBackCase runs one case and returns how many windows were given
// back to and how many found their bucket gone.
func giveBackCase(t *testing.T, backend string, rng *rand.Rand, c, steps int) (taken, gone int) {
	ctx := context.Background()
	var rdb *redis.Client
	var advance func(d time.Duration)
	// On real Redis time is real: short periods, so that heads move and
	// buckets slide out within a few milliseconds.
	maxPeriod := time.Hour
	if backend == "redis" {
		rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
		t.Cleanup(func() { _ = rdb.Close() })
		advance = func(d time.Duration) { time.Sleep(min(d, 3*time.Millisecond)) }
		maxPeriod = 30 * time.Millisecond
	} else {
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		m, cl := newMini(t, now)
		rdb = cl
		advance = func(d time.Duration) { now = now.Add(d); m.SetTime(now) }
	}
	prefix := randomPrefix(t)
	var ws []Window
	for range 1 + rng.IntN(2) {
		period := time.Millisecond + time.Duration(rng.Int64N(int64(maxPeriod)))
		ws = append(ws, Window{Limit: 20 + rng.Int64N(5000), Period: period})
	}
	pl := compile(Policy{Name: "g", Windows: ws}, 2+rng.IntN(20), DefaultStrikeBuckets)
	keys := stateKeys(prefix, "k", pl)
	// want[i][b]: what window i's bucket b must count.
	want := make([]map[int64]int64, len(pl.windows))
	for i := range want {
		want[i] = map[int64]int64{}
	}
	var pending []giveBack // granted, partly spent, not yet given back
	for step := range steps {
		// Time moves by a few µs to a few buckets, now and then past a
		// whole period.
		g := pl.windows[rng.IntN(len(pl.windows))].gran
		switch r := rng.IntN(10); {
		case r < 5:
			advance(time.Duration(rng.Int64N(g/4+1)) * time.Microsecond)
		case r < 9:
			advance(time.Duration(rng.Int64N(3*g+1)) * time.Microsecond)
		default:
			advance(time.Duration(rng.Int64N(pl.windows[0].period*2+1)) * time.Microsecond)
		}
		if len(pending) > 0 && rng.IntN(2) == 0 {
			// Give back a block granted earlier.
			j := rng.IntN(len(pending))
			gb := pending[j]
			pending = append(pending[:j], pending[j+1:]...)
			before := readBuckets(t, rdb, keys, pl)
			k, args := gb.command(prefix)
			if err := giveBackScript.Run(ctx, rdb, k, args...).Err(); err != nil {
				t.Fatal(err)
			}
			for i, w := range pl.windows {
				b := gb.at / w.gran
				if head, ok := before[i]; ok && b <= head.vh && b >= head.vh-w.n {
					want[i][b] -= gb.n
					taken++
				} else {
					gone++
				}
			}
		} else {
			k := int64(1 + rng.IntN(64))
			if rng.IntN(4) == 0 {
				k = 1
			}
			reply, err := evalDecision(ctx, rdb, keys, pl, input{lease: leaseAsk{want: k, need: k, life: int64(1 + rng.IntN(1_000_000))}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := decode(pl, reply)
			if err != nil {
				t.Fatal(err)
			}
			if v.outcome == Allowed {
				for i, w := range pl.windows {
					want[i][v.now/w.gran] += v.granted
				}
				// The request and some of the lease spent; the rest to
				// give back.
				if spent := 1 + rng.Int64N(v.granted); spent < v.granted {
					pending = append(pending, giveBack{key: "k", windows: pl.windows, at: v.now, n: v.granted - spent})
				}
			}
		}
		got := readBuckets(t, rdb, keys, pl)
		for i, w := range pl.windows {
			rec, ok := got[i]
			if !ok {
				continue
			}
			var sum int64
			for b := rec.vh - w.n; b <= rec.vh; b++ {
				if rec.count[b] != want[i][b] {
					t.Fatalf("%s case %d step %d, window %d (%+v): bucket %d counts %d, want %d (head %d)",
						backend, c, step, i, w, b, rec.count[b], want[i][b], rec.vh)
				}
				sum += rec.count[b]
			}
			if rec.total != sum {
				t.Fatalf("%s case %d step %d, window %d: total %d, its buckets %d", backend, c, step, i, rec.total, sum)
			}
		}
	}
	return taken, gone
}

// storedRing is a window record as stored: its head, total and the count
// of each bucket it holds.
type storedRing struct {
	vh, total int64
	count     map[int64]int64
}

// readBuckets reads the window records of keys (stateKeys under pl), by
// window index; a window with no record is absent.
func readBuckets(t *testing.T, rdb *redis.Client, keys []string, pl *plan) map[int]storedRing {
	t.Helper()
	out := map[int]storedRing{}
	for i, w := range pl.windows {
		rec, err := rdb.Get(context.Background(), keys[1+i]).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		vh, total, hc, _ := readRing(t, rec, windowRingAt)
		s := storedRing{vh: vh, total: total, count: map[int64]int64{vh: hc}}
		for b := vh - w.n; b < vh; b++ {
			at := windowRingAt - 1 + ringHeader + int(b%(w.n+1))*slotBytes
			s.count[b] = int64(binary.BigEndian.Uint32([]byte(rec[at:])))
		}
		out[i] = s
	}
	return out
}

// TestGiveBackLeavesOddRecordsAlone: a give-back to a record that does not
// exist creates none; to a record of another version, or with a saturated
// total, changes nothing; more than a bucket counts takes it to zero, not
// below.
func TestGiveBackLeavesOddRecordsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	_, rdb := newMini(t, start)
	pl := compile(Policy{Name: "o", Windows: []Window{{Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	keys := stateKeys("t:", "k", pl) // evalScript's
	run := func(n int64) int64 {
		t.Helper()
		gb := giveBack{key: "k", windows: pl.windows, at: start.UnixMicro(), n: n}
		k, args := gb.command("t:")
		got, err := giveBackScript.Run(ctx, rdb, k, args...).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := run(5); got != 0 || rdb.Exists(ctx, keys[1]).Val() != 0 {
		t.Fatalf("a give-back to no record took %d and left %d records", got, rdb.Exists(ctx, keys[1]).Val())
	}
	// Three admitted, then six given back: three taken, none below zero.
	for range 3 {
		if v := evalScript(t, rdb, "k", pl, input{lease: noLease}); v.outcome != Allowed {
			t.Fatal(v)
		}
	}
	if got := run(6); got != 3 {
		t.Fatalf("took %d of a bucket counting 3", got)
	}
	rec := rdb.Get(ctx, keys[1]).Val()
	if _, total, hc, _ := readRing(t, rec, windowRingAt); total != 0 || hc != 0 {
		t.Fatalf("total %d, head count %d after all was taken", total, hc)
	}
	// One more admitted: the head bucket counts 1, the record is v1.
	if v := evalScript(t, rdb, "k", pl, input{lease: noLease}); v.outcome != Allowed {
		t.Fatal(v)
	}
	base := rdb.Get(ctx, keys[1]).Val()
	for _, c := range []struct {
		name string
		edit func(rec []byte)
	}{
		{"another version", func(rec []byte) { rec[0] = formatVersion + 1 }},
		{"a saturated total", func(rec []byte) { binary.BigEndian.PutUint32(rec[windowRingAt-1+headBytes:], maxCount) }},
		{"a saturated head count", func(rec []byte) { binary.BigEndian.PutUint32(rec[windowRingAt-1+headBytes+countBytes:], maxCount) }},
	} {
		rec := []byte(base)
		c.edit(rec)
		rdb.Set(ctx, keys[1], rec, 0)
		if got := run(1); got != 0 || rdb.Get(ctx, keys[1]).Val() != string(rec) {
			t.Fatalf("%s: took %d, or changed the record", c.name, got)
		}
	}
	rdb.Set(ctx, keys[1], base, 0)
	if got := run(1); got != 1 {
		t.Fatalf("took %d of the record as written, want 1", got)
	}
}

// TestGiveBackOnceAfterScriptFlush: give-backs sent to a server that has
// lost the script (a restart, SCRIPT FLUSH) are run once the script is
// loaded again, each once: a batch of them takes exactly their sum off
// the bucket, and counts each as applied.
func TestGiveBackOnceAfterScriptFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, pl, record, v := leasedForty(t)
	q := newGiveBacks(rdb, "t:", slog.New(slog.NewTextHandler(io.Discard, nil)), func() bool { return false })
	for round, flush := range []bool{true, false, true} {
		if flush {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		before := q.applied.Load()
		q.add(giveBack{key: "k", windows: pl.windows, at: v.now, n: 3})
		q.add(giveBack{key: "k", windows: pl.windows, at: v.now, n: 2})
		q.flush(time.Second)
		_, total, hc, _ := readRing(t, rdb.Get(ctx, record).Val(), windowRingAt)
		if want := int64(40 - 5*(round+1)); total != want || hc != want || q.applied.Load()-before != 2 {
			t.Fatalf("round %d (script flushed: %v): total %d, head count %d, %d applied; want %d, %d, 2",
				round, flush, total, hc, q.applied.Load()-before, want, want)
		}
	}
}

// leasedForty grants key "k" a lease of 40 under a plan of one window on a
// fresh miniredis, and returns the client, the plan, the window's record
// and the grant.
func leasedForty(t *testing.T) (*redis.Client, *plan, string, verdict) {
	t.Helper()
	_, rdb := newMini(t, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
	pl := compile(Policy{Name: "f", Windows: []Window{{Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	v := evalScript(t, rdb, "k", pl, input{lease: leaseAsk{want: 40, need: 40, life: 1_000_000}})
	if v.granted != 40 {
		t.Fatalf("lease of 40 not granted: %+v", v)
	}
	return rdb, pl, stateKeys("t:", "k", pl)[1], v // evalScript's prefix
}

// TestGiveBackRetriesOnlyWhatWasNotRun: when part of a batch ran and part
// found the script missing (a shard of a cluster restarted), only the
// part that did not run is sent again: each give-back is applied once.
func TestGiveBackRetriesOnlyWhatWasNotRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, pl, record, v := leasedForty(t)
	if err := giveBackScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// The first pipeline of two or more runs its first command and
	// answers NOSCRIPT for the rest, as a server without the script would.
	rdb.AddHook(&noScriptAfterFirst{})
	q := newGiveBacks(rdb, "t:", slog.New(slog.NewTextHandler(io.Discard, nil)), func() bool { return false })
	q.add(giveBack{key: "k", windows: pl.windows, at: v.now, n: 3})
	q.add(giveBack{key: "k", windows: pl.windows, at: v.now, n: 2})
	q.add(giveBack{key: "k", windows: pl.windows, at: v.now, n: 4})
	q.flush(time.Second)
	_, total, hc, _ := readRing(t, rdb.Get(ctx, record).Val(), windowRingAt)
	if total != 40-9 || hc != 40-9 || q.applied.Load() != 3 {
		t.Fatalf("total %d, head count %d, %d applied; want 31, 31, 3", total, hc, q.applied.Load())
	}
}

// noScriptAfterFirst fails, in the first pipeline of two commands or
// more, every command after the first with NOSCRIPT, unsent.
type noScriptAfterFirst struct{ done bool }

type noScriptError struct{}

func (noScriptError) Error() string { return "NOSCRIPT No matching script." }
func (noScriptError) RedisError()   {}

func (h *noScriptAfterFirst) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *noScriptAfterFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *noScriptAfterFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.done || len(cmds) < 2 {
			return next(ctx, cmds)
		}
		h.done = true
		err := next(ctx, cmds[:1])
		for _, c := range cmds[1:] {
			c.SetErr(noScriptError{})
		}
		if err == nil {
			err = noScriptError{}
		}
		return err
	}
}

// TestGiveBackNeverRetriedByTheClient: every give-back goes to Redis as a
// command go-redis does not send again after a network error or a
// timeout, when the server may have run it before its reply was lost:
// run twice, it would take its admissions off twice.
func TestGiveBackNeverRetriedByTheClient(t *testing.T) {
	t.Parallel()
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	_, rdb := newMini(t, start)
	pl := compile(Policy{Name: "r", Windows: []Window{{Limit: 1000, Period: time.Minute}, {Limit: 9000, Period: time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	seen := &pipelineRecorder{}
	rdb.AddHook(seen)
	q := newGiveBacks(rdb, "t:", slog.New(slog.NewTextHandler(io.Discard, nil)), func() bool { return false })
	for i := range 5 {
		q.add(giveBack{key: "k" + strconv.Itoa(i), windows: pl.windows, at: start.UnixMicro(), n: 2})
	}
	q.flush(time.Second)
	if seen.sent == 0 || seen.retryable != 0 {
		t.Fatalf("%d give-backs sent, %d of them retryable by the client: want some, none", seen.sent, seen.retryable)
	}
}

// pipelineRecorder counts the EVALSHA commands of the pipelines a client
// sends, and those go-redis would send again after a network error.
type pipelineRecorder struct{ sent, retryable int }

func (h *pipelineRecorder) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() != "evalsha" {
				continue // a new connection's own set-up
			}
			h.sent++
			if !c.NoRetry() {
				h.retryable++
			}
		}
		return next(ctx, cmds)
	}
}
