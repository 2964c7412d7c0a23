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

// TestGiveBackKeepsEveryBucketAtLeastAdmittedMiniredis checks what giving back
// promises (giveback.go) on the records themselves, over generated plans
// and traffic, on miniredis and on real Redis: leases of every size are
// granted to two keys at random times, part of each is spent, and the rest
// is given back, one to five blocks of either key in one call, at once or
// after the head has moved, perhaps past the bucket's slot, or after the
// key was reset. After every step, every bucket a window record stores
// counts exactly what the test admitted in it since the key's last Reset
// plus what it did not give back (so never less than what was admitted:
// the windows stay strict), and the window's total is the sum of those
// buckets: a give-back taken off the wrong slot or key, taken twice, taken
// from a bucket already slid out (whose slot now holds a later bucket),
// left off the total, or of a block granted before a Reset taken off the
// records made after it is caught.
func TestGiveBackKeepsEveryBucketAtLeastAdmittedMiniredis(t *testing.T) {
	t.Parallel()
	giveBackProperty(t, "miniredis", false, testenv.Cases(t, 8, *invariantCases))
}

// TestGiveBackKeepsEveryBucketAtLeastAdmittedRedis: the same on real
// Redis, by real time.
func TestGiveBackKeepsEveryBucketAtLeastAdmittedRedis(t *testing.T) {
	t.Parallel()
	giveBackProperty(t, "redis", false, testenv.Cases(t, 4, max(*invariantCases/5, 8)))
}

// TestGiveBackOfBlocksKeepsEveryBucketAtLeastAdmittedMiniredis is the same
// for blocks (lease.go): a plan of a short and a long window (a third of
// the cases, the short one alone), blocks of
// every size granted by round trips that ask for one and given back, part
// spent; the short window's coarse record, where a block counts in the
// bucket of its end (one ahead of the head, or behind it), is held to its
// buckets as the windows' own records are.
func TestGiveBackOfBlocksKeepsEveryBucketAtLeastAdmittedMiniredis(t *testing.T) {
	t.Parallel()
	giveBackProperty(t, "miniredis", true, testenv.Cases(t, 8, *invariantCases))
}

// TestGiveBackOfBlocksKeepsEveryBucketAtLeastAdmittedRedis: the same on
// real Redis, by real time.
func TestGiveBackOfBlocksKeepsEveryBucketAtLeastAdmittedRedis(t *testing.T) {
	t.Parallel()
	giveBackProperty(t, "redis", true, testenv.Cases(t, 4, max(*invariantCases/5, 8)))
}

// giveBackProperty plays cases of the give-back property on backend:
// the caller's count (testenv.Cases, so that make test-long runs it whole).
func giveBackProperty(t *testing.T, backend string, blocks bool, cases int) {
	stream := uint64(113)
	if blocks {
		stream = 114
	}
	rng := invariantRNG(t, stream)
	// (make fuzz runs 2000 cases.)
	steps := 300
	if backend == "redis" {
		steps = 200
	}
	var seen giveBackSeen
	for c := range cases {
		seen.add(giveBackCase(t, backend, rng, c, steps, blocks))
	}
	// Every kind of give-back must have been tried.
	t.Logf("%+v", seen)
	if seen.taken == 0 || seen.gone == 0 || seen.reset == 0 || seen.batched == 0 || blocks && seen.blocks == 0 || seen.compact == 0 {
		t.Fatalf("%+v: want some of each", seen)
	}
}

// giveBackSeen counts the windows given back to, those whose bucket had
// slid out and those of blocks granted before a Reset, and the calls that
// gave back more than one block.
type giveBackSeen struct{ taken, gone, reset, batched, blocks, compact int }

func (s *giveBackSeen) add(o giveBackSeen) {
	s.taken, s.gone, s.reset, s.batched, s.blocks = s.taken+o.taken, s.gone+o.gone, s.reset+o.reset, s.batched+o.batched, s.blocks+o.blocks
	s.compact += o.compact
}

