package ratelimit

import (
	"testing"
	"time"
)

func TestFormatPeriod(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Millisecond, "1ms"},
		{1500 * time.Millisecond, "1500ms"},
		{time.Second, "1s"},
		{90 * time.Second, "90s"},
		{time.Minute, "1m"},
		{150 * time.Minute, "150m"},
		{time.Hour, "1h"},
		{24 * time.Hour, "24h"},
		{7 * 24 * time.Hour, "168h"},
	} {
		if got := FormatPeriod(tc.d); got != tc.want {
			t.Errorf("FormatPeriod(%v) = %q, want %q", tc.d, got, tc.want)
		}
		if got := string(AppendPeriod([]byte(`"`), tc.d)); got != `"`+tc.want {
			t.Errorf("AppendPeriod(%q, %v) = %q, want %q", `"`, tc.d, got, `"`+tc.want)
		}
	}
}
