package ratelimit

// Rejection cache: a key Redis found limited or banned is answered here only
// under the plan that decided it and until the verdict could first change:
// its RetryAfter, and for a ban at most banRevalidate, in case an Unban
// announcement was missed.

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// rejectCache spares a flood from a rejected key a round trip per request.
// A limited key cannot be admitted before its RetryAfter: every replica sees
// the same counts, which only fall with time. Its rejections are strikes,
// sent when they could cross the ban threshold, or every flushEvery or
// flushInterval.
type rejectCache struct {
	seed          maphash.Seed
	shards        [memShards]cacheShard
	maxPerShard   int
	flushEvery    int64         // 64
	flushInterval time.Duration // 250ms
}

// banRevalidate is how often a cached ban is checked with Redis again.
const banRevalidate = 2 * time.Second

type cacheShard struct {
	mu   sync.Mutex
	keys map[string]*cacheEntry
	// n is len(keys), read without mu so that an empty shard takes no lock;
	// a concurrent store is missed no more than one just after unlocking.
	n atomic.Int32
}

// counted publishes the shard's size; the caller holds mu.
func (sh *cacheShard) counted() { sh.n.Store(int32(len(sh.keys))) }

type cacheEntry struct {
	pl       *plan
	until    time.Time // answer locally until then
	end      time.Time // when the rejection ends (RetryAfter's origin)
	decision Decision
	known    int64 // strikes Redis reported at the last round trip
	pending  int64 // rejections answered here since
	synced   time.Time
	flushing bool
}

func newRejectCache(size int) *rejectCache {
	c := &rejectCache{
		seed:          maphash.MakeSeed(),
		maxPerShard:   max(size/memShards, 1),
		flushEvery:    64,
		flushInterval: 250 * time.Millisecond,
	}
	for i := range c.shards {
		c.shards[i].keys = make(map[string]*cacheEntry)
	}
	return c
}

func (c *rejectCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%memShards]
}

// answer puts a cached decision for key in d (hit), or returns the
// rejections answered here that the caller's round trip must carry.
func (c *rejectCache) answer(key string, pl *plan, now time.Time, d *Decision) (pending int64, hit bool) {
	sh := c.shard(key)
	if sh.n.Load() == 0 {
		return 0, false
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		return 0, false
	}
	if e.pl != pl || !now.Before(e.until) {
		delete(sh.keys, key)
		sh.counted()
		return e.pending, false
	}
	if e.decision.Outcome == Limited && pl.ban.on && !e.flushing {
		due := e.known+e.pending+1 > pl.ban.strikes.limit ||
			e.pending+1 >= c.flushEvery ||
			now.Sub(e.synced) >= c.flushInterval
		if due {
			e.flushing = true
			pending, e.pending = e.pending, 0
			return pending, false
		}
	}
	if e.decision.Outcome == Limited && pl.ban.on {
		e.pending++
	}
	*d = e.decision
	d.Windows = append([]WindowState(nil), e.decision.Windows...)
	d.RetryAfter = e.end.Sub(now)
	d.Cached = true
	d.Time = now
	return 0, true
}

// store caches a rejection from a round trip begun at start, or clears key.
func (c *rejectCache) store(key string, pl *plan, d *Decision, strikes int64, start time.Time) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if d.Outcome == Allowed || d.Degraded || d.RetryAfter <= 0 {
		if e != nil {
			delete(sh.keys, key)
			sh.counted()
		}
		return
	}
	if e == nil {
		if len(sh.keys) >= c.maxPerShard {
			return
		}
		e = &cacheEntry{}
		sh.keys[key] = e
		sh.counted()
	}
	pending := e.pending
	if e.pl != pl {
		pending = 0
	}
	// From the round trip's start, before Redis read its clock: never too late.
	end := start.Add(d.RetryAfter)
	until := end
	if d.Outcome == Banned {
		until = minTime(end, start.Add(banRevalidate))
	}
	*e = cacheEntry{pl: pl, until: until, end: end, decision: *d, known: strikes, pending: pending, synced: start}
}

// abandon clears a flush in progress that failed.
func (c *rejectCache) abandon(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		e.flushing = false
	}
}

func (c *rejectCache) forget(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.keys, key)
	sh.counted()
	sh.mu.Unlock()
}

func (c *rejectCache) sweep(now time.Time) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			if !now.Before(e.until) {
				delete(sh.keys, k)
			}
		}
		sh.counted()
		sh.mu.Unlock()
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
