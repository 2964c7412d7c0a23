package ratelimit

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestCompactRecordsDecideAsFullRings plays generated plans and traffic
// (bursts, gaps of a bucket to a period, leases, blocks, strikes,
// admissions made without Redis, peeks, edits of the plan's limits) on two keys at the same instants: one whose window
// records are written compact (format.go), one whose are full rings. Every
// verdict must be the same, field by field: used, remaining, reset,
// Retry-After, bans. A compact record holds at most compactMaxEntries
// entries, all within its ring, and a lease cap while one holds; it is never
// longer than the full ring with its cap; one grown full goes back to compact
// once its key quietens.
func TestCompactRecordsDecideAsFullRings(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 120)
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	var compact, capped, grown, shrunk, entries int
	for c := range testenv.Cases(t, 8, *invariantCases) {
		m, rdb := newMini(t, start)
		now := start
		p := genPolicies(rng, time.Hour)[0]
		// The plan, and an edit of its limits (the same records: an edit
		// keeps counts, and a lease or block's cap holds the lower limit).
		buckets := 2 + rng.IntN(DefaultBuckets)
		p2 := p
		p2.Windows = slices.Clone(p.Windows)
		for i := range p2.Windows {
			p2.Windows[i].Limit = max(1, p2.Windows[i].Limit/(1+rng.Int64N(4)))
		}
		var pls, dps [2]*plan
		for i, p := range []Policy{p, p2} {
			pls[i] = compile(p, buckets, DefaultStrikeBuckets)
			pls[i].split()
			// With short and long windows, the plan's records include
			// coarse ones, and blocks cap its long windows.
			dps[i] = pls[i]
			if pls[i].blk != nil {
				dps[i] = pls[i].blk
			}
		}
		keys := map[string][]string{"0": stateKeys("f:", "k", dps[0]), "c": stateKeys("c:", "k", dps[0])}
		if !slices.Equal(keys["0"], stateKeys("f:", "k", dps[1])) {
			t.Fatalf("an edit of limits alone changed the key's records: %q, %q", keys["0"], stateKeys("f:", "k", dps[1]))
		}
		// When each window's record, if full, expires: one compact before
		// then was rewritten from it, not written afresh.
		fullUntil := make([]time.Time, len(p.Windows))
		for step := range 300 {
			switch r := rng.IntN(10); {
			case r < 4:
			case r < 8:
				now = now.Add(time.Duration(rng.Int64N(3*pls[0].windows[0].gran+1)) * time.Microsecond)
			default:
				now = now.Add(time.Duration(rng.Int64N(pls[0].windows[len(pls[0].windows)-1].period+1)) * time.Microsecond)
			}
			m.SetTime(now)
			e := 0
			if rng.IntN(4) == 0 {
				e = 1
			}
			pl, dp := pls[e], dps[e]
			in := input{lease: noLease, peek: rng.IntN(20) == 0}
			if rng.IntN(8) == 0 {
				n := 1 + rng.Int64N(pl.windows[0].limit)
				in.lease = leaseAsk{want: n, need: n, life: 1 + rng.Int64N(1_000_000)}
			}
			if dp != pl && in.lease == noLease && rng.IntN(6) == 0 {
				in.block = &blockAsk{max: 2 + rng.Int64N(300), replicas: 1 + rng.Int64N(3), rtt: rng.Int64N(3000)}
			}
			if rng.IntN(30) == 0 {
				in.extra = rng.Int64N(5)
				in.add = make([]int64, len(pl.windows))
				for i := range in.add {
					in.add[i] = rng.Int64N(3)
				}
			}
			nums := scriptNums(pl, in)
			if in.block != nil {
				shortenBlock(rng, nums)
			}
			var got [2]verdict
			for j, arg := range []string{"0", "c"} {
				rs, err := evalBatchArg(context.Background(), rdb, []decision{{keys: keys[arg], pl: dp, nums: nums}}, arg)
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
				rec, err := rdb.Get(context.Background(), keys["c"][1+i]).Result()
				if err != nil {
					continue // none yet, or expired
				}
				switch {
				case rec[0] == compactVersion:
					e, hasCap, ok := compactShape(int64(len(rec)))
					if !ok || int64(len(rec)) > 1+ringSize(w.n)+leaseCapBytes {
						t.Fatalf("%s: window %d's compact record has %d bytes", where, i, len(rec))
					}
					if hasCap {
						capped++
					}
					compact++
					entries = max(entries, int(e))
					if now.Before(fullUntil[i]) {
						shrunk++
					}
					fullUntil[i] = time.Time{}
				case rec[0] == formatVersion:
					grown++
					ttl, err := rdb.PTTL(context.Background(), keys["c"][1+i]).Result()
					if err != nil {
						t.Fatal(err)
					}
					fullUntil[i] = now.Add(ttl)
				default:
					t.Fatalf("%s: window %d's record has version %d", where, i, rec[0])
				}
			}
		}
	}
	t.Logf("records seen compact %d times (at most %d entries, %d with a cap), full %d times, back to compact from full %d times", compact, entries, capped, grown, shrunk)
	if compact == 0 || capped == 0 || grown == 0 || shrunk == 0 || entries < 2 {
		t.Fatalf("the traffic reached too little: compact %d, capped %d, full %d, shrunk %d, most entries %d", compact, capped, grown, shrunk, entries)
	}
}

// compactShape reads a compact record's size: its entries and whether a lease
// cap follows them; ok is false for a size that is neither.
func compactShape(size int64) (entries int64, hasCap, ok bool) {
	e := size - 1 - ringHeader
	if e%compactEntryBytes == leaseCapBytes {
		e, hasCap = e-leaseCapBytes, true
	}
	return e / compactEntryBytes, hasCap, e >= 0 && e%compactEntryBytes == 0 && e/compactEntryBytes <= compactMaxEntries
}
