package ratelimit

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Sizes of the fields of the packed state (see script.go for the layout).
const (
	headBytes   = 6 // bucket index of a ring's newest bucket
	offsetBytes = 3 // a bucket's last event, as an offset from the bucket's start
	timeBytes   = 7 // an absolute time in microseconds
	strikeBytes = 4 // a strike bucket's count
	offenceCap  = 1<<16 - 1
	// offsetsUpTo: windows whose limit is at most this many times their
	// bucket count keep each bucket's last-event time. With few requests
	// per bucket it lets a bucket leave the window as soon as its last
	// request has; with many it gains next to nothing, and the bytes are
	// better spent on more buckets.
	offsetsUpTo = 1
	layoutBytes = 8
	flagBytes   = 1 // after the layout: 1 when the key's ban state may exist
	maxOffset   = 1<<(8*offsetBytes) - 1
	maxBanMicro = int64(1) << 50 // ~35 years: keeps ban ends inside timeBytes
)

// ring describes one sliding window as a ring of buckets: a window of
// period W is split into buckets of gran µs, and an interval of length W
// touches at most n+1 consecutive buckets, which the ring holds.
type ring struct {
	limit  int64 // events admitted in any interval of length period
	period int64 // µs
	gran   int64 // µs per bucket
	n      int64 // period spans at most n+1 buckets
	width  int64 // bytes per bucket count
	obytes int64 // bytes of a bucket's last-event offset: offsetBytes, or 0 to keep none
	unit   int64 // µs per unit of a bucket's last-event offset
	cap    int64 // largest count a bucket or the total can hold
}

// newRing derives a ring's geometry from its limit, period and bucket
// count; the script derives it the same way from the same three numbers.
// Strike rings have fixed-width counts and always keep offsets.
func newRing(limit int64, period time.Duration, buckets int, strikes bool) ring {
	p := period.Microseconds()
	g := p / int64(buckets)
	if g < 1 {
		g = 1
	}
	r := ring{limit: limit, period: p, gran: g, n: (p + g - 1) / g, width: countWidth(limit)}
	if strikes {
		r.width = strikeBytes
	}
	if strikes || limit <= offsetsUpTo*int64(buckets) {
		r.obytes = offsetBytes
	}
	r.unit = (g + maxOffset - 1) / maxOffset
	r.cap = 1<<(8*r.width) - 1
	return r
}

// countWidth is the number of bytes a bucket needs to count up to limit
// events: no bucket ever holds more than limit admissions, because all of
// them fall in an interval shorter than the window.
func countWidth(limit int64) int64 {
	w := int64(1)
	for w < headBytes && limit > 1<<(8*w)-1 {
		w++
	}
	return w
}

// size is the number of bytes of the ring's packed segment.
func (r ring) size() int64 { return headBytes + r.width + (r.n+1)*(r.width+r.obytes) }

// plan is a Policy compiled for evaluation: ring geometry, the static
// script arguments and the policy's metric handles. Plans are cached by
// name and fingerprint.
type plan struct {
	name    string
	given   Policy // as the caller passed it
	policy  Policy // windows sorted by period
	windows []ring
	ban     bool
	strikes ring    // limit is the ban threshold
	banBase int64   // µs
	banMult float64 // at least 1
	banMax  int64   // µs, 0: no cap
	memory  int64   // µs
	layout  string  // identifies the windows' packed layout
	slayout string  // identifies the strike ring's packed layout
	argv    []any   // script arguments after the per-call ones
	stateMS int64   // TTL of the window state after an admission, ms

	// local is the plan enforced by one replica alone while the shared
	// store is unreachable: each limit divided by the replica count.
	local *plan

	counters
}

// compile builds the plan for p, which must be valid. replicas > 1 also
// builds the plan for local fallback.
func compile(p Policy, buckets, strikeBuckets int, replicas int) *plan {
	pl := compileOne(p, buckets, strikeBuckets)
	pl.local = pl
	if replicas > 1 {
		lp := p.Sorted()
		for i, w := range lp.Windows {
			lp.Windows[i].Limit = (w.Limit + int64(replicas) - 1) / int64(replicas)
		}
		pl.local = compileOne(lp, buckets, strikeBuckets)
	}
	return pl
}

