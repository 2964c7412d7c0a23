package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// TestRejectCacheAnswersWhatItHolds drives the rejection cache with
// generated stores, answers, forgets and sweeps over a few keys, against a
// model of what it holds, and checks that it answers every key holding an
// unexpired rejection from the cache, and none other, whether or not the
// key's shard is empty: answer skips the shard's lock while it is, which
// is only sound if the shard's published size is always right.
func TestRejectCacheAnswersWhatItHolds(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 41)
	pl := compile(perMinute(10), DefaultBuckets, DefaultStrikeBuckets)
	c := newRejectCache(1 << 20)
	c.flushEvery, c.flushInterval = 1<<30, time.Hour // no round trip is forced
	until := map[string]time.Time{}                  // the model: keys held, until when
	now := time.Unix(1_900_000_000, 0)
	for step := range 20_000 {
		key := fmt.Sprint("k", rng.IntN(96))
		switch r := rng.IntN(10); {
		case r < 3:
			retry := time.Duration(1+rng.IntN(3000)) * time.Millisecond
			c.store(key, pl, &Decision{Outcome: Limited, RetryAfter: retry}, 0, now)
			until[key] = now.Add(retry)
		case r < 4:
			c.store(key, pl, &Decision{Outcome: Allowed}, 0, now)
			delete(until, key)
		case r < 5:
			c.forget(key)
			delete(until, key)
		case r < 6:
			c.sweep(now)
			for k, u := range until {
				if !now.Before(u) {
					delete(until, k)
				}
			}
		case r < 8:
			now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		default:
			var d Decision
			_, hit := c.answer(key, pl, now, &d)
			u, held := until[key]
			if want := held && now.Before(u); hit != want {
				t.Fatalf("step %d: answer(%s) hit %v, want %v", step, key, hit, want)
			}
			if held && !now.Before(u) {
				delete(until, key) // answer drops an expired entry
			}
		}
		for i := range c.shards {
			sh := &c.shards[i]
			if n := int(sh.n.Load()); n != len(sh.keys) {
				t.Fatalf("step %d: shard %d publishes %d entries and holds %d", step, i, n, len(sh.keys))
			}
		}
	}
}
