package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// faultReport is what one fault did and how long each step took.
type faultReport struct {
	n            int
	start, ready time.Time // ready: zero if the fleet never was
	rolls        []time.Duration
	redis        time.Duration
}

// report is a run's verdict and the figures behind it.
type report struct {
	cfg        config
	sched      schedule
	keyCounts  map[string]int
	capacity   float64 // measured, requests/s (0: -rate was given)
	rate       float64 // the steady load's target
	probe      *tally  // the capacity measurement's answers (not judged: it saturates the fleet on purpose)
	load       *tally
	start, end time.Time
	faults     []faultReport
	samples    []sample
	fatal      error // why the run stopped early, if it did

	// judged
	excused   int64     // failures inside a fault's window
	outside   []failure // failures outside every window
	growth    comparison
	growthErr error
}

// judge sorts the load's failures by fault window and compares the
// series (judgeGrowth).
func (r *report) judge(tl *timeline, series []string, rules map[string]rule) {
	r.load.mu.Lock()
	for _, f := range r.load.failures {
		if tl.excused(f.send, f.recv) {
			r.excused++
		} else {
			r.outside = append(r.outside, f)
		}
	}
	overflow := r.load.overflow
	r.load.mu.Unlock()
	if overflow > 0 && r.fatal == nil {
		r.fatal = fmt.Errorf("%d failures beyond the %d kept, not judged", overflow, maxFailures)
	}
	r.growth, r.growthErr = judgeGrowth(r.samples, series, rules, r.cfg.maxGrowth)
}

// failures says what failed the run ("" when nothing did).
func (r *report) failures() string {
	var out []string
	if r.fatal != nil {
		out = append(out, r.fatal.Error())
	}
	if r.growthErr != nil {
		out = append(out, "growth not judged: "+r.growthErr.Error())
	}
	for _, g := range r.growth.rows {
		if g.failed {
			out = append(out, fmt.Sprintf("%s grew %s from the first steady interval to the last (%s to %s)",
				g.series, pct(g.pct), r.format(g.series, g.first), r.format(g.series, g.last)))
		}
		if g.withinFailed {
			out = append(out, fmt.Sprintf("%s grew %s within the steady interval %s (%s in its first half, %s in its second)",
				g.series, pct(g.withinPct), g.withinIv.span(r.start), r.format(g.series, g.withinFirst), r.format(g.series, g.withinLast)))
		}
	}
	if n := len(r.outside); n > 0 {
		f := r.outside[0]
		out = append(out, fmt.Sprintf("%d requests got a 5xx or no answer outside fault windows, the first at %s: %s",
			n, clock(f.send.Sub(r.start)), describe(f)))
	}
	return strings.Join(out, "; ")
}

func describe(f failure) string {
	status := "no answer"
	if f.status != 0 {
		status = fmt.Sprint(f.status)
	}
	return fmt.Sprintf("GET %s: %s after %s: %.200q", f.path, status, f.recv.Sub(f.send).Round(time.Millisecond), f.detail)
}