func compileOne(p Policy, buckets, strikeBuckets int) *plan {
	p = p.Sorted()
	pl := &plan{name: p.Name, policy: p}
	var desc strings.Builder
	for _, w := range p.Windows {
		r := newRing(w.Limit, w.Period, buckets, false)
		pl.windows = append(pl.windows, r)
		fmt.Fprintf(&desc, "%d/%d/%d/%d/%d/%d;", r.period, r.gran, r.n, r.width, r.obytes, r.unit)
	}
	pl.layout = digest("v3;" + desc.String())
	// Window state is needed until the last admission has slid out of the
	// longest window (at most its period plus a bucket later). The script
	// refreshes the TTL only when that window's bucket changes, so the TTL
	// holds one bucket more.
	longest := pl.windows[len(pl.windows)-1]
	pl.stateMS = (longest.period+2*longest.gran)/1000 + 2

	b := p.Ban
	pl.ban = b.Enabled()
	if pl.ban {
		pl.strikes = newRing(b.Threshold, b.StrikeWindow, strikeBuckets, true)
		pl.memory = b.Memory.Microseconds()
		pl.banBase, pl.banMult, pl.banMax = b.Base.Microseconds(), max(b.Multiplier, 1), b.Max.Microseconds()
		s := pl.strikes
		pl.slayout = digest(fmt.Sprintf("s%d/%d/%d/%d", s.period, s.gran, s.n, s.unit))
	} else {
		pl.slayout = digest("none")
	}

	// Static script arguments; see script.go for their order. The numbers
	// travel packed (8 bytes each) with the format that reads them; so do
	// the ban's, read only when a key has ban state.
	size := int64(layoutBytes + flagBytes)
	hfmt := ">"
	for _, r := range pl.windows {
		size += headBytes + 2*r.width + r.obytes
		hfmt += fmt.Sprintf("I%dI%dI%d", headBytes, r.width, r.width)
		if r.obytes > 0 {
			hfmt += fmt.Sprintf("I%d", r.obytes)
		}
	}
	nums := []int64{int64(len(pl.windows)), 0, pl.stateMS, 0}
	hp := int64(layoutBytes + flagBytes + 1)
	for _, r := range pl.windows {
		nums = append(nums, r.limit, r.period, r.gran, r.n, r.width, r.obytes, r.unit, hp, size+1)
		hp += headBytes + 2*r.width + r.obytes
		size += (r.n + 1) * (r.width + r.obytes)
	}
	nums[1] = size
	mult := "1"
	var banNums []int64
	if pl.ban {
		s := pl.strikes
		nums[3] = s.limit
		banNums = []int64{s.period, s.gran, s.n, s.unit, pl.memory, pl.banBase, pl.banMax}
		mult = strconv.FormatFloat(pl.banMult, 'g', -1, 64)
	}
	rfmt := ">" + strings.Repeat("i8", replyFields+3*len(pl.windows))
	pl.argv = []any{pl.layout, packFormat(nums), packNums(nums), hfmt, pl.slayout, mult, rfmt, packFormat(banNums), packNums(banNums)}
	return pl
}

// banLength returns the length (µs) of the ban for the n-th offence,
// computed exactly as the script does: Base*Multiplier^(n-1), capped at
// Max (when set) and at maxBanMicro.
func (pl *plan) banLength(n int64) int64 {
	d := float64(pl.banBase)
	limit := float64(maxBanMicro)
	if pl.banMax > 0 {
		limit = float64(pl.banMax)
	}
	for i := int64(1); i < n && d < limit && pl.banMult > 1; i++ {
		d *= pl.banMult
	}
	if d > limit {
		d = limit
	}
	return max(int64(math.Floor(d)), 1)
}

// packFormat is the struct format that reads nums packed by packNums.
func packFormat(nums []int64) string { return ">" + strings.Repeat("I8", len(nums)) }

// packNums packs non-negative integers as 8-byte big-endian ones.
func packNums(nums []int64) string {
	b := make([]byte, 0, 8*len(nums))
	for _, v := range nums {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return string(b)
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:layoutBytes/2])
}

// Granularity returns the bucket width the limiter uses for a window of
// period d with the given number of buckets: the precision with which
// requests slide out of the window.
func Granularity(d time.Duration, buckets int) time.Duration {
	if buckets <= 0 {
		buckets = DefaultBuckets
	}
	return time.Duration(newRing(1, d, buckets, false).gran) * time.Microsecond
}

// Defaults for the ring geometry.
const (
	// DefaultBuckets is the number of buckets a window is split into.
	DefaultBuckets = 200
	// DefaultStrikeBuckets is the number of buckets of the strike window.
	DefaultStrikeBuckets = 20
)
