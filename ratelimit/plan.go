package ratelimit

import (
	"encoding/binary"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// ring describes one sliding window as a ring of buckets: a window of
// period W is split into buckets of gran µs, and an interval of length W
// touches at most n+1 consecutive buckets, which the ring holds. The
// geometry depends only on the period and the bucket count, never on the
// limit: the record a ring is stored in (format.go) is the same whatever
// the limit, so a limit can change without touching the counts.
type ring struct {
	limit  int64 // events admitted in any interval of length period
	period int64 // µs
	gran   int64 // µs per bucket
	n      int64 // period spans at most n+1 buckets
	unit   int64 // µs per unit of a bucket's last-event offset
	ttlMS  int64 // how long the ring's record is worth keeping after a write
	name   string
}

// newRing derives a ring's geometry from its period and bucket count; the
// script reads the same numbers from its arguments.
func newRing(limit int64, period time.Duration, buckets int) ring {
	p := period.Microseconds()
	g := max(p/int64(buckets), 1)
	n := (p + g - 1) / g
	r := ring{limit: limit, period: p, gran: g, n: n, unit: (g + maxOffset - 1) / maxOffset}
	// The record is needed until its newest bucket has slid out: at most
	// a period and a bucket after it began. The script sets its expiry
	// to this TTL after the end of the head's epoch (lua/ring.lua, expiry),
	// so one bucket more covers an event recorded at a lease's end.
	r.ttlMS = (p+2*g+999)/1000 + 1
	// The name identifies the geometry; it is part of the Redis key of a
	// window's record, so two geometries never share a record.
	r.name = strconv.FormatInt(p, 10) + ":" + strconv.FormatInt(g, 10)
	return r
}

// plan is a Policy compiled for evaluation: ring geometry, the static
// script arguments and the policy's metric handles. Plans are cached by
// policy.
type plan struct {
	name    string
	given   Policy // as the caller passed it
	policy  Policy // windows sorted by period
	windows []ring
	// candidates are the policy's candidate windows (Policy.Candidate),
	// stored as {KEY}:c:NAME and never refusing.
	candidates []ring
	// ban is the policy's ban rule (Policy.Ban) and cban its candidate
	// windows' (Policy.CandidateBan, stored as {KEY}:cban).
	ban, cban banRule
	// packed, mult and cmult are the plan's script arguments (script.go):
	// its numbers, 8 bytes each, and its ban rules' multipliers.
	packed, mult, cmult string
	// argv is the three as a call's arguments, boxed once.
	argv [3]any

	buckets, strikeBuckets int

	// local is the plan one replica enforces alone while the shared store
	// is unreachable, for the live replica count it was made for
	// (fallback.go).
	local atomic.Pointer[localPlan]
	// seed is where windows take their past from after a period change,
	// for the registry view it was made for (registry.go).
	seed atomic.Pointer[seedCache]
	// used is when a decision was last made under the plan (Unix s).
	used atomic.Int64

	// nShort is how many of the plan's windows are short, the first ones:
	// those whose buckets last less than blockLife, which a block counts
	// in their coarse records (blocks.go). 0 on a plan that takes no
	// blocks: one of long windows alone, or with candidates.
	nShort int
	// allShort: every window is short (and no candidates).
	allShort bool

	// coarse are the coarse records of the plan's short windows, in their
	// order (blockRing), on the plan that counts blocks (blk): stored as
	// {KEY}:b:NAME after the plan's other records, and nil on every other
	// plan. blk is the plan with them, for a plan with short windows (and
	// no candidate windows): the same windows, names and counters, with
	// the coarse records read and written beside the short windows' own
	// (blocks.go).
	coarse []ring
	blk    *plan
	// backRings are, on blk, the records a block is counted in: the
	// coarse ones, then the long windows' (giveBack).
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

	// Static script arguments; see script.go for their order. The numbers
	// travel packed, 8 bytes each.
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

// shortWindows returns how many of pl's windows are short (nShort).
func (pl *plan) shortWindows() int { return pl.nShort }

// split sets pl's short windows and the plan with their coarse records
// (blk), when it has short windows and no candidates: the windows whose
// buckets are shorter than blockLife, the first ones. Their coarse
// records are read whenever they may count blocks, the plan's own or
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

// banRule is a BanPolicy compiled: its strike window as a ring whose
// limit is the threshold, and its lengths in µs.
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

// appendNums appends the rule's script numbers: its threshold (0: no
// bans) and, with bans, the strike window's period, bucket width, n,
// offset unit and TTL, the offence memory, the ban's base and max.
func (b *banRule) appendNums(nums []int64) []int64 {
	if !b.on {
		return append(nums, 0)
	}
	s := &b.strikes
	return append(nums, s.limit, s.period, s.gran, s.n, s.unit, s.ttlMS, b.memory, b.base, b.max)
}

// touch notes a decision under pl at now.
func (pl *plan) touch(now time.Time) {
	if s := now.Unix(); pl.used.Load() != s {
		pl.used.Store(s)
	}
}

// length returns the length (µs) of the ban for the n-th offence,
// computed exactly as the script does: Base*Multiplier^(n-1), capped at
// Max (when set) and at maxBanMicro.
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

// keyCount is the number of records stateKeys names for a key under pl.
func (pl *plan) keyCount() int {
	n := 1 + len(pl.windows) + len(pl.candidates) + len(pl.coarse)
	if pl.cban.on {
		n++
	}
	return n
}

// packNums packs non-negative integers as 8-byte big-endian ones.
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
	// coarser than an enforced one (a candidate never refuses, and its
	// record stays small), and as strict.
	CandidateBuckets = 20
)
