package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// acrossOnly judges series x across the run only.
var acrossOnly = map[string]rule{"x": {across: true}}

func TestNewSchedule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		duration, every, warmup time.Duration
		faults                  []time.Duration
		wantWarmup              time.Duration
	}{
		// make soak: a fault every 10 minutes, none at the very end.
		{time.Hour, 10 * time.Minute, 2 * time.Minute,
			[]time.Duration{10 * time.Minute, 20 * time.Minute, 30 * time.Minute, 40 * time.Minute, 50 * time.Minute}, 2 * time.Minute},
		// The CI form: one fault, at the middle, and a quarter of the
		// interval's warm-up.
		{5 * time.Minute, 10 * time.Minute, 2 * time.Minute, []time.Duration{150 * time.Second}, 37500 * time.Millisecond},
		{19 * time.Minute, 10 * time.Minute, 2 * time.Minute, []time.Duration{570 * time.Second}, 2 * time.Minute},
		{20 * time.Minute, 10 * time.Minute, 2 * time.Minute, []time.Duration{10 * time.Minute}, 2 * time.Minute},
		// No faults: the warm-up is cut to a quarter of the run.
		{4 * time.Minute, 0, 2 * time.Minute, nil, time.Minute},
	} {
		s := newSchedule(c.duration, c.every, c.warmup)
		if !slices.Equal(s.faults, c.faults) || s.warmup != c.wantWarmup {
			t.Errorf("newSchedule(%s, %s, %s): faults %v, warm-up %s; want %v, %s",
				c.duration, c.every, c.warmup, s.faults, s.warmup, c.faults, c.wantWarmup)
		}
	}
}

func TestTimelinePhases(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tl := &timeline{start: t0, warmup: 30 * time.Second, grace: 5 * time.Second}
	i := tl.beginFault(at(100))
	// While the fault lasts, everything after its start is in it.
	if p := tl.phaseAt(at(1000)); p != phaseFault {
		t.Fatalf("during an unfinished fault: %s", p)
	}
	tl.endFault(i, at(120))
	for _, c := range []struct {
		s    float64
		want phase
	}{
		{0, phaseWarmup}, {29.9, phaseWarmup}, {30, phaseSteady}, {99.9, phaseSteady},
		{100, phaseFault}, {124.9, phaseFault}, // until ready plus the grace
		{125, phaseWarmup}, {154.9, phaseWarmup}, // then the warm-up again
		{155, phaseSteady},
	} {
		if p := tl.phaseAt(at(c.s)); p != c.want {
			t.Errorf("phase at %.1fs: %s, want %s", c.s, p, c.want)
		}
	}
	for _, c := range []struct {
		send, recv float64
		want       bool
	}{
		{90, 99.9, false}, // answered before the fault
		{99, 100.5, true}, // in flight when it began
		{110, 111, true},
		{124, 126, true},      // sent within the grace
		{125.1, 125.2, false}, // sent after it
	} {
		if got := tl.excused(at(c.send), at(c.recv)); got != c.want {
			t.Errorf("excused(%v, %v) = %v, want %v", c.send, c.recv, got, c.want)
		}
	}
}

// samples builds a run: phases as a string (w warm-up, s steady, f
// fault), one sample every 10 s, series x taking values from v.
func samples(phases string, v func(i int) (float64, bool)) []sample {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out []sample
	for i, c := range phases {
		p := map[rune]phase{'w': phaseWarmup, 's': phaseSteady, 'f': phaseFault}[c]
		s := sample{at: t0.Add(time.Duration(i+1) * 10 * time.Second), phase: p, values: map[string]float64{}}
		if x, ok := v(i); ok {
			s.values["x"] = x
		}
		out = append(out, s)
	}
	return out
}

