package ratelimit

// Policies: a policy is compiled only after Validate accepts it: a window at
// least, limits from 1 to MaxLimit, periods from MinPeriod to MaxPeriod, no
// period twice in Windows or in Candidate, and sound ban settings.

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"
)

// Window is one quota: at most Limit requests in any interval of length Period.
type Window struct {
	Limit  int64
	Period time.Duration
}

func (w Window) String() string { return fmt.Sprintf("%d/%s", w.Limit, FormatPeriod(w.Period)) }

// BanPolicy bans keys that keep sending while limited; its zero value, none.
type BanPolicy struct {
	// Threshold: more rejections within StrikeWindow ban a key (0: no bans).
	Threshold int64
	// StrikeWindow is the period in which rejected requests are counted.
	StrikeWindow time.Duration
	// Base is the length of a first ban.
	Base time.Duration
	// Multiplier grows each further ban (Base*Multiplier^(offence-1)).
	Multiplier float64
	// Max caps a ban's length (0: no cap).
	Max time.Duration
	// Memory is how long past offences count towards escalation.
	Memory time.Duration
}

// Enabled reports whether the policy bans at all.
func (b BanPolicy) Enabled() bool { return b.Threshold > 0 && b.Base > 0 }

// Duration returns the n-th ban's length, Base*Multiplier^(n-1), capped.
func (b BanPolicy) Duration(n int64) time.Duration {
	d := float64(b.Base)
	m := b.Multiplier
	if m < 1 {
		m = 1
	}
	limit := float64(maxBan)
	if b.Max > 0 {
		limit = float64(b.Max)
	}
	for i := int64(1); i < n && d < limit && m > 1; i++ {
		d *= m
	}
	if d > limit {
		d = limit
	}
	return time.Duration(d)
}

// maxBan bounds ban lengths when BanPolicy.Max is zero, far from overflow.
const maxBan = time.Duration(1) << 62

// Policy is everything the limiter needs to decide for one key: its quota
// windows and its ban rules. Name is used only for metrics and logs.
type Policy struct {
	Name    string
	Windows []Window
	Ban     BanPolicy
	// Candidate windows measure proposed limits on live traffic and never
	// refuse. Their records are their own (CandidateBuckets per period).
	// Keys with candidates get no leases: each request must be evaluated.
	Candidate []Window
	// CandidateBan is the ban policy the candidate windows would enforce; it
	// bans nothing, keeps a record of its own, and needs Candidate windows.
	CandidateBan BanPolicy
	// Shadow records every decision but enforces none. Refusals are not
	// counted in the windows, as if they had been enforced.
	Shadow bool
}

// Validate reports a policy the limiter cannot enforce.
func (p Policy) Validate() error {
	if len(p.Windows) == 0 {
		return errors.New("ratelimit: policy has no windows")
	}
	seen := map[time.Duration]bool{}
	for _, w := range p.Windows {
		if w.Limit < 1 || w.Limit > MaxLimit {
			return fmt.Errorf("ratelimit: window %s: limit must be from 1 to %d", w, MaxLimit)
		}
		if err := checkPeriod(w.Period); err != nil {
			return fmt.Errorf("ratelimit: window %s: %w", w, err)
		}
		if seen[w.Period] {
			return fmt.Errorf("ratelimit: two windows with period %s", FormatPeriod(w.Period))
		}
		seen[w.Period] = true
	}
	cseen := map[time.Duration]bool{}
	for _, w := range p.Candidate {
		if w.Limit < 1 || w.Limit > MaxLimit {
			return fmt.Errorf("ratelimit: candidate window %s: limit must be from 1 to %d", w, MaxLimit)
		}
		if err := checkPeriod(w.Period); err != nil {
			return fmt.Errorf("ratelimit: candidate window %s: %w", w, err)
		}
		if cseen[w.Period] {
			return fmt.Errorf("ratelimit: two candidate windows with period %s", FormatPeriod(w.Period))
		}
		cseen[w.Period] = true
	}
	if err := p.Ban.validate("ban"); err != nil {
		return err
	}
	if err := p.CandidateBan.validate("candidate ban"); err != nil {
		return err
	}
	if p.CandidateBan.Enabled() && len(p.Candidate) == 0 {
		return errors.New("ratelimit: a candidate ban policy needs candidate windows")
	}
	return nil
}

