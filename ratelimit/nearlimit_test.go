package ratelimit

import (
	"context"
	"testing"
	"time"
)

// TestNearLimitCounted checks petstore_ratelimit_near_limit_total with
// known numbers: an admission counts when it leaves some window with
// remaining*10 < limit, once however many windows it leaves so, and
// refusals never count.
func TestNearLimitCounted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		windows  []Window
		requests int
		allowed  int
		near     float64
	}{
		// 20 - i left after the i-th: 1 and 0 are under 2, a tenth.
		{"one window", []Window{{Limit: 20, Period: time.Minute}}, 25, 20, 2},
		// 1 left is exactly a tenth: not under it.
		{"a tenth exactly is not near", []Window{{Limit: 10, Period: time.Minute}}, 10, 10, 1},
		{"not yet near", []Window{{Limit: 20, Period: time.Minute}}, 18, 18, 0},
		{"limit 1", []Window{{Limit: 1, Period: time.Second}}, 3, 1, 1},
		// A tenth of 15 is 1.5: 1 left is under it, 2 is not.
		{"a tenth that is not whole", []Window{{Limit: 15, Period: time.Minute}}, 15, 15, 2},
		// The hour's 30 binds: 2, 1 and 0 left are under 3.
		{"the longer window near", []Window{{Limit: 100, Period: time.Minute}, {Limit: 30, Period: time.Hour}}, 40, 30, 3},
		// The minute binds, the day is far from its limit: only the 10th
		// admission, leaving the minute 0, counts.
		{"the shorter window near", []Window{{Limit: 10, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}, 12, 10, 1},
		// Both windows near at once: counted once per admission.
		{"both windows near", []Window{{Limit: 10, Period: time.Minute}, {Limit: 10, Period: time.Hour}}, 10, 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Every request decided by the script: no leases.
			f := newFixture(t, Options{MaxLease: 1})
			p := Policy{Name: "plan-" + tt.name, Windows: tt.windows}
			allowed := 0
			for range tt.requests {
				if f.allow(t, "k", p).Allowed() {
					allowed++
				}
			}
			if allowed != tt.allowed {
				t.Fatalf("%d admitted, want %d", allowed, tt.allowed)
			}
			if got := metricValue(t, f.l.met.nearLimit.WithLabelValues(p.Name)); got != tt.near {
				t.Errorf("near_limit_total = %v, want %v", got, tt.near)
			}
		})
	}
}

// TestNearLimitCountedOnLeases drives a busy key into its limit, so that
// admissions near it are answered from leases as well as by the script:
// both count, exactly the last tenth of the limit.
func TestNearLimitCountedOnLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	// Leases of up to 64 need 4 x 64 left: 256 to 499 left is near the
	// limit and leased.
	p := Policy{Name: "busy", Windows: []Window{{Limit: 5000, Period: 10 * time.Minute}}}
	var allowed, leasedNear int
	for range 5100 {
		d := f.allow(t, "k", p)
		if d.Allowed() {
			allowed++
			if d.Leased && d.Windows[0].Remaining*10 < 5000 {
				leasedNear++
			}
		}
		f.clk.Add(10 * time.Millisecond)
	}
	if allowed != 5000 {
		t.Fatalf("%d admitted, want 5000", allowed)
	}
	if leasedNear == 0 {
		t.Fatal("no admission near the limit was answered from a lease; the test does not reach that path")
	}
	// 499 down to 0 left: 500 admissions.
	if got := metricValue(t, f.l.met.nearLimit.WithLabelValues("busy")); got != 500 {
		t.Errorf("near_limit_total = %v, want 500 (%d of them leased)", got, leasedNear)
	}
}

// TestNearLimitInProcessAndShadow: limits kept in the process count the
// same; a plan in shadow mode counts nothing, its admissions being none.
func TestNearLimitInProcessAndShadow(t *testing.T) {
	t.Parallel()
	l, err := New(nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	enforced := Policy{Name: "local", Windows: []Window{{Limit: 20, Period: time.Minute}}}
	shadow := Policy{Name: "trial", Shadow: true, Windows: []Window{{Limit: 20, Period: time.Minute}}}
	for range 25 {
		for _, p := range []Policy{enforced, shadow} {
			if _, err := l.Allow(context.Background(), "k-"+p.Name, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := metricValue(t, l.met.nearLimit.WithLabelValues("local")); got != 2 {
		t.Errorf("in process: near_limit_total = %v, want 2", got)
	}
	if got := metricValue(t, l.met.nearLimit.WithLabelValues("trial")); got != 0 {
		t.Errorf("shadow plan: near_limit_total = %v, want 0", got)
	}
	if got := metricValue(t, l.met.shadowDecisions.WithLabelValues("trial", "allowed")); got != 20 {
		t.Errorf("shadow plan: %v shadow admissions, want 20 (the plan was decided)", got)
	}
}