func TestJudgeGrowthComparesFirstAndLastSteadyIntervals(t *testing.T) {
	t.Parallel()
	//            0    5    10   15   20   25
	phases := "wwsssssffwwsssssffwwssss"
	for _, c := range []struct {
		name   string
		v      func(i int) float64
		pct    float64
		failed bool
	}{
		{"flat", func(int) float64 { return 100 }, 0, false},
		// Warm-up and fault samples never count, however high.
		{"spikes outside steady", func(i int) float64 {
			if phases[i] != 's' {
				return 1e9
			}
			return 100
		}, 0, false},
		// The median shrugs off one outlier in each interval.
		{"one outlier", func(i int) float64 {
			if i == 3 || i == 21 {
				return 1000
			}
			return 100
		}, 0, false},
		// The middle interval does not count: first against last.
		{"middle high", func(i int) float64 {
			if i >= 11 && i <= 15 {
				return 200
			}
			return 100
		}, 0, false},
		{"5% exactly passes", func(i int) float64 {
			if i >= 20 {
				return 105
			}
			return 100
		}, 5, false},
		{"over 5% fails", func(i int) float64 {
			if i >= 20 {
				return 105.5
			}
			return 100
		}, 5.5, true},
		// Small counts must also rise by more than minRise.
		{"two more of 30 passes", func(i int) float64 {
			if i >= 20 {
				return 32
			}
			return 30
		}, 100.0 * 2 / 30, false},
		{"three more of 30 fails", func(i int) float64 {
			if i >= 20 {
				return 33
			}
			return 30
		}, 10, true},
		{"shrinking passes", func(i int) float64 {
			if i >= 20 {
				return 50
			}
			return 100
		}, -50, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ss := samples(phases, func(i int) (float64, bool) { return c.v(i), true })
			got, err := judgeGrowth(ss, []string{"x"}, acrossOnly, 5)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.first) != 5 || len(got.last) != 4 {
				t.Fatalf("compared %d and %d samples, want the first interval's 5 and the last's 4", len(got.first), len(got.last))
			}
			g := got.rows[0]
			if math.Abs(g.pct-c.pct) > 1e-9 || g.failed != c.failed {
				t.Errorf("growth %+.2f%% failed %v, want %+.2f%% failed %v", g.pct, g.failed, c.pct, c.failed)
			}
		})
	}
}

func TestJudgeGrowthWithoutFaultsComparesThirds(t *testing.T) {
	t.Parallel()
	ss := samples("wwsssssssss", func(i int) (float64, bool) { return float64(100 + i), true })
	got, err := judgeGrowth(ss, []string{"x"}, acrossOnly, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Steady samples 2-10: the first three (102..104) against the last
	// three (108..110).
	if g := got.rows[0]; g.first != 103 || g.last != 109 {
		t.Errorf("medians %v and %v, want 103 and 109", g.first, g.last)
	}
}

func TestJudgeGrowthNeedsSamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		phases string
		have   func(i int) bool
		want   string
	}{
		{"wwffww", func(int) bool { return true }, "no steady samples"},
		{"wssffwss", func(int) bool { return true }, "0 of 2 steady intervals have 3 samples, want 2"},
		{"wwsssss", func(int) bool { return true }, "too few"},
		// A replica missing from most of the last interval.
		{"wssssffwsss", func(i int) bool { return i < 9 }, "x: 4 values in the first steady interval and 1 in the last"},
	} {
		ss := samples(c.phases, func(i int) (float64, bool) { return 1, c.have(i) })
		if _, err := judgeGrowth(ss, []string{"x"}, acrossOnly, 5); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.phases, err, c.want)
		}
	}
	// A series drawn but not judged is left out instead.
	ss := samples("wssssffwsss", func(i int) (float64, bool) { return 1, i < 9 })
	if c, err := judgeGrowth(ss, []string{"x"}, nil, 5); err != nil || len(c.rows) != 0 {
		t.Errorf("an unjudged series short of samples: rows %v, error %v", c.rows, err)
	}
}

func TestJudgedSeries(t *testing.T) {
	t.Parallel()
	all, rules := seriesNames(2)
	for name, want := range map[string]rule{
		"r1_rss_bytes":       {across: true, floor: rssFloor},
		"r2_heap_goal_bytes": {across: true, within: true, floor: heapGoalFloor},
		"r1_goroutines_own":  {across: true, within: true},
		"r2_open_fds_own":    {across: true, within: true},
		redisMemory:          {across: true, within: true, withinFrom: redisSettles},
		redisKeys:            {across: true, within: true, withinFrom: redisSettles},
		// Drawn only.
		"r1_heap_inuse_bytes": {}, "r1_goroutines": {}, "r2_open_fds": {}, "r1_conns": {}, "r2_redis_conns": {}, "r1_in_flight": {},
	} {
		if !slices.Contains(all, name) {
			t.Errorf("%s is not recorded", name)
		}
		if rules[name] != want {
			t.Errorf("%s is judged %+v, want %+v", name, rules[name], want)
		}
	}
	for name := range rules {
		if !slices.Contains(all, name) {
			t.Errorf("%s is judged but not recorded", name)
		}
	}
}

