package ratelimit

import (
	"encoding/binary"
	"math"
	"strconv"
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
	// packed, mult and cmult are the script arguments (script.go).
	packed, mult, cmult string
	// argv is the three boxed once.
	argv [3]any

	buckets, strikeBuckets int

	// local is the fallback plan for a live replica count (fallback.go).
	local atomic.Pointer[localPlan]
	// seed is where windows take their past after a period edit (registry.go).
	seed atomic.Pointer[seedCache]
	// used is when a decision was last made under the plan (Unix s).
	used atomic.Int64

	// nShort counts the short windows, the first ones: buckets shorter than
	// blockLife, so a block counts in their coarse records (blocks.go). 0 on
	// a plan taking no blocks (long windows only, or candidates).
	nShort int
	// allShort: every window is short (and no candidates).
	allShort bool

	// coarse are the short windows' coarse records ({KEY}:b:NAME, after the
	// other records), only on blk: the plan with the same windows, names and
	// counters that also reads and writes them (blocks.go).
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

	// Script arguments in script.go's order, numbers packed 8 bytes each.
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
