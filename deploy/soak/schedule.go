package main

import (
	"sync"
	"time"
)

// phase is what the fleet was going through at a moment of the run.
type phase string

const (
	// phaseWarmup: the first -warmup of the load, and the -warmup after
	// each fault's window, while fresh processes and a fresh Redis fill
	// their caches, pools and records.
	phaseWarmup phase = "warmup"
	// phaseSteady: traffic steady, no fault near; the only samples the
	// growth check reads.
	phaseSteady phase = "steady"
	// phaseFault: from a fault's start until the fleet is ready again,
	// plus the grace.
	phaseFault phase = "fault"
)

// schedule is when a run's faults fall, as offsets from the start of the
// steady load, and how long the fleet warms up.
type schedule struct {
	duration time.Duration
	every    time.Duration // between faults; 0: none
	warmup   time.Duration
	faults   []time.Duration
}

// newSchedule places a fault every `every` from the load's start, while
// one fits before the end. A run shorter than two such intervals gets
// one fault at its middle instead, so that even a short run has a steady
// interval before a fault and another after it; the warm-up is cut to a
// quarter of the interval between faults (or of the run, without faults)
// so that each steady interval keeps most of its samples.
func newSchedule(duration, every, warmup time.Duration) schedule {
	s := schedule{duration: duration, every: every}
	span := duration
	if every > 0 {
		if duration < 2*every {
			s.every = duration / 2
		}
		for at := s.every; at < duration; at += s.every {
			s.faults = append(s.faults, at)
		}
		span = s.every
	}
	s.warmup = min(warmup, span/4)
	return s
}

// window is one fault's: from its start until the fleet was ready
// again (zero while it is not).
type window struct {
	start, ready time.Time
}

// timeline says which phase a moment falls in: it holds when the load
// started and every fault's window as the run learns them.
type timeline struct {
	mu     sync.Mutex
	start  time.Time
	warmup time.Duration
	grace  time.Duration
	faults []window
}

// beginFault opens a fault's window at t and returns its index.
func (tl *timeline) beginFault(t time.Time) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.faults = append(tl.faults, window{start: t})
	return len(tl.faults) - 1
}

// endFault records when fault i's fleet was ready again.
func (tl *timeline) endFault(i int, t time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.faults[i].ready = t
}

// phaseAt returns the phase t falls in. A fault still under way covers
// everything after its start.
func (tl *timeline) phaseAt(t time.Time) phase {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if t.Before(tl.start.Add(tl.warmup)) {
		return phaseWarmup
	}
	p := phaseSteady
	for _, f := range tl.faults {
		if t.Before(f.start) {
			continue
		}
		if f.ready.IsZero() {
			return phaseFault
		}
		end := f.ready.Add(tl.grace)
		if t.Before(end) {
			return phaseFault
		}
		if t.Before(end.Add(tl.warmup)) {
			p = phaseWarmup
		}
	}
	return p
}

// excused reports whether a request sent at send and answered at recv
// overlaps a fault's window (with its grace): only there may it fail.
func (tl *timeline) excused(send, recv time.Time) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, f := range tl.faults {
		if recv.Before(f.start) {
			continue
		}
		if f.ready.IsZero() || send.Before(f.ready.Add(tl.grace)) {
			return true
		}
	}
	return false
}