// giveBackCase runs one case.
func giveBackCase(t *testing.T, backend string, rng *rand.Rand, c, steps int, blocks bool) (seen giveBackSeen) {
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
	// Odd cases write compact window records (format.go), finalized.
	arg := "0"
	if c%2 == 1 {
		arg = "c"
		seen.compact++
	}
	var ws []Window
	for range 1 + rng.IntN(2) {
		period := time.Millisecond + time.Duration(rng.Int64N(int64(maxPeriod)))
		ws = append(ws, Window{Limit: 20 + rng.Int64N(5000), Period: period})
	}
	pl := compile(Policy{Name: "g", Windows: ws}, 2+rng.IntN(20), DefaultStrikeBuckets)
	// rings are the records the test holds to their buckets: the windows',
	// and with blocks the coarse ones after them; decided under cp.
	rings, cp := pl.windows, pl
	if blocks {
		buckets := 2 + rng.IntN(20)
		long := time.Duration(buckets) * blockLife
		if rng.IntN(2) == 0 {
			long = 24 * time.Hour
		}
		// A short window: buckets shorter than a block's life.
		short := time.Millisecond + time.Duration(rng.Int64N(int64(min(maxPeriod, time.Duration(buckets)*blockLife-time.Millisecond))))
		ws = []Window{{Limit: 1000 + rng.Int64N(1_000_000), Period: short},
			{Limit: 1000 + rng.Int64N(1_000_000), Period: long}}
		if rng.IntN(3) == 0 {
			// The short window alone: its blocks count in the coarse
			// record only.
			ws = ws[:1]
		}
		pl = compile(Policy{Name: "g", Windows: ws}, buckets, DefaultStrikeBuckets)
		pl.split()
		cp = pl.blk
		rings = append(append([]ring(nil), pl.windows...), cp.coarse...)
	}
	names := []string{"a", "b"}
	keys := map[string][]string{}
	// want[key][i][b]: what window i's bucket b of key must count.
	want := map[string][]map[int64]int64{}
	fresh := func(key string) {
		want[key] = make([]map[int64]int64, len(rings))
		for i := range want[key] {
			want[key][i] = map[int64]int64{}
		}
	}
	for _, k := range names {
		keys[k] = stateKeys(prefix, k, cp)
		fresh(k)
	}
	// A block granted, partly spent, not yet given back; stale once its
	// key was reset after the grant.
	type block struct {
		giveBack
		stale bool
	}
	var pending []block
	for step := range steps {
		// Time moves by a few µs to a few buckets, now and then past a
		// whole period; before half the Resets, not at all (on miniredis,
		// a Reset in the µs of the grant before it).
		act := rng.IntN(40)
		g := rings[rng.IntN(len(rings))].gran
		switch r := rng.IntN(10); {
		case act < 2 && r < 5:
		case r < 5:
			advance(time.Duration(rng.Int64N(g/4+1)) * time.Microsecond)
		case r < 9:
			advance(time.Duration(rng.Int64N(3*g+1)) * time.Microsecond)
		default:
			advance(time.Duration(rng.Int64N(pl.windows[0].period*2+1)) * time.Microsecond)
		}
		key := names[rng.IntN(len(names))]
		switch {
		case act < 2:
			// Reset: the key's records go; blocks granted before it are
			// never to be given back to the records made after it.
			if err := resetRecords(ctx, rdb, prefix, key, pl, nil); err != nil {
				t.Fatal(err)
			}
			fresh(key)
			for i := range pending {
				if pending[i].key == key {
					pending[i].stale = true
				}
			}
			// A grant after the Reset lies after it on the server's
			// clock, as it always does on real Redis.
			advance(time.Microsecond)
		case act < 20 && len(pending) > 0:
			// Give back one to five blocks granted earlier, in one call.
			var gs []giveBack
			var stale []bool
			for range 1 + rng.IntN(min(5, len(pending))) {
				j := rng.IntN(len(pending))
				gs, stale = append(gs, pending[j].giveBack), append(stale, pending[j].stale)
				pending = append(pending[:j], pending[j+1:]...)
			}
			if len(gs) > 1 {
				seen.batched++
			}
			before := map[string]map[int]storedRing{}
			for _, k := range names {
				before[k] = readBuckets(t, rdb, keys[k], cp)
			}
			// The server's time during the call lies between these two
			// (on miniredis they are the same).
			from := serverMicros(t, rdb)
			k, args := giveBackCommand(prefix, gs)
			if err := giveBackScript.Run(ctx, rdb, k, args...).Err(); err != nil {
				t.Fatal(err)
			}
			to := serverMicros(t, rdb)
			// What the call takes off each bucket if the window still
			// holds it at the server's time; unsure, where that time
			// decides.
			type bucket struct {
				key  string
				i    int
				b, n int64
			}
			var unsure []bucket
			for j, gb := range gs {
				for gi, w := range gb.windows {
					// The record's index among rings, and the bucket: a
					// block's windows are the coarse records, counting it
					// in the bucket of its end, then the long windows'.
					i, b := gi, gb.at/w.gran
					if gb.coarse > 0 {
						if gi < gb.coarse {
							i, b = len(pl.windows)+gi, (gb.end-1)/w.gran
						} else {
							i = pl.shortWindows() + gi - gb.coarse
						}
					}
					switch head, ok := before[gb.key][i]; {
					case stale[j]:
						seen.reset++
					case !ok || b > head.vh || b < head.vh-w.n || b < from/w.gran-w.n:
						// Not stored, or slid out of the window by time.
						seen.gone++
					case b < to/w.gran-w.n:
						unsure = append(unsure, bucket{gb.key, i, b, gb.n})
					default:
						// (Blocks of one key given back in one call take
						// from the same counts in turn.)
						want[gb.key][i][b] -= gb.n
						seen.taken++
					}
				}
			}
			if len(unsure) > 0 {
				// Taken from each such bucket or from none: the call's
				// one server time decides, the same for all of a window.
				stored := map[string]map[int]storedRing{}
				for _, k := range names {
					stored[k] = readBuckets(t, rdb, keys[k], cp)
				}
				taken := map[bucket]int64{}
				for _, u := range unsure {
					taken[bucket{u.key, u.i, u.b, 0}] += u.n
				}
				for u, n := range taken {
					rec, ok := stored[u.key][u.i]
					if !ok {
						continue // expired meanwhile (real time): nothing left to check
					}
					if got := rec.count[u.b]; got == want[u.key][u.i][u.b]-n {
						want[u.key][u.i][u.b] -= n
					} else if got != want[u.key][u.i][u.b] {
						t.Fatalf("%s case %d step %d, key %s, window %d: bucket %d counts %d, want %d or, taken, %d",
							backend, c, step, u.key, u.i, u.b, got, want[u.key][u.i][u.b], want[u.key][u.i][u.b]-n)
					}
				}
			}
		default:
			n := int64(1 + rng.IntN(64))
			if rng.IntN(4) == 0 {
				n = 1
			}
			in := input{lease: leaseAsk{want: n, need: n, life: int64(1 + rng.IntN(1_000_000))}}
			if blocks && rng.IntN(3) > 0 {
				in = input{block: &blockAsk{max: n, replicas: 1, rtt: 0}}
			}
			nums := scriptNums(pl, in)
			if in.block != nil {
				shortenBlock(rng, nums)
			}
			rs, err := evalBatchArg(ctx, rdb, []decision{{keys: keys[key], pl: cp, nums: nums}}, arg)
			if err != nil {
				t.Fatal(err)
			}
			v, err := decode(pl, rs[0])
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case v.outcome != Allowed:
			case in.block != nil && v.granted > 1:
				// A block: the request in every window's record, the
				// block in the long ones' (at their current bucket) and
				// in the coarse ones' (at its end's).
				k := v.granted - 1
				ns := pl.shortWindows()
				for i, w := range rings {
					switch {
					case i < ns:
						want[key][i][v.now/w.gran]++
					case i < len(pl.windows):
						want[key][i][v.now/w.gran] += v.granted
					default:
						want[key][i][(v.leaseEnd-1)/w.gran] += k
					}
				}
				seen.blocks++
				if spent := rng.Int64N(k + 1); spent < k {
					pending = append(pending, block{giveBack: giveBack{key: key, windows: cp.backRings, coarse: len(cp.coarse), at: v.now, end: v.leaseEnd, n: k - spent}})
				}
			default:
				for i, w := range pl.windows {
					want[key][i][v.now/w.gran] += v.granted
				}
				// The request and some of the lease spent; the rest to
				// give back.
				if spent := 1 + rng.Int64N(v.granted); spent < v.granted {
					pending = append(pending, block{giveBack: giveBack{key: key, windows: pl.windows, at: v.now, n: v.granted - spent}})
				}
			}
		}
		for _, k := range names {
			got := readBuckets(t, rdb, keys[k], cp)
			for i, w := range rings {
				rec, ok := got[i]
				if !ok {
					continue
				}
				var sum int64
				for b := rec.vh - w.n; b <= rec.vh; b++ {
					if rec.count[b] != want[k][i][b] {
						t.Fatalf("%s case %d step %d, key %s, window %d (%+v): bucket %d counts %d, want %d (head %d)",
							backend, c, step, k, i, w, b, rec.count[b], want[k][i][b], rec.vh)
					}
					sum += rec.count[b]
				}
				if rec.total != sum {
					t.Fatalf("%s case %d step %d, key %s, window %d: total %d, its buckets %d", backend, c, step, k, i, rec.total, sum)
				}
			}
		}
	}
	return seen
}