// validate reports ban settings the limiter cannot enforce; what names them.
func (b BanPolicy) validate(what string) error {
	if b.Threshold < 0 || b.Base < 0 || b.Max < 0 || b.StrikeWindow < 0 || b.Memory < 0 {
		return fmt.Errorf("ratelimit: %s settings must not be negative", what)
	}
	if b.Enabled() {
		if err := checkPeriod(b.StrikeWindow); err != nil {
			return fmt.Errorf("ratelimit: %s strike window: %w", what, err)
		}
		if b.Threshold > MaxLimit {
			return fmt.Errorf("ratelimit: %s threshold must be at most %d", what, MaxLimit)
		}
		if b.Max > 0 && b.Max < b.Base {
			return fmt.Errorf("ratelimit: %s max must be at least its base", what)
		}
	}
	return nil
}

func checkPeriod(d time.Duration) error {
	if d < MinPeriod || d > MaxPeriod {
		return fmt.Errorf("period must be from %s to %s", FormatPeriod(MinPeriod), FormatPeriod(MaxPeriod))
	}
	return nil
}

func (p Policy) clone() Policy {
	p.Windows = append([]Window(nil), p.Windows...)
	p.Candidate = append([]Window(nil), p.Candidate...)
	return p
}

// Sorted returns a copy of p with its windows ordered by ascending period.
func (p Policy) Sorted() Policy {
	sorted := func(in []Window) []Window {
		ws := append([]Window(nil), in...)
		sort.Slice(ws, func(i, j int) bool { return ws[i].Period < ws[j].Period })
		return ws
	}
	p.Windows = sorted(p.Windows)
	if len(p.Candidate) > 0 {
		p.Candidate = sorted(p.Candidate)
	}
	return p
}

// FormatPeriod prints a period exactly, in the largest unit that divides it
// (1m, 1500ms): plans, keys and overrides are written with it and read back.
func FormatPeriod(d time.Duration) string {
	return string(AppendPeriod(make([]byte, 0, 8), d))
}

// AppendPeriod appends FormatPeriod(d) to b; hours stay hours ("24h").
func AppendPeriod(b []byte, d time.Duration) []byte {
	unit, name := time.Nanosecond, "ns"
	switch {
	case d%time.Hour == 0:
		unit, name = time.Hour, "h"
	case d%time.Minute == 0:
		unit, name = time.Minute, "m"
	case d%time.Second == 0:
		unit, name = time.Second, "s"
	case d%time.Millisecond == 0:
		unit, name = time.Millisecond, "ms"
	case d%time.Microsecond == 0:
		unit, name = time.Microsecond, "us"
	}
	return append(strconv.AppendInt(b, int64(d/unit), 10), name...)
}

// Outcome is what the limiter decided.
type Outcome int

// Outcomes of a decision.
const (
	Allowed Outcome = iota
	Limited
	Banned
)

func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	case Banned:
		return "banned"
	}
	return "unknown"
}

// WindowState is one window's standing after a decision.
type WindowState struct {
	Window
	// Remaining is how many more requests the window admits now.
	Remaining int64
	// Reset is when Remaining is back to Limit.
	Reset time.Time
}

// Decision is the answer for one request.
type Decision struct {
	Outcome Outcome
	// Windows holds every window of the policy, ordered by period.
	Windows []WindowState
	// Binding indexes the window with the fewest remaining (longer on a tie).
	Binding int
	// RetryAfter is, for a refused request, when one would be admitted.
	RetryAfter time.Duration
	// Candidate holds the candidate windows as this request left them, and
	// CandidateOutcome what they would have decided (Allowed without any).
	Candidate        []WindowState
	CandidateOutcome Outcome
	// Shadow: Outcome is what enforcement would decide; do not enforce it.
	Shadow bool
	// Degraded: Redis could not be reached; this process decided alone.
	Degraded bool
	// Cached: the rejection cache answered, without a round trip.
	Cached bool
	// Leased: admitted from a lease, without a round trip.
	Leased bool
	// Time is when the decision was made, by the clock that made it (for a
	// lease, its round trip's server time plus the local time since).
	Time time.Time
}

// Allowed reports whether the request may proceed.
func (d Decision) Allowed() bool { return d.Outcome == Allowed }

// Bound returns the window that binds first.
func (d Decision) Bound() WindowState {
	if len(d.Windows) == 0 {
		return WindowState{}
	}
	return d.Windows[d.Binding]
}

// ErrUnavailable is returned, failing closed, when Redis cannot answer in time.
var ErrUnavailable = errors.New("ratelimit: shared store unavailable")
