package ratelimit

// Plan cache: a compiled plan is reused only for a policy equal, field by
// field, to the one it was compiled from (samePolicy); a hash only finds
// candidates, so a collision costs a comparison, never a wrong plan. Every
// plan get returns is in plans, so that recent sees every plan in use.

import (
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// planCache maps policies to compiled plans. front, read with one atomic
// load, spares requests the map's RWMutex, whose readers all write one cache
// line. front is written only under mu (a read lock fills a slot; only a
// writer clears), so it never holds a plan the map has dropped.
type planCache struct {
	seed  maphash.Seed
	front *[planFront]atomic.Pointer[plan]
	mu    sync.RWMutex
	plans map[uint64][]*plan
	n     int
}

// planFront is front's size, far above a deployment's plans (others share).
const planFront = 256

// fallbackSize bounds the keys whose last shared verdict the fallback keeps.
const fallbackSize = 1 << 17

// maxPlans bounds the plan cache; past it the cache starts over.
const maxPlans = 4096

func newPlanCache() planCache {
	return planCache{seed: maphash.MakeSeed(), front: new([planFront]atomic.Pointer[plan]), plans: make(map[uint64][]*plan)}
}

// get returns p's plan, compiling it in add so that get's frame stays
// small: every request calls it deep in the handler chain, and overflowing
// the goroutine's stack costs a copy whenever the collector has shrunk it.
func (c *planCache) get(p *Policy, o *Options, met *metrics) (*plan, error) {
	h := hashPolicy(c.seed, p)
	slot := &c.front[h%planFront]
	if pl := slot.Load(); pl != nil && samePolicy(&pl.given, p) {
		return pl, nil
	}
	c.mu.RLock()
	for _, pl := range c.plans[h] {
		if samePolicy(&pl.given, p) {
			slot.Store(pl)
			c.mu.RUnlock()
			return pl, nil
		}
	}
	c.mu.RUnlock()
	return c.add(h, p, o, met)
}

func (c *planCache) add(h uint64, p *Policy, o *Options, met *metrics) (*plan, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	pl := compile(*p, o.Buckets, o.StrikeBuckets)
	pl.split()
	pl.given = p.clone()
	pl.counters = met.forPlan(p.Name, p.Shadow)
	slot := &c.front[h%planFront]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= maxPlans {
		clear(c.plans)
		for i := range c.front {
			c.front[i].Store(nil)
		}
		c.n = 0
	}
	for _, q := range c.plans[h] {
		if samePolicy(&q.given, p) {
			slot.Store(q)
			return q, nil
		}
	}
	c.plans[h] = append(c.plans[h], pl)
	c.n++
	slot.Store(pl)
	return pl, nil
}

// recent returns the plans decided under within registryRecent of now.
func (c *planCache) recent(now time.Time) []*plan {
	since := now.Add(-registryRecent).Unix()
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []*plan
	for _, pls := range c.plans {
		for _, pl := range pls {
			if pl.used.Load() >= since {
				out = append(out, pl)
			}
		}
	}
	return out
}

// hashPolicy runs on every decision, so it folds in each number with one
// multiplication, not maphash.Hash's call and copy per number.
func hashPolicy(seed maphash.Seed, p *Policy) uint64 {
	h := maphash.String(seed, p.Name)
	for _, w := range p.Windows {
		h = mixHash(h, uint64(w.Limit))
		h = mixHash(h, uint64(w.Period))
	}
	b := p.Ban
	for _, v := range [...]uint64{uint64(b.Threshold), uint64(b.StrikeWindow), uint64(b.Base), math.Float64bits(b.Multiplier), uint64(b.Max), uint64(b.Memory)} {
		h = mixHash(h, v)
	}
	if p.Shadow {
		h = mixHash(h, 1)
	}
	for _, w := range p.Candidate {
		h = mixHash(h, uint64(-w.Limit))
		h = mixHash(h, uint64(w.Period))
	}
	return h
}

// mixHash folds v into h: the two halves of the 128-bit product of h^v
// and an odd constant, xored (as wyhash mixes).
func mixHash(h, v uint64) uint64 {
	hi, lo := bits.Mul64(h^v, 0x9e3779b97f4a7c15)
	return hi ^ lo
}

func samePolicy(a, b *Policy) bool {
	if a.Name != b.Name || a.Ban != b.Ban || a.CandidateBan != b.CandidateBan || a.Shadow != b.Shadow || len(a.Windows) != len(b.Windows) ||
		!slices.Equal(a.Candidate, b.Candidate) {
		return false
	}
	for i := range a.Windows {
		if a.Windows[i] != b.Windows[i] {
			return false
		}
	}
	return true
}
