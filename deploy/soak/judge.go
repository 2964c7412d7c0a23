package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// sample is one reading of every series, taken every -sample-every.
type sample struct {
	at      time.Time
	phase   phase
	rps     float64 // requests answered a second since the previous sample
	failed  int64   // of them 5xx or not answered at all
	dropped int64   // arrivals since the previous sample that found every worker busy
	values  map[string]float64
}

// interval is a run of consecutive steady samples: the fleet between a
// warm-up and the next fault (or the end).
type interval []sample

// span says when iv's first and last samples were taken, from start.
func (iv interval) span(start time.Time) string {
	return clock(iv[0].at.Sub(start)) + "-" + clock(iv[len(iv)-1].at.Sub(start))
}

// load returns iv's mean throughput and the share of its arrivals
// dropped, in percent, over samples every `every`.
func (iv interval) load(every time.Duration) (rps, droppedPct float64) {
	var sent, dropped float64
	for _, s := range iv {
		rps += s.rps
		sent += s.rps * every.Seconds()
		dropped += float64(s.dropped)
	}
	if sent+dropped > 0 {
		droppedPct = 100 * dropped / (sent + dropped)
	}
	return rps / float64(len(iv)), droppedPct
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

// growth is one series' verdict.
type growth struct {
	series        string
	first, last   float64 // medians
	nFirst, nLast int
	pct           float64 // (last - first) / first, in percent
	judged        bool    // held to the limit
	failed        bool
}

// comparison is what judgeGrowth compared: the first and the last
// steady interval (or, in a run without faults, the first and last third
// of its one steady interval).
type comparison struct {
	first, last interval
	rows        []growth
}

// judgeGrowth compares, for each series, the median of its values in
// the first steady interval with the median in the last one: a judged
// series fails when the latter exceeds the former by more than maxPct
// percent and by more than minRise.
//
// Only steady samples count: never one taken in a fault's window, nor in
// the warm-up that follows it, nor in the run's own warm-up. Like is
// compared with like: every fault restarts each replica and Redis, so
// every series starts again from nothing after it, and the run's first
// steady interval also follows fresh processes and a fresh Redis (the
// soak resets the fleet after measuring its capacity) and the same
// warm-up. Both intervals show processes of about the same age doing
// the same work; the last interval's have lived through a Redis restart
// (a fault rolls the replicas first), which the first's had not. What
// grows from the one to the other is what a restart does not reset, or
// what a replica keeps from a Redis restart. The median, not the mean,
// so that one sample taken during a burst of requests does not decide.
func judgeGrowth(samples []sample, series, judged []string, maxPct float64) (comparison, error) {
	ivs := steadyIntervals(samples)
	var c comparison
	switch len(ivs) {
	case 0:
		return c, fmt.Errorf("no steady samples at all: lengthen -duration or shorten -warmup")
	case 1:
		// No fault split the run: its first third against its last.
		iv := ivs[0]
		n := len(iv) / 3
		if n < minSamples {
			return c, fmt.Errorf("one steady interval of %d samples: too few to compare its first and last thirds", len(iv))
		}
		c.first, c.last = iv[:n], iv[len(iv)-n:]
	default:
		c.first, c.last = ivs[0], ivs[len(ivs)-1]
	}
	for _, name := range series {
		a, b := values(c.first, name), values(c.last, name)
		isJudged := slices.Contains(judged, name)
		if !isJudged && (len(a) < minSamples || len(b) < minSamples) {
			continue
		}
		if len(a) < minSamples || len(b) < minSamples {
			return c, fmt.Errorf("%s: %d values in the first steady interval and %d in the last, want at least %d in each: lengthen -duration",
				name, len(a), len(b), minSamples)
		}
		g := growth{series: name, first: median(a), last: median(b), nFirst: len(a), nLast: len(b), judged: isJudged}
		switch {
		case g.first > 0:
			g.pct = (g.last - g.first) / g.first * 100
		case g.last > 0:
			g.pct = math.Inf(1)
		}
		g.failed = isJudged && g.pct > maxPct && g.last-g.first > minRise
		c.rows = append(c.rows, g)
	}
	return c, nil
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

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
