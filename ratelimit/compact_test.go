package ratelimit

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestCompactRecordsDecideAsFullRings plays generated plans and traffic
// (bursts, gaps of a bucket to a period, leases, strikes, admissions made
// without Redis, peeks) on two keys at the same instants: one whose window
// records are written compact (format.go), one whose are full rings. Every
// verdict must be the same, field by field: used, remaining, reset,
// Retry-After, bans. A compact record holds at most compactMaxEntries
// entries, all within its ring, and is never longer than the full ring.
func TestCompactRecordsDecideAsFullRings(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 120)
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	var compact, grown, entries int
	for c := range testenv.Cases(t, 8, *invariantCases) {
		m, rdb := newMini(t, start)
		now := start
		p := genPolicies(rng, time.Hour)[0]
		pl := compile(p, 2+rng.IntN(DefaultBuckets), DefaultStrikeBuckets)
		keys := map[string][]string{"1": stateKeys("f:", "k", pl), "1c": stateKeys("c:", "k", pl)}
		for step := range 300 {
			switch r := rng.IntN(10); {
			case r < 4:
			case r < 8:
				now = now.Add(time.Duration(rng.Int64N(3*pl.windows[0].gran+1)) * time.Microsecond)
			default:
				now = now.Add(time.Duration(rng.Int64N(pl.windows[len(pl.windows)-1].period+1)) * time.Microsecond)
			}
			m.SetTime(now)
			in := input{lease: noLease, peek: rng.IntN(20) == 0}
			if rng.IntN(8) == 0 {
				n := 1 + rng.Int64N(pl.windows[0].limit)
				in.lease = leaseAsk{want: n, need: n, life: 1 + rng.Int64N(1_000_000)}
			}
			if rng.IntN(30) == 0 {
				in.extra = rng.Int64N(5)
				in.add = make([]int64, len(pl.windows))
				for i := range in.add {
					in.add[i] = rng.Int64N(3)
				}
			}
			var got [2]verdict
			for j, arg := range []string{"1", "1c"} {
				rs, err := evalBatchArg(context.Background(), rdb, []decision{{keys: keys[arg], pl: pl, nums: scriptNums(pl, in)}}, arg)
				if err != nil {
					t.Fatal(err)
				}
				if got[j], err = decode(pl, rs[0]); err != nil {
					t.Fatal(err)
				}
			}
			where := fmt.Sprintf("case %d (%+v) step %d", c, p, step)
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Fatalf("%s: a full ring decided\n%+v\na compact record\n%+v", where, got[0], got[1])
			}
			for i, w := range pl.windows {
				rec, err := rdb.Get(context.Background(), keys["1c"][1+i]).Result()
				if err != nil {
					continue // none yet, or expired
				}
				switch {
				case rec[0] == compactVersion:
					e := len(rec) - 1 - ringHeader
					if e%compactEntryBytes != 0 || e/compactEntryBytes > compactMaxEntries || int64(len(rec)) > 1+ringSize(w.n) {
						t.Fatalf("%s: window %d's compact record has %d bytes", where, i, len(rec))
					}
					compact++
					entries = max(entries, e/compactEntryBytes)
				case rec[0] == formatVersion:
					grown++
				default:
					t.Fatalf("%s: window %d's record has version %d", where, i, rec[0])
				}
			}
		}
	}
	t.Logf("records seen compact %d times (at most %d entries), grown to a full ring %d times", compact, entries, grown)
	if compact == 0 || grown == 0 || entries < 2 {
		t.Fatalf("the traffic reached too little: compact %d, grown %d, most entries %d", compact, grown, entries)
	}
}
