package ratelimit

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestConfigurationBounds: the accepted space is exactly what format.go
// states, and its edges are accepted.
func TestConfigurationBounds(t *testing.T) {
	t.Parallel()
	if 4*int64(MaxLimit) > maxCount {
		t.Fatalf("MaxLimit %d leaves less than four limits of room in a %d-byte count", MaxLimit, countBytes)
	}
	ok := func(w Window, ban BanPolicy) error {
		return Policy{Name: "b", Windows: []Window{w}, Ban: ban}.Validate()
	}
	for _, w := range []Window{{1, MinPeriod}, {MaxLimit, MinPeriod}, {MaxLimit, MaxPeriod}, {1, MaxPeriod}} {
		if err := ok(w, BanPolicy{}); err != nil {
			t.Errorf("%v refused: %v", w, err)
		}
	}
	for _, w := range []Window{{0, time.Second}, {MaxLimit + 1, time.Second}, {1, MinPeriod - time.Microsecond}, {1, MaxPeriod + time.Microsecond}} {
		if err := ok(w, BanPolicy{}); err == nil {
			t.Errorf("%v accepted", w)
		}
	}
	w := Window{10, time.Minute}
	for _, b := range []BanPolicy{
		{Threshold: MaxLimit + 1, StrikeWindow: time.Minute, Base: time.Second},
		{Threshold: 1, StrikeWindow: MinPeriod - time.Microsecond, Base: time.Second},
		{Threshold: 1, StrikeWindow: MaxPeriod + time.Microsecond, Base: time.Second},
	} {
		if err := ok(w, b); err == nil {
			t.Errorf("ban %+v accepted", b)
		}
	}
	if err := ok(w, BanPolicy{Threshold: MaxLimit, StrikeWindow: MaxPeriod, Base: time.Second}); err != nil {
		t.Errorf("ban at its maxima refused: %v", err)
	}
}

// TestRecordNames: the records' names are format.go's, in the script's
// KEYS order, for every kind of record a plan can have (replicas of every
// release must name a key's records alike).
func TestRecordNames(t *testing.T) {
	t.Parallel()
	cban := BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Memory: time.Hour}
	for _, c := range []struct {
		p    Policy
		want []string
	}{
		{Policy{Name: "one", Windows: []Window{{Limit: 5, Period: time.Second}}},
			[]string{"pre:{k-1}:ban", "pre:{k-1}:w:1000000:5000"}},
		{Policy{Name: "spec", Windows: []Window{{Limit: 1000, Period: 24 * time.Hour}, {Limit: 60, Period: time.Minute}}},
			[]string{"pre:{k-1}:ban", "pre:{k-1}:w:60000000:300000", "pre:{k-1}:w:86400000000:432000000"}},
		{Policy{Name: "cand", Windows: []Window{{Limit: 5, Period: time.Minute}}, Candidate: []Window{{Limit: 2, Period: time.Minute}, {Limit: 9, Period: time.Hour}}, CandidateBan: cban},
			[]string{"pre:{k-1}:ban", "pre:{k-1}:w:60000000:300000", "pre:{k-1}:c:60000000:3000000", "pre:{k-1}:c:3600000000:180000000", "pre:{k-1}:cban"}},
	} {
		pl := compile(c.p, DefaultBuckets, DefaultStrikeBuckets)
		got := stateKeys("pre:", "k-1", pl)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: records named %q, want %q", c.p.Name, got, c.want)
		}
		if len(got) != pl.keyCount() || got[0] != banKey("pre:", "k-1") || c.p.CandidateBan.Enabled() && got[len(got)-1] != candidateBanKey("pre:", "k-1") {
			t.Errorf("%s: %q disagrees with keyCount, banKey or candidateBanKey", c.p.Name, got)
		}
	}
}

// readRing decodes the header of a ring stored at position at (1-based).
func readRing(t *testing.T, rec string, at int) (head, total, hc, ho int64) {
	t.Helper()
	if len(rec) < at-1+ringHeader {
		t.Fatalf("record of %d bytes has no ring header at %d", len(rec), at)
	}
	h := []byte(rec[at-1:])
	return int64(binary.BigEndian.Uint64(h)), int64(binary.BigEndian.Uint32(h[8:])), int64(binary.BigEndian.Uint32(h[12:])), int64(binary.BigEndian.Uint16(h[16:]))
}

