package plan_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

func TestParsePeriod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "1s", want: time.Second},
		{in: "10s", want: 10 * time.Second},
		{in: "1m", want: time.Minute},
		{in: "24h", want: day},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "1ms", want: time.Millisecond},
		{in: "7d", want: 7 * day},
		{in: "1d12h", want: 36 * time.Hour},
		{in: " 2d ", want: 2 * day},
		{in: "", err: true},
		{in: "d", err: true},
		{in: "0d", err: true},
		{in: "0s", err: true},
		{in: "999us", err: true},
		{in: "60", err: true},
		{in: "-1m", err: true},
		{in: "-1d", err: true},
		{in: "+1d", err: true},
		{in: "1d-5m", err: true},
		{in: "1.5d", err: true},
		{in: "1w", err: true},
		{in: "7x", err: true},
		{in: "99999999999d", err: true},
	}
	for _, tt := range tests {
		got, err := plan.ParsePeriod(tt.in)
		if tt.err {
			if err == nil {
				t.Errorf("ParsePeriod(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParsePeriod(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// TestPeriodRoundTrips: every period the limiter accepts, from 1 ms to 366
// days at any precision, is written by ratelimit.FormatPeriod (plans and
// keys exported, overrides stored in PostgreSQL, the rate-limit fields'
// names) as text that ParsePeriod (and time.ParseDuration, for stored
// overrides) reads back as the same period: none is rounded to a coarser
// unit on the way.
func TestPeriodRoundTrips(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	units := []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond, time.Second, time.Minute, time.Hour, day}
	periods := []time.Duration{ratelimit.MinPeriod, ratelimit.MaxPeriod, 1500 * time.Microsecond, time.Millisecond + time.Nanosecond, day - time.Nanosecond}
	for range 20_000 {
		// A whole number of a random unit, then and now a remainder.
		u := units[rng.IntN(len(units))]
		d := time.Duration(1+rng.Int64N(int64(ratelimit.MaxPeriod/u))) * u
		if rng.IntN(3) == 0 {
			d += time.Duration(rng.Int64N(int64(u)))
		}
		if d >= ratelimit.MinPeriod && d <= ratelimit.MaxPeriod {
			periods = append(periods, d)
		}
	}
	for _, d := range periods {
		s := ratelimit.FormatPeriod(d)
		if got, err := plan.ParsePeriod(s); err != nil || got != d {
			t.Fatalf("FormatPeriod(%d ns) = %q, read back as %v (%v)", int64(d), s, got, err)
		}
		// The key store reads stored overrides with time.ParseDuration.
		if got, err := time.ParseDuration(s); err != nil || got != d {
			t.Fatalf("FormatPeriod(%d ns) = %q, which time.ParseDuration reads as %v (%v)", int64(d), s, got, err)
		}
	}
}

func TestParseQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want string
		err  string
	}{
		{in: "300/1m", want: "300/1m"},
		{in: " 5000 / 7d ", want: "5000/168h"},
		{in: "1/1s", want: "1/1s"},
		{in: "300", err: "LIMIT/PERIOD"},
		{in: "0/1m", err: "from 1 to 1000000000"},
		{in: "1000000001/1m", err: "from 1 to 1000000000"},
		{in: "1/367d", err: "at most 366d"},
		{in: "x/1m", err: "whole number"},
		{in: "10/1x", err: "want a duration"},
	}
	for _, tt := range tests {
		got, err := plan.ParseQuota(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseQuota(%q) error = %v, want one containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseQuota(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	if got := plan.FormatQuotas([]ratelimit.Window{w(60, time.Minute), w(1000, day)}); got != "60/1m,1000/24h" {
		t.Errorf("FormatQuotas = %q", got)
	}
}
