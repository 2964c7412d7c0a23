package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// sample is one reading of every series, taken every -sample-every.
type sample struct {
	at       time.Time
	phase    phase
	rps      float64 // requests answered a second since the previous sample
	requests int64   // requests answered since the previous sample
	failed   int64   // of them 5xx or not answered at all
	dropped  int64   // arrivals since the previous sample that found every worker busy
	values   map[string]float64
}

// maxDroppedPct is the most of a sample's arrivals (since the previous
// sample) that may have been dropped, every client busy, for the sample
// to have held the rate. More means the fleet fell behind: the machine
// stalled (other processes took the cores) or something in the fleet
// did, and requests piled up in flight, each holding memory, a
// connection and goroutines. On this 2-core machine up to 2.5% dropped
// left every series where it was; 12 to 29% raised the heap goal by a
// quarter to nine tenths, and it stayed raised after the pile had gone.
const maxDroppedPct = 5.0

// held reports whether s saw the intended load.
func (s sample) held() bool {
	return float64(s.dropped)*100 <= maxDroppedPct*float64(s.requests+s.dropped)
}

// interval is a run of consecutive steady samples: the fleet between a
// warm-up and the next fault (or the end).
type interval []sample

// span says when iv's first and last samples were taken, from start.
func (iv interval) span(start time.Time) string {
	return clock(iv[0].at.Sub(start)) + "-" + clock(iv[len(iv)-1].at.Sub(start))
}

// describe says when iv ran, how many samples it holds and for how
// many it held the rate, and the load it carried.
func (iv interval) describe(start time.Time) string {
	var requests, dropped int64
	for _, s := range iv {
		requests += s.requests
		dropped += s.dropped
	}
	secs := iv[len(iv)-1].at.Sub(iv[0].at).Seconds()
	rps := 0.0
	if secs > 0 && len(iv) > 1 {
		// The first sample's requests came before its start.
		rps = float64(requests-iv[0].requests) / secs
	}
	pct := 0.0
	if requests+dropped > 0 {
		pct = 100 * float64(dropped) / float64(requests+dropped)
	}
	return fmt.Sprintf("%s, %d samples, the rate held for %d; %.0f requests/s, %.1f%% of arrivals dropped",
		iv.span(start), len(iv), len(iv.held()), rps, pct)
}

// clock formats an offset into the run as minutes:seconds.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