// format shows a value of series name with its unit.
func (r *report) format(name string, v float64) string {
	if strings.HasSuffix(name, "_bytes") {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.0f", v)
}

// String is the summary printed at the end and kept in summary.txt.
func (r *report) String() string {
	var b strings.Builder
	cfg := r.cfg
	elapsed := r.end.Sub(r.start)
	fmt.Fprintf(&b, "soak of %s (ran %s): %d replicas behind HAProxy, a private Redis; %d keys (%s)\n",
		cfg.duration, elapsed.Round(time.Second), cfg.replicas, cfg.keys, r.mix())
	if r.capacity > 0 {
		fmt.Fprintf(&b, "capacity: %.0f requests/s flat out (measured over %s; %s); steady target %.0f/s (%.0f%%)\n",
			r.capacity, cfg.probe, codes(r.probe), r.rate, cfg.load*100)
	} else {
		fmt.Fprintf(&b, "steady target %.0f requests/s (-rate)\n", r.rate)
	}
	n := r.load.requests.Load()
	fmt.Fprintf(&b, "requests: %d in %s, %.0f/s; %s; %d arrivals dropped (every worker busy)\n",
		n, elapsed.Round(time.Second), float64(n)/elapsed.Seconds(), codes(r.load), r.load.dropped.Load())
	fmt.Fprintf(&b, "5xx or no answer: %d inside fault windows, %d outside\n", r.excused, len(r.outside))
	for i, f := range r.outside {
		if i == 5 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(r.outside)-5)
			break
		}
		fmt.Fprintf(&b, "  %s %s\n", clock(f.send.Sub(r.start)), describe(f))
	}
	fmt.Fprintf(&b, "phases: warm-up %s after the start and after each fault's window; a fault's window lasts until the fleet is as before plus %s\n",
		r.sched.warmup, cfg.grace)
	for _, f := range r.faults {
		var rolls []string
		for i, d := range f.rolls {
			rolls = append(rolls, fmt.Sprintf("r%d %s", i+1, d.Round(100*time.Millisecond)))
		}
		ready := "never ready"
		if !f.ready.IsZero() {
			ready = fmt.Sprintf("as before at %s, window to %s", clock(f.ready.Sub(r.start)), clock(f.ready.Add(cfg.grace).Sub(r.start)))
		}
		fmt.Fprintf(&b, "fault %d at %s: rolled %s; Redis restarted empty in %s; %s\n",
			f.n, clock(f.start.Sub(r.start)), strings.Join(rolls, ", "), f.redis.Round(time.Millisecond), ready)
	}
	if r.growthErr != nil {
		fmt.Fprintf(&b, "growth: not judged: %v\n", r.growthErr)
	} else {
		c := r.growth
		fmt.Fprintf(&b, "growth: over %.0f%% (and %d) fails; the medians of the first steady interval and the last, and the most an interval's\n"+
			"second half rose over its first (within); steady intervals:\n", cfg.maxGrowth, minRise)
		for _, iv := range c.intervals {
			fmt.Fprintf(&b, "  %s\n", iv.describe(r.start))
		}
		fmt.Fprintf(&b, "  %-24s %11s %11s %8s %8s\n", "series", "first", "last", "growth", "within")
		for _, g := range c.rows {
			within, mark := "-", ""
			if g.withinIv != nil {
				within = pct(g.withinPct)
			}
			switch {
			case g.failed || g.withinFailed:
				mark = "  FAIL"
			case g.rule == (rule{}):
				mark = "  (drawn, not judged)"
			case !g.rule.within:
				mark = "  (not judged within)"
			case g.withinIv == nil && g.rule.withinFrom > 0:
				mark = fmt.Sprintf("  (judged within intervals of %s or more)", g.rule.withinFrom)
			}
			fmt.Fprintf(&b, "  %-24s %11s %11s %8s %8s%s\n", g.series, r.format(g.series, g.first), r.format(g.series, g.last), pct(g.pct), within, mark)
		}
	}
	if f := r.failures(); f != "" {
		fmt.Fprintf(&b, "FAIL: %s\n", f)
	} else {
		fmt.Fprintf(&b, "PASS: no series grew over %.0f%%, no 5xx outside a fault\n", cfg.maxGrowth)
	}
	return b.String()
}

func pct(p float64) string {
	if math.IsInf(p, 1) {
		return "+inf"
	}
	return fmt.Sprintf("%+.1f%%", p)
}

// mix lists the keys per plan in keyMix's order.
func (r *report) mix() string {
	var out []string
	for _, m := range keyMix {
		out = append(out, fmt.Sprintf("%s %d", m.plan, r.keyCounts[m.plan]))
	}
	return strings.Join(out, ", ")
}

// codes lists t's answers by status.
func codes(t *tally) string {
	c := t.codes()
	keys := make([]int, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		name := fmt.Sprint(k)
		if k == 0 {
			name = "no answer"
		}
		out = append(out, fmt.Sprintf("%s: %d", name, c[k]))
	}
	if len(out) == 0 {
		return "no answers"
	}
	return strings.Join(out, ", ")
}
