package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	maxOffset   = 1<<(8*offsetBytes) - 1
	maxBanMicro = int64(1) << 50 // ~35 years: keeps ban ends inside timeBytes
	// maxBanSteps bounds the table of ban lengths passed to the script;
	// further offences get the last length.
	maxBanSteps = 32
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

func newRing(limit int64, period time.Duration, buckets int, width int64, offsets bool) ring {
	p := period.Microseconds()
	g := p / int64(buckets)
	if g < 1 {
		g = 1
	}
	r := ring{limit: limit, period: p, gran: g, n: (p + g - 1) / g, width: width}
	if offsets {
		r.obytes = offsetBytes
	}
	r.unit = (g + maxOffset - 1) / maxOffset
	r.cap = 1<<(8*width) - 1
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
	id      string
	name    string
	given   Policy // as the caller passed it
	policy  Policy // windows sorted by period
	windows []ring
	ban     bool
	strikes ring    // limit is the ban threshold
	banDurs []int64 // µs, for offences 1..len, the last repeating
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

func planID(p Policy) string { return p.Name + "\x00" + p.Fingerprint() }

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
	pl := &plan{id: planID(p), name: p.Name, policy: p}
	var desc strings.Builder
	var maxTTL int64
	for _, w := range p.Windows {
		r := newRing(w.Limit, w.Period, buckets, countWidth(w.Limit), w.Limit <= offsetsUpTo*int64(buckets))
		pl.windows = append(pl.windows, r)
		fmt.Fprintf(&desc, "%d/%d/%d/%d/%d/%d;", r.period, r.gran, r.n, r.width, r.obytes, r.unit)
		if t := r.period + r.gran; t > maxTTL {
			maxTTL = t
		}
	}
	pl.layout = digest(desc.String())
	pl.stateMS = maxTTL/1000 + 2

	b := p.Ban
	pl.ban = b.Enabled()
	if pl.ban {
		pl.strikes = newRing(b.Threshold, b.StrikeWindow, strikeBuckets, strikeBytes, true)
		pl.memory = b.Memory.Microseconds()
		for n := int64(1); n <= maxBanSteps; n++ {
			d := min(b.Duration(n).Microseconds(), maxBanMicro)
			if d < 1 {
				d = 1
			}
			pl.banDurs = append(pl.banDurs, d)
			if n > 1 && d == pl.banDurs[n-2] {
				pl.banDurs = pl.banDurs[:n-1]
				break
			}
		}
		s := pl.strikes
		pl.slayout = digest(fmt.Sprintf("s%d/%d/%d/%d", s.period, s.gran, s.n, s.unit))
	} else {
		pl.slayout = digest("none")
	}

	// Static script arguments; see script.go for their order.
	pl.argv = append(pl.argv, pl.layout, int64(len(pl.windows)))
	for _, r := range pl.windows {
		pl.argv = append(pl.argv, r.limit, r.period, r.gran, r.n, r.width, r.obytes, r.unit)
	}
	pl.argv = append(pl.argv, pl.stateMS)
	if pl.ban {
		s := pl.strikes
		pl.argv = append(pl.argv, s.limit, s.period, s.gran, s.n, s.unit, pl.slayout, pl.memory, int64(len(pl.banDurs)))
		for _, d := range pl.banDurs {
			pl.argv = append(pl.argv, d)
		}
	} else {
		pl.argv = append(pl.argv, int64(0))
	}
	return pl
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
	return time.Duration(newRing(1, d, buckets, 1, false).gran) * time.Microsecond
}

func (pl *plan) String() string {
	var b strings.Builder
	b.WriteString(pl.name)
	for _, r := range pl.windows {
		b.WriteString(" ")
		b.WriteString(strconv.FormatInt(r.limit, 10))
		b.WriteString("/")
		b.WriteString(FormatPeriod(time.Duration(r.period) * time.Microsecond))
	}
	return b.String()
}

// Defaults for the ring geometry.
const (
	// DefaultBuckets is the number of buckets a window is split into.
	DefaultBuckets = 200
	// DefaultStrikeBuckets is the number of buckets of the strike window.
	DefaultStrikeBuckets = 20
)