// TestJudgeGrowthWithinAnInterval: a series that climbs through every
// process's life and starts again with the next (no process outlives a
// fault) looks the same in the first interval and the last; only the
// comparison within each interval sees it.
func TestJudgeGrowthWithinAnInterval(t *testing.T) {
	t.Parallel()
	const phases = "wssssssffwssssss"
	climbs := func(i int) (float64, bool) {
		switch {
		case i >= 1 && i <= 6:
			return float64(100 + 10*(i-1)), true
		case i >= 10:
			return float64(100 + 10*(i-10)), true
		}
		return 100, true
	}
	c, err := judgeGrowth(samples(phases, climbs), []string{"x"}, map[string]rule{"x": {across: true, within: true}}, 5)
	if err != nil {
		t.Fatal(err)
	}
	g := c.rows[0]
	if g.failed {
		t.Errorf("failed across the run (%+.1f%%): the first and last intervals are alike", g.pct)
	}
	// Halves: 100, 110, 120 against 130, 140, 150.
	if !g.withinFailed || g.withinFirst != 110 || g.withinLast != 140 {
		t.Errorf("within: %v to %v, failed %v; want 110 to 140, failed", g.withinFirst, g.withinLast, g.withinFailed)
	}
	// Judged within intervals of a minute or more only, it passes: these
	// last 50 s.
	c, err = judgeGrowth(samples(phases, climbs), []string{"x"}, map[string]rule{"x": {across: true, within: true, withinFrom: time.Minute}}, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.rows[0]; g.withinFailed || g.withinIv != nil {
		t.Errorf("judged within intervals shorter than withinFrom: %+v", g)
	}
	// Judged across only, it passes.
	c, err = judgeGrowth(samples(phases, climbs), []string{"x"}, acrossOnly, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.rows[0]; g.failed || g.withinFailed || g.withinIv != nil {
		t.Errorf("a series judged across only: %+v", g)
	}
}

func TestMixCounts(t *testing.T) {
	t.Parallel()
	for _, n := range []int{20, 21, 99, 10000, 12345} {
		c := mixCounts(n)
		sum := 0
		for i, k := range c {
			if k < 1 {
				t.Errorf("mixCounts(%d): plan %s gets %d keys", n, keyMix[i].plan, k)
			}
			sum += k
		}
		if sum != n {
			t.Errorf("mixCounts(%d) = %v: %d keys in all", n, c, sum)
		}
	}
	if got := fmt.Sprint(mixCounts(10000)); got != "[4000 3000 2000 500 500]" {
		t.Errorf("mixCounts(10000) = %s", got)
	}
}

// TestJudgeGrowthCountsAnIntervalUntilTheRateWasNotHeld: once a
// sample's arrivals found every client busy, requests piled up in
// flight and what they raised stays raised: the interval counts up to
// that sample, and one that held the rate too briefly not at all.
func TestJudgeGrowthCountsAnIntervalUntilTheRateWasNotHeld(t *testing.T) {
	t.Parallel()
	//                 0    5    10   15   20
	const phases = "wsssssffwssssssffwsssss"
	run := func(behind map[int]bool, high func(i int) bool) []sample {
		ss := samples(phases, func(i int) (float64, bool) {
			if high(i) {
				return 500, true
			}
			return 100, true
		})
		for i := range ss {
			ss[i].requests, ss[i].dropped = 1000, 50 // 4.8%: held
			if behind[i] {
				ss[i].dropped = 60 // 5.7%
			}
		}
		return ss
	}
	x := []string{"x"}
	both := map[string]rule{"x": {across: true, within: true}}

	// The last interval (18-22) falls behind at 20 and stays high after
	// it: only 18 and 19 count, too few, so the middle one (9-14) is the
	// last compared; it too falls behind, at 12, after which it is high.
	ss := run(map[int]bool{12: true, 20: true}, func(i int) bool { return i >= 12 && i <= 14 || i >= 20 })
	c, err := judgeGrowth(ss, x, both, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.last) != 3 || c.last[0].at != ss[9].at {
		t.Fatalf("compared the last with %d samples from %v, want the middle interval's first 3", len(c.last), c.last[0].at)
	}
	if g := c.rows[0]; g.failed || g.withinFailed || g.last != 100 {
		t.Errorf("%+v: want nothing raised after the rate was not held to count", g)
	}

	// Only the first interval holds the rate long enough: not judged.
	ss = run(map[int]bool{9: true, 18: true}, func(int) bool { return false })
	if _, err := judgeGrowth(ss, x, both, 5); err == nil || !strings.Contains(err.Error(), "the rate was not held: 1 of 3 steady intervals") {
		t.Errorf("error %v, want one saying the rate was not held", err)
	}
}

// TestExceedsHoldsAFloor: a rise over the percentage fails only when it
// also passes the series' floor (or minRise, when the floor is less).
func TestExceedsHoldsAFloor(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, c := range []struct {
		earlier, later, floor float64
		want                  bool
	}{
		{31.6 * mib, 33.2 * mib, heapGoalFloor, false}, // +5.1%, 1.6 MiB
		{31.6 * mib, 33.7 * mib, heapGoalFloor, true},  // +6.6%, 2.1 MiB
		{31.6 * mib, 33.2 * mib, 0, true},
		{40 * mib, 41.9 * mib, heapGoalFloor, false}, // +4.8%: under the percentage
		{24, 26, 0, false},                           // +8.3% but 2: minRise
		{24, 27, 0, true},
	} {
		if got := exceeds(c.earlier, c.later, 5, c.floor); got != c.want {
			t.Errorf("exceeds(%.0f, %.0f, 5%%, floor %.0f) = %v, want %v", c.earlier, c.later, c.floor, got, c.want)
		}
	}
}