// serverMicros returns the server's time, µs.
func serverMicros(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// storedRing is a window record as stored: its head, total and the count
// of each bucket it holds.
type storedRing struct {
	vh, total int64
	count     map[int64]int64
	last      map[int64]int64 // each bucket's last event (µs), as the script reads it (lastAt)
}

// readBuckets reads the window records of keys (stateKeys under pl), by
// window index, then its coarse records (lease.go); a record that does
// not exist is absent.
func readBuckets(t *testing.T, rdb *redis.Client, keys []string, pl *plan) map[int]storedRing {
	t.Helper()
	out := map[int]storedRing{}
	rings := append(append([]ring(nil), pl.windows...), pl.coarse...)
	for i, w := range rings {
		k := 1 + i
		if i >= len(pl.windows) {
			k = len(keys) - len(rings) + i
		}
		rec, err := rdb.Get(context.Background(), keys[k]).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		vh, total, hc, ho := readRing(t, rec, windowRingAt)
		s := storedRing{vh: vh, total: total, count: map[int64]int64{vh: hc}, last: map[int64]int64{vh: vh*w.gran + ho*w.unit}}
		if rec[0] == compactVersion {
			// Compact: only buckets with entries hold events.
			for at := windowRingAt - 1 + ringHeader; at+compactEntryBytes <= len(rec); at += compactEntryBytes {
				e := []byte(rec[at:])
				b := int64(binary.BigEndian.Uint64(e))
				s.count[b] = int64(binary.BigEndian.Uint32(e[8:]))
				s.last[b] = b*w.gran + int64(binary.BigEndian.Uint16(e[8+countBytes:]))*w.unit
			}
			out[i] = s
			continue
		}
		for b := vh - w.n; b < vh; b++ {
			at := windowRingAt - 1 + ringHeader + int(b%(w.n+1))*slotBytes
			s.count[b] = int64(binary.BigEndian.Uint32([]byte(rec[at:])))
			s.last[b] = b*w.gran + int64(binary.BigEndian.Uint16([]byte(rec[at+countBytes:])))*w.unit
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
		k, args := giveBackCommand("t:", []giveBack{{key: "k", windows: pl.windows, at: start.UnixMicro(), n: n}})
		got, err := giveBackScript.Run(ctx, rdb, k, args...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
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
		{"another version", func(rec []byte) { rec[0] = compactVersion + 1 }},
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

// TestGiveBackRetriesOnlyWhatWasNotRun: when part of a pipeline ran and
// part found the script missing (a shard of a cluster restarted), only the
// calls that did not run are sent again: each give-back is applied once.
func TestGiveBackRetriesOnlyWhatWasNotRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	_, rdb := newMini(t, start)
	pl := compile(Policy{Name: "f", Windows: []Window{{Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	// Three keys of three slots, each leased 40.
	names := []string{"k", "l", "m"}
	var now int64
	for _, k := range names {
		v := evalScript(t, rdb, k, pl, input{lease: leaseAsk{want: 40, need: 40, life: 1_000_000}})
		if v.granted != 40 {
			t.Fatalf("lease of 40 not granted: %+v", v)
		}
		now = v.now
	}
	if keySlot(names[0]) == keySlot(names[1]) || keySlot(names[1]) == keySlot(names[2]) || keySlot(names[0]) == keySlot(names[2]) {
		t.Fatal("keys share a slot")
	}
	if err := giveBackScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// The first pipeline of two or more runs its first command and
	// answers NOSCRIPT for the rest, as a cluster with a restarted shard
	// would.
	rdb.AddHook(&noScriptAfterFirst{})
	q := newGiveBacks(rdb, "t:", slog.New(slog.NewTextHandler(io.Discard, nil)), func() bool { return false })
	q.bySlot = true // a call a slot, as on a cluster
	for i, k := range names {
		q.add(giveBack{key: k, windows: pl.windows, at: now, n: int64(2 + i)})
	}
	q.flush(time.Second)
	for i, k := range names {
		_, total, hc, _ := readRing(t, rdb.Get(ctx, stateKeys("t:", k, pl)[1]).Val(), windowRingAt)
		if want := int64(40 - 2 - i); total != want || hc != want {
			t.Fatalf("key %s: total %d, head count %d; want %d", k, total, hc, want)
		}
	}
	if q.applied.Load() != 3 {
		t.Fatalf("%d applied, want 3", q.applied.Load())
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
