package plan

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// Day is the length of a "d" in a period: always 24 hours, whatever the
// calendar or daylight saving time says, because a quota window slides and
// is never aligned to midnight.
const Day = 24 * time.Hour

// ParsePeriod parses a quota period: a Go duration ("10s", "1m", "24h",
// "1h30m", "500ms") optionally preceded by a whole number of days ("7d",
// "1d12h"). The period must be at least 1ms.
func ParsePeriod(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	var days int64
	if i := strings.IndexByte(in, 'd'); i > 0 {
		n, err := strconv.ParseInt(in[:i], 10, 64)
		if err != nil || !isDigits(in[:i]) || n > maxDays {
			return 0, periodError(s)
		}
		days, in = n, in[i+1:]
	}
	var rest time.Duration
	if in != "" {
		d, err := time.ParseDuration(in)
		if err != nil || d < 0 || strings.HasPrefix(in, "+") {
			return 0, periodError(s)
		}
		rest = d
	} else if days == 0 {
		return 0, periodError(s)
	}
	d := time.Duration(days)*Day + rest
	if d < rest {
		return 0, periodError(s)
	}
	if d < time.Millisecond {
		return 0, fmt.Errorf("period %q: must be at least 1ms", s)
	}
	return d, nil
}

func isDigits(s string) bool {
	return strings.Trim(s, "0123456789") == ""
}

// maxDays keeps days*Day from overflowing a time.Duration.
const maxDays = int64(1<<63-1) / int64(Day)

func periodError(s string) error {
	return fmt.Errorf("period %q: want a duration such as 10s, 1m, 24h or 7d", s)
}

// ParseQuota parses a quota written LIMIT/PERIOD, e.g. "300/1m" or
// "5000/7d": the one way the command line and the settings write a quota
// (a key's own, the auth failure limit).
func ParseQuota(s string) (ratelimit.Window, error) {
	n, p, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return ratelimit.Window{}, fmt.Errorf("quota %q: want LIMIT/PERIOD, e.g. 300/1m", s)
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
	if err != nil || limit < 1 || limit > ratelimit.MaxLimit {
		return ratelimit.Window{}, fmt.Errorf("quota %q: limit must be a whole number from 1 to %d", s, ratelimit.MaxLimit)
	}
	period, err := ParseQuotaPeriod(p)
	if err != nil {
		return ratelimit.Window{}, fmt.Errorf("quota %q: %w", s, err)
	}
	return ratelimit.Window{Limit: limit, Period: period}, nil
}

// FormatQuotas prints windows as LIMIT/PERIOD, as the command line takes
// them: "60/1m,1000/24h".
func FormatQuotas(ws []ratelimit.Window) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = w.String()
	}
	return strings.Join(parts, ",")
}
