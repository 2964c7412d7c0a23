package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// rateLimitBody is the RateLimit schema: where a key stands, as the limiter
// counts it.
type rateLimitBody struct {
	Plan string `json:"plan"`
	// Mode is the plan's mode: "enforce", or "shadow" when its limits are
	// measured and never enforced.
	Mode    string            `json:"mode"`
	Windows []rateLimitWindow `json:"windows"`
	// Candidate holds the key's candidate windows (its plan's, with the
	// key's own over them): proposed quotas measured on the key's
	// requests and never enforced.
	Candidate []rateLimitWindow `json:"candidate,omitempty"`
	// CandidateBan is the ban the plan's candidate ban policy would have
	// the key under, measured and never enforced; absent without one.
	CandidateBan *rateLimitBan `json:"candidateBan,omitempty"`
	Ban          rateLimitBan  `json:"ban"`
}

// rateLimitWindow is the RateLimitWindow schema: one quota window. Any
// other list of windows the body may carry takes this shape too.
type rateLimitWindow struct {
	Period    string `json:"period"` // as RateLimit-Policy names it: 1m, 24h
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	Reset     int64  `json:"reset"` // Unix seconds, rounded up, as X-RateLimit-Reset
}

// rateLimitBan is the RateLimitBan schema: the key's ban, if any, and what
// counts toward the next.
type rateLimitBan struct {
	Banned bool `json:"banned"`
	// Until and RetryAfter are set only while banned.
	Until      int64 `json:"until,omitempty"`
	RetryAfter int64 `json:"retryAfter,omitempty"`
	Strikes    int64 `json:"strikes"`
	Offences   int64 `json:"offences"`
}

// errSharedCountsUnreachable is a Usage answer made up by this replica
// alone because Redis did not answer.
var errSharedCountsUnreachable = errors.New("the shared counts cannot be read (Redis unreachable)")

// handleRateLimit answers GET /v1/rate_limit: the caller's quota under its
// effective policy (per-key overrides included), read without counting a
// request. Without the shared counts it answers 503 in either failure
// mode: what a replica knows alone is a guess at its own share, not where
// the key stands.
func handleRateLimit(usage UsageReader, now func() time.Time, draftFields bool, fail errorWriter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := queryParams(r); err != nil {
			fail(w, r, err)
			return
		}
		p, ok := principalFrom(r.Context())
		if !ok {
			fail(w, r, errors.New("rate_limit: no principal in the request context"))
			return
		}
		u, err := usage.Usage(r.Context(), p.KeyID, p.Policy)
		if err == nil && u.Degraded {
			err = &unavailableError{what: "rate_limit", err: errSharedCountsUnreachable}
		}
		if err != nil {
			fail(w, r, fmt.Errorf("rate_limit %s: %w", p.KeyID, err))
			return
		}
		t := now()
		// The fields the operation's throttle set describe the throttle;
		// a 200 describes the quota, as every other operation's does, and
		// a plan in shadow mode has none.
		h := w.Header()
		clearLimitHeaders(h)
		if !p.Policy.Shadow {
			d := usageDecision(u, t)
			setLimitHeaders(h, &d, func() time.Time { return t }, draftFields)
		}
		body := rateLimitBody{Plan: p.Plan, Mode: "enforce", Windows: rateLimitWindows(u.Windows, t), Ban: banState(u.Strikes, u.Offences, u.BannedUntil, t)}
		if p.Policy.Shadow {
			body.Mode = "shadow"
		}
		if len(u.Candidate) > 0 {
			body.Candidate = rateLimitWindows(u.Candidate, t)
		}
		if p.Policy.CandidateBan.Enabled() {
			b := banState(u.CandidateStrikes, u.CandidateOffences, u.CandidateBannedUntil, t)
			body.CandidateBan = &b
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// banState states a ban's standing at now in the RateLimitBan shape: its
// strikes, remembered offences and, when banned (until is not zero), when
// it ends.
func banState(strikes, offences int64, until, now time.Time) rateLimitBan {
	b := rateLimitBan{Strikes: strikes, Offences: offences}
	if !until.IsZero() {
		b.Banned, b.Until, b.RetryAfter = true, ceilUnix(until), retryAfterSeconds(until.Sub(now))
	}
	return b
}

// rateLimitWindows states windows in the RateLimitWindow shape; a reset
// already past is now.
func rateLimitWindows(ws []ratelimit.WindowUsage, now time.Time) []rateLimitWindow {
	out := make([]rateLimitWindow, len(ws))
	for i, w := range ws {
		out[i] = rateLimitWindow{
			Period:    ratelimit.FormatPeriod(w.Period),
			Limit:     w.Limit,
			Used:      w.Used,
			Remaining: w.Remaining,
			Reset:     ceilUnix(later(w.Reset, now)),
		}
	}
	return out
}

// usageDecision is the decision the rate-limit fields describe for a peek
// at u: the binding window as a request now would find it (nothing is
// spent), and while banned nothing remaining until the ban ends.
func usageDecision(u ratelimit.Usage, now time.Time) ratelimit.Decision {
	d := ratelimit.Decision{Outcome: ratelimit.Allowed, Time: now, Windows: make([]ratelimit.WindowState, len(u.Windows))}
	for i, w := range u.Windows {
		d.Windows[i] = ratelimit.WindowState{Window: w.Window, Remaining: w.Remaining, Reset: w.Reset}
		// Windows are ordered by period, so <= prefers the longer on a
		// tie, as the limiter's decisions do.
		if w.Remaining <= d.Windows[d.Binding].Remaining {
			d.Binding = i
		}
	}
	if !u.BannedUntil.IsZero() {
		d.Outcome = ratelimit.Banned
		d.RetryAfter = u.BannedUntil.Sub(now)
	}
	return d
}
