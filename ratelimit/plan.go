package ratelimit

// Plans and their cache: a policy compiles once to a plan, the windows and
// numbers every layer below reads. A compiled plan is reused only for a
// policy equal, field by field, to the one it was compiled from (samePolicy);
// a hash only finds candidates, so a collision costs a comparison, never a
// wrong plan. Every plan get returns is in plans, so that recent sees every
// plan in use.

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ring is a window as n+1 buckets of gran µs, all an interval of length
// period touches. Its geometry, and so its record (format.go), never depends
// on the limit: a limit can change without touching the counts.
type ring struct {
	limit  int64 // events admitted in any interval of length period
	period int64 // µs
	gran   int64 // µs per bucket
	n      int64 // period spans at most n+1 buckets
	unit   int64 // µs per unit of a bucket's last-event offset
	ttlMS  int64 // how long the ring's record is worth keeping after a write
	name   string
}

// newRing derives a ring's geometry; the script gets it as arguments.
func newRing(limit int64, period time.Duration, buckets int) ring {
	p := period.Microseconds()
	g := max(p/int64(buckets), 1)
	n := (p + g - 1) / g
	r := ring{limit: limit, period: p, gran: g, n: n, unit: (g + maxOffset - 1) / maxOffset}
	// A record is needed until its newest bucket slides out, a period and a
	// bucket after it began. The script counts the TTL from the end of the
	// head's epoch (lua/ring.lua), so one more bucket covers a lease's end.
	r.ttlMS = (p+2*g+999)/1000 + 1
	// The name is in the record's key: two geometries never share a record.
	r.name = strconv.FormatInt(p, 10) + ":" + strconv.FormatInt(g, 10)
	return r
}

// plan is a Policy compiled: ring geometry, script arguments and metrics.
type plan struct {
	name    string
	given   Policy // as the caller passed it
	policy  Policy // windows sorted by period
	windows []ring
	// candidates (Policy.Candidate) never refuse; stored as {KEY}:c:NAME.
	candidates []ring
	// ban is Policy.Ban's rule, cban Policy.CandidateBan's ({KEY}:cban).
	ban, cban banRule
	// packed, mult and cmult are the script arguments (redisdecider.go).
	packed, mult, cmult string
	// argv is the three boxed once.
	argv [3]any

	buckets, strikeBuckets int

	// local is the fallback plan for a live replica count (degraded.go).
	local atomic.Pointer[localPlan]
	// seed is where windows take their past after a period edit (registry.go).
	seed atomic.Pointer[seedCache]
	// used is when a decision was last made under the plan (Unix s).
	used atomic.Int64

	// nShort counts the short windows, the first ones: buckets shorter than
	// blockLife, so a block counts in their coarse records (lease.go). 0 on
	// a plan taking no blocks (long windows only, or candidates).
	nShort int
	// allShort: every window is short (and no candidates).
	allShort bool

	// coarse are the short windows' coarse records ({KEY}:b:NAME, after the
	// other records), only on blk: the plan with the same windows, names and
	// counters that also reads and writes them (lease.go).
	coarse []ring
	blk    *plan
	// backRings are, on blk, the records a block counts in (giveBack).
	backRings []ring

	counters
}

// compile builds the plan for p, which must be valid.
func compile(p Policy, buckets, strikeBuckets int) *plan {
	p = p.Sorted()
	pl := &plan{name: p.Name, policy: p, buckets: buckets, strikeBuckets: strikeBuckets}
	for _, w := range p.Windows {
		pl.windows = append(pl.windows, newRing(w.Limit, w.Period, buckets))
	}
	for _, w := range p.Candidate {
		pl.candidates = append(pl.candidates, newRing(w.Limit, w.Period, CandidateBuckets))
	}
	pl.ban = newBanRule(p.Ban, strikeBuckets)
	pl.cban = newBanRule(p.CandidateBan, strikeBuckets)

	// Script arguments in redisdecider.go's order, numbers packed 8 bytes each.
	nums := []int64{int64(len(pl.windows))}
	for _, r := range pl.windows {
		nums = append(nums, r.limit, r.period, r.gran, r.n, r.unit, r.ttlMS)
	}
	nums = pl.ban.appendNums(nums)
	nums = append(nums, int64(len(pl.candidates)))
	for _, r := range pl.candidates {
		nums = append(nums, r.limit, r.period, r.gran, r.n, r.unit, r.ttlMS)
	}
	nums = pl.cban.appendNums(nums)
	pl.packed = packNums(nums)
	pl.mult = strconv.FormatFloat(pl.ban.mult, 'g', -1, 64)
	pl.cmult = strconv.FormatFloat(pl.cban.mult, 'g', -1, 64)
	pl.argv = [3]any{pl.packed, pl.mult, pl.cmult}
	return pl
}

