package plan_test

import (
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