// TestRecordsAtTheirMaxima fills a window of MaxLimit twice (a full limit,
// then another a period later while the first is still stored) and adds a
// limit reconciled after an outage, on real Redis and on miniredis: the
// stored total is exactly 3·MaxLimit, not wrapped; a 1 ms window's 5 µs
// buckets keep exact head indexes; records keep a later release's bytes.
func TestRecordsAtTheirMaxima(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"redis", "miniredis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			var rdb *redis.Client
			set := func(time.Time) {}
			switch backend {
			case "redis":
				rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
				t.Cleanup(func() { _ = rdb.Close() })
			default:
				m, c := newMini(t, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
				rdb, set = c, m.SetTime
			}
			ctx := context.Background()
			prefix := randomPrefix(t)
			eval := func(pl *plan, in input) verdict {
				t.Helper()
				reply, err := evalDecision(ctx, rdb, stateKeys(prefix, "k", pl), pl, in)
				if err != nil {
					t.Fatal(err)
				}
				v, err := decode(pl, reply)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			// A long period, so that real time does not slide anything out.
			pl := compile(Policy{Name: "max", Windows: []Window{{Limit: MaxLimit, Period: time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
			big := input{lease: leaseAsk{want: MaxLimit, need: MaxLimit, life: 1}}
			start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			set(start)
			if v := eval(pl, big); v.granted != MaxLimit {
				t.Fatalf("a whole limit at once: %+v", v)
			}
			if v := eval(pl, input{lease: noLease}); v.outcome != Limited {
				t.Fatalf("past the limit: %+v", v)
			}
			key := stateKeys(prefix, "k", pl)[1]
			if backend == "miniredis" {
				// A period later the first limit is still stored in the
				// oldest bucket while a second one is admitted.
				set(start.Add(time.Hour + time.Millisecond))
				if v := eval(pl, big); v.granted != MaxLimit {
					t.Fatalf("a second limit a period later: %+v", v)
				}
				if v := eval(pl, input{add: []int64{MaxLimit}, lease: noLease}); v.outcome != Limited {
					t.Fatalf("with a limit reconciled: %+v", v)
				}
				rec, err := rdb.Get(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if _, total, _, _ := readRing(t, rec, windowRingAt); total != 3*MaxLimit {
					t.Fatalf("stored total %d, want %d", total, 3*MaxLimit)
				}
			} else {
				if v := eval(pl, input{add: []int64{MaxLimit}, lease: noLease}); v.outcome != Limited || v.win[0].used != 2*MaxLimit {
					t.Fatalf("with a limit reconciled: %+v", v)
				}
				rec, err := rdb.Get(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if _, total, _, _ := readRing(t, rec, windowRingAt); total != 2*MaxLimit {
					t.Fatalf("stored total %d, want %d", total, 2*MaxLimit)
				}
			}

			// 1 ms windows: 5 µs buckets, whose index needs more than 6
			// bytes; every call must see the admissions before it.
			tiny := compile(Policy{Name: "tiny", Windows: []Window{{Limit: 2, Period: MinPeriod}}}, DefaultBuckets, DefaultStrikeBuckets)
			if tiny.windows[0].gran != 5 {
				t.Fatalf("1 ms window has %d µs buckets", tiny.windows[0].gran)
			}
			admitted := 0
			for range 3 {
				if eval(tiny, input{lease: noLease}).outcome == Allowed {
					admitted++
				}
			}
			if backend == "miniredis" && admitted != 2 {
				t.Fatalf("1 ms window admitted %d of 3 at one instant, limit 2", admitted)
			}
			// On real Redis the record lives a few milliseconds, so a pause
			// between the script and the read can find it expired: a fresh
			// decision then writes it again.
			rec, err := rdb.Get(ctx, stateKeys(prefix, "k", tiny)[1]).Result()
			for try := 0; backend == "redis" && err == redis.Nil && try < 100; try++ {
				eval(tiny, input{lease: noLease})
				rec, err = rdb.Get(ctx, stateKeys(prefix, "k", tiny)[1]).Result()
			}
			if err != nil {
				t.Fatal(err)
			}
			head, _, _, _ := readRing(t, rec, windowRingAt)
			if now := time.Now().UnixMicro(); backend == "redis" && (head < (now-int64(time.Minute/time.Microsecond))/5 || head > now/5+1) {
				t.Fatalf("head %d is not time/5 µs (%d)", head, now/5)
			}

			// A later release's extension: bytes after the ring are kept.
			// A minute's window, whose record outlives any pause of this
			// test on real Redis (a 1 ms window's record expires in
			// milliseconds); on miniredis an hour later, so that the whole
			// ring is stale and rewritten.
			ext1 := compile(Policy{Name: "ext", Windows: []Window{{Limit: 5, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
			extKey := stateKeys(prefix, "k", ext1)[1]
			if v := eval(ext1, input{lease: noLease}); v.outcome != Allowed {
				t.Fatalf("a first request: %+v", v)
			}
			rec, err = rdb.Get(ctx, extKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			ext := rec + "\x07extension"
			if err := rdb.Set(ctx, extKey, ext, 3*time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Del(context.Background(), extKey) })
			set(start.Add(2*time.Hour + 2*time.Millisecond))
			if v := eval(ext1, input{lease: noLease}); v.outcome != Allowed {
				t.Fatalf("a second request: %+v", v)
			}
			got, err := rdb.Get(ctx, extKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ext) || got[len(got)-10:] != "\x07extension" {
				t.Fatalf("a later release's bytes were not kept: %q", got[len(rec):])
			}
		})
	}
}