func (pl *plan) shortWindows() int { return pl.nShort }

// split sets nShort and blk when pl has short windows and no candidates.
// Coarse records are read whenever they may count blocks, this plan's or
// another plan's of the same periods the key is also decided under.
func (pl *plan) split() {
	s := 0
	for s < len(pl.windows) && pl.windows[s].gran < blockLife.Microseconds() {
		s++
	}
	if len(pl.candidates) > 0 || s == 0 {
		return
	}
	pl.nShort, pl.allShort = s, s == len(pl.windows)
	pl.blk = pl.withBlocks(s)
}

// banRule is a BanPolicy compiled: strikes as a ring limited at the threshold.
type banRule struct {
	on      bool
	strikes ring
	base    int64   // µs
	mult    float64 // at least 1
	max     int64   // µs, 0: no cap
	memory  int64   // µs
}

func newBanRule(b BanPolicy, strikeBuckets int) banRule {
	if !b.Enabled() {
		return banRule{mult: 1}
	}
	return banRule{
		on:      true,
		strikes: newRing(b.Threshold, b.StrikeWindow, strikeBuckets),
		base:    b.Base.Microseconds(),
		mult:    max(b.Multiplier, 1),
		max:     b.Max.Microseconds(),
		memory:  b.Memory.Microseconds(),
	}
}

// appendNums appends the rule's script numbers; threshold 0 means no bans.
func (b *banRule) appendNums(nums []int64) []int64 {
	if !b.on {
		return append(nums, 0)
	}
	s := &b.strikes
	return append(nums, s.limit, s.period, s.gran, s.n, s.unit, s.ttlMS, b.memory, b.base, b.max)
}

func (pl *plan) touch(now time.Time) {
	if s := now.Unix(); pl.used.Load() != s {
		pl.used.Store(s)
	}
}

// length returns the n-th offence's ban (µs) exactly as the script does:
// Base*Multiplier^(n-1), capped at Max (when set) and maxBanMicro.
func (b *banRule) length(n int64) int64 {
	d := float64(b.base)
	limit := float64(maxBanMicro)
	if b.max > 0 {
		limit = float64(b.max)
	}
	for i := int64(1); i < n && d < limit && b.mult > 1; i++ {
		d *= b.mult
	}
	if d > limit {
		d = limit
	}
	return max(int64(math.Floor(d)), 1)
}

// keyCount is how many records stateKeys names for a key under pl.
func (pl *plan) keyCount() int {
	n := 1 + len(pl.windows) + len(pl.candidates) + len(pl.coarse)
	if pl.cban.on {
		n++
	}
	return n
}

func packNums(nums []int64) string {
	b := make([]byte, 0, 8*len(nums))
	for _, v := range nums {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return string(b)
}

// Defaults for the ring geometry.
const (
	// DefaultBuckets is the number of buckets a window is split into.
	DefaultBuckets = 200
	// DefaultStrikeBuckets is the number of buckets of the strike window.
	DefaultStrikeBuckets = 20
	// CandidateBuckets is the number of buckets of a candidate window:
	// coarser (it never refuses, and its record stays small), as strict.
	CandidateBuckets = 20
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

// blockRing returns short window w's coarse record: buckets of blockLife
// (one if shorter), plus one for a head a bucket ahead (blockWrite).
func blockRing(w ring) ring {
	r := newRing(w.limit, time.Duration(w.period)*time.Microsecond, int(max(w.period/blockLife.Microseconds(), 1)))
	r.n++
	// Kept a bucket longer too (newRing's ttlMS).
	r.ttlMS = (r.period+3*r.gran+999)/1000 + 1
	return r
}

// withBlocks returns pl compiled again with coarse records for its s short
// windows, for a call's keys and numbers only: it has no counters and no
// blk of its own.
func (pl *plan) withBlocks(s int) *plan {
	b := compile(pl.policy, pl.buckets, pl.strikeBuckets)
	b.nShort, b.allShort = pl.nShort, pl.allShort
	b.coarse = make([]ring, s)
	nums := []int64{int64(s)}
	for i := range s {
		r := blockRing(pl.windows[i])
		b.coarse[i] = r
		nums = append(nums, int64(i+1), r.period, r.gran, r.n, r.unit, r.ttlMS)
	}
	b.packed = pl.packed + packNums(nums)
	b.argv = [3]any{b.packed, b.mult, b.cmult}
	b.backRings = append(append([]ring(nil), b.coarse...), pl.windows[s:]...)
	return b
}