// steadyIntervals splits samples into their runs of steady ones.
func steadyIntervals(samples []sample) []interval {
	var out []interval
	var cur interval
	for _, s := range samples {
		if s.phase == phaseSteady {
			cur = append(cur, s)
			continue
		}
		if len(cur) > 0 {
			out = append(out, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// minRise is how much a series must also rise, in its own units, to
// fail. With connections taken out, a replica's goroutines and
// descriptors sit at 20 to 30, where 5% is one: one request more in
// flight as the sample is taken, or one Redis connection more (the
// client's pool grows to the most round trips it has had in flight at
// once). A leak grows without bound; these do not.
const minRise = 2

// minSamples is the fewest values of a series each compared interval
// must hold for its median to mean anything.
const minSamples = 3

// rule says how judgeGrowth holds a series to the limit: across the run
// (the first steady interval against the last) and within each steady
// interval of at least withinFrom (its first half against its second).
// A series with neither is only drawn.
type rule struct {
	across, within bool
	withinFrom     time.Duration
	// floor is the least rise, in the series' units, that fails besides
	// the percentage (minRise when less).
	floor float64
}

// growth is one series' verdict.
type growth struct {
	series        string
	rule          rule
	first, last   float64 // medians of the first and the last steady interval
	nFirst, nLast int
	pct           float64 // (last - first) / first, in percent
	failed        bool
	// Within: the steady interval whose second half rose most over its
	// first, when the rule asks (withinIv nil when no interval had
	// samples enough in both halves).
	withinIv                interval
	withinFirst, withinLast float64
	withinPct               float64
	withinFailed            bool
}

// comparison is what judgeGrowth compared: the first and the last
// steady interval that held the rate (or, in a run without faults, the
// first and last third of its one steady interval), and every steady
// interval.
type comparison struct {
	first, last interval
	intervals   []interval
	rows        []growth
}

// judgeGrowth holds each series to its rule. Across the run, it compares
// the median of its values in the first steady interval with the median
// in the last one; within each steady interval, the median of its first
// half with that of its second. Either fails when the later median
// exceeds the earlier by more than maxPct percent and by more than
// minRise.
//
// Only steady samples count: never one taken in a fault's window, nor in
// the warm-up that follows it, nor in the run's own warm-up, nor one
// taken once the rate was not held (interval.held); an interval that
// held it for fewer than minSamples samples is left out, and the first
// and last of the others are compared. Across the run, like is
// compared with like: every fault restarts each replica and Redis, so
// every series starts again from nothing after it, and the run's first
// steady interval also follows fresh processes and a fresh Redis (the
// soak resets the fleet after measuring its capacity) and the same
// warm-up. Both intervals show processes of about the same age doing
// the same work; the last interval's have lived through a Redis restart
// (a fault rolls the replicas first), which the first's had not. What
// grows from the one to the other is what a restart does not reset, or
// what a replica keeps from a Redis restart. What grows through a
// process's life and goes with it (no process outlives the time between
// two faults) shows only within an interval, where the same processes
// and the same Redis are compared with themselves, older. The median,
// not the mean, so that one sample taken during a burst of requests does
// not decide.
func judgeGrowth(samples []sample, series []string, rules map[string]rule, maxPct float64) (comparison, error) {
	c := comparison{intervals: steadyIntervals(samples)}
	// Each interval counts until the rate was first not held.
	var held []interval
	for _, iv := range c.intervals {
		if h := iv.held(); len(h) >= minSamples {
			held = append(held, h)
		}
	}
	switch {
	case len(c.intervals) == 0:
		return c, fmt.Errorf("no steady samples at all: lengthen -duration or shorten -warmup")
	case len(c.intervals) == 1 && len(held) == 1:
		// No fault split the run: its first third against its last.
		iv := held[0]
		n := len(iv) / 3
		if n < minSamples {
			return c, fmt.Errorf("one steady interval, which held the rate for %d samples: too few to compare its first and last thirds", len(iv))
		}
		c.first, c.last = iv[:n], iv[len(iv)-n:]
	case len(held) >= 2:
		c.first, c.last = held[0], held[len(held)-1]
	default:
		want, long := min(2, len(c.intervals)), 0
		for _, iv := range c.intervals {
			if len(iv) >= minSamples {
				long++
			}
		}
		if long < want {
			return c, fmt.Errorf("%d of %d steady intervals have %d samples, want %d: lengthen -duration or shorten -warmup",
				long, len(c.intervals), minSamples, want)
		}
		return c, fmt.Errorf("the rate was not held: %d of %d steady intervals held it for %d samples from their start "+
			"(no more than %.0f%% of each sample's arrivals finding every client busy), want %d (a machine busier than when the capacity was measured?)",
			len(held), len(c.intervals), minSamples, maxDroppedPct, want)
	}
	for _, name := range series {
		r := rules[name]
		a, b := values(c.first, name), values(c.last, name)
		if len(a) < minSamples || len(b) < minSamples {
			if !r.across {
				continue
			}
			return c, fmt.Errorf("%s: %d values in the first steady interval and %d in the last, want at least %d in each: lengthen -duration",
				name, len(a), len(b), minSamples)
		}
		g := growth{series: name, rule: r, first: median(a), last: median(b), nFirst: len(a), nLast: len(b)}
		g.pct = rise(g.first, g.last)
		g.failed = r.across && exceeds(g.first, g.last, maxPct, r.floor)
		if r.within {
			for _, iv := range held {
				if iv[len(iv)-1].at.Sub(iv[0].at) < r.withinFrom {
					continue
				}
				h := len(iv) / 2
				a, b := values(iv[:h], name), values(iv[h:], name)
				if len(a) < minSamples || len(b) < minSamples {
					continue
				}
				first, last := median(a), median(b)
				if pct := rise(first, last); g.withinIv == nil || pct > g.withinPct {
					g.withinIv, g.withinFirst, g.withinLast, g.withinPct = iv, first, last, pct
					g.withinFailed = exceeds(first, last, maxPct, r.floor)
				}
			}
		}
		c.rows = append(c.rows, g)
	}
	return c, nil
}

// rise is how much later exceeds earlier, in percent of it.
func rise(earlier, later float64) float64 {
	switch {
	case earlier > 0:
		return (later - earlier) / earlier * 100
	case later > 0:
		return math.Inf(1)
	}
	return 0
}

// exceeds reports whether later is over the limit: more than maxPct
// percent above earlier, and more than minRise and floor.
func exceeds(earlier, later, maxPct, floor float64) bool {
	return rise(earlier, later) > maxPct && later-earlier > max(minRise, floor)
}

// values returns the readings of series name in iv (a replica being
// restarted has none).
func values(iv interval, name string) []float64 {
	var out []float64
	for _, s := range iv {
		if v, ok := s.values[name]; ok {
			out = append(out, v)
		}
	}
	return out
}

// held returns iv up to its first sample that did not hold the rate:
// what a pile of requests raised stays raised after it has gone, so no
// later sample of the interval shows the fleet at its load either.
func (iv interval) held() interval {
	for i, s := range iv {
		if !s.held() {
			return iv[:i]
		}
	}
	return iv
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
