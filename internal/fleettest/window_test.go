package fleettest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// span is one admitted request: the server decided it somewhere between
// the client's send and receive times.
type span struct{ send, recv time.Time }

// judgeLoad logs one key's results over a run of length run, fails the
// test on any failed request (5xx or a connection error) and returns the
// key's admissions.
func judgeLoad(t *testing.T, name string, rs []result, run time.Duration) []span {
	t.Helper()
	adm := admissions(rs, -1, time.Time{}, time.Now())
	t.Logf("%s: %s; %d admitted", name, summarize(rs, run), len(adm))
	if fs := failures(rs); len(fs) > 0 {
		t.Errorf("%s: %d failed requests, e.g. %s", name, len(fs), describe(fs[0]))
	}
	return adm
}

// judgeKeys splits the results of a load over n keys by key and judges
// each (judgeLoad, named "key i"), returning each key's admissions.
func judgeKeys(t *testing.T, rs []result, n int, run time.Duration) [][]span {
	t.Helper()
	byKey := make([][]result, n)
	for _, r := range rs {
		byKey[r.key] = append(byKey[r.key], r)
	}
	adm := make([][]span, n)
	for i, mine := range byKey {
		adm[i] = judgeLoad(t, fmt.Sprintf("key %d", i), mine, run)
	}
	return adm
}

// judgeWindow checks one key's admissions over a run of length run
// against one window: no group that certainly fell within less than
// period exceeds limit, and at least half of what the windows of the run
// allow was admitted (a starved key would pass any upper bound).
func judgeWindow(t *testing.T, name string, adm []span, limit int, period, run time.Duration) {
	t.Helper()
	n, at := windowCount(adm, period)
	t.Logf("%s: window %d/%s: at most %d admissions certainly within one window (ratio %.2f), from %s",
		name, limit, period, n, float64(n)/float64(limit), at.Format("15:04:05.000"))
	if n > limit {
		t.Errorf("%s: %d admissions within less than %s, limit %d", name, n, period, limit)
	}
	if want := max(int(run/period), 1) * limit / 2; len(adm) < want {
		t.Errorf("%s: only %d admitted in %s, want at least %d (half of what the window allows)", name, len(adm), run.Round(time.Second), want)
	}
}

// windowCount returns the largest number of admissions that certainly fell
// into one interval shorter than w, with the earliest such group's start.
// A group whose [send, recv] spans all fit between its earliest send and
// its latest receive, less than w apart, was decided inside an interval
// shorter than w whatever the server's clock said; counting by send time
// alone could both miss and invent a violation. So for a window of limit
// L, windowCount(...) > L is a certain violation.
func windowCount(adm []span, w time.Duration) (int, time.Time) {
	return windowCountSince(adm, w, time.Time{})
}

// windowCountSince is windowCount over the groups that hold at least one
// admission sent at or after since: it judges decisions made under a new
// plan against everything admitted before them, old plan included.
func windowCountSince(adm []span, w time.Duration, since time.Time) (int, time.Time) {
	sorted := slices.Clone(adm)
	slices.SortFunc(sorted, func(a, b span) int { return a.send.Compare(b.send) })
	best, at := 0, time.Time{}
	for i, a := range sorted {
		// Every admission sent at or after a and received before a.send+w
		// fits, with a, in [a.send, a.send+w).
		n, late := 0, false
		end := a.send.Add(w)
		for _, b := range sorted[i:] {
			if !b.send.Before(end) {
				break
			}
			if b.recv.Before(end) {
				n++
				late = late || !b.send.Before(since)
			}
		}
		if late && n > best {
			best, at = n, a.send
		}
	}
	return best, at
}

// admissions returns the spans of the 2xx answers among rs for key index
// k (all keys when k < 0), sent in [from, to).
func admissions(rs []result, k int, from, to time.Time) []span {
	var out []span
	for _, r := range rs {
		if r.err == nil && r.status < 300 && (k < 0 || r.key == k) && !r.send.Before(from) && r.send.Before(to) {
			out = append(out, span{r.send, r.recv})
		}
	}
	return out
}

// TestWindowCount checks the judge itself: it finds a group that fits in
// less than w, never counts one that might have been decided over w or
// more apart, and agrees with a brute force over random spans.
func TestWindowCount(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(send, recv int) span {
		return span{t0.Add(time.Duration(send) * time.Millisecond), t0.Add(time.Duration(recv) * time.Millisecond)}
	}
	tests := []struct {
		name string
		adm  []span
		w    time.Duration
		want int
	}{
		{"three inside", []span{at(0, 5), at(10, 20), at(900, 990)}, time.Second, 3},
		{"last answer at exactly w is not certain", []span{at(0, 5), at(10, 20), at(900, 1000)}, time.Second, 2},
		{"a slow answer may have been decided late", []span{at(0, 1500), at(10, 20), at(30, 40)}, time.Second, 2},
		{"sent before the others' window", []span{at(0, 5), at(1000, 1001), at(1100, 1101)}, time.Second, 2},
		{"none", nil, time.Second, 0},
	}
	for _, tt := range tests {
		if got, _ := windowCount(tt.adm, tt.w); got != tt.want {
			t.Errorf("%s: windowCount = %d, want %d", tt.name, got, tt.want)
		}
	}

	adm := []span{at(0, 5), at(10, 20), at(900, 990), at(2000, 2001)}
	if got, _ := windowCountSince(adm, time.Second, t0.Add(900*time.Millisecond)); got != 3 {
		t.Errorf("windowCountSince: a group with a late member = %d, want 3", got)
	}
	if got, _ := windowCountSince(adm, time.Second, t0.Add(950*time.Millisecond)); got != 1 {
		t.Errorf("windowCountSince: only the lone late admission counts = %d, want 1", got)
	}

	rng := rand.New(rand.NewPCG(9, 9))
	for round := range 300 {
		n := 1 + rng.IntN(30)
		w := time.Duration(1+rng.IntN(50)) * time.Millisecond
		adm := make([]span, n)
		for i := range adm {
			s := rng.IntN(200)
			adm[i] = at(s, s+rng.IntN(40))
		}
		got, _ := windowCount(adm, w)
		// Brute force: the largest subset whose max recv - min send < w.
		want := 0
		for _, a := range adm {
			for _, b := range adm {
				if b.recv.Sub(a.send) >= w || b.recv.Before(a.send) {
					continue
				}
				n := 0
				for _, c := range adm {
					if !c.send.Before(a.send) && !c.recv.After(b.recv) {
						n++
					}
				}
				want = max(want, n)
			}
		}
		if got != want {
			t.Fatalf("round %d (w %s, %v): windowCount = %d, brute force %d", round, w, adm, got, want)
		}
	}
}
