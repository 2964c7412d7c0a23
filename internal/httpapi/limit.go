package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/ratelimit"
)

// rateLimit asks the limiter about the authenticated key. Its answer goes
// into the rate-limit headers before the handler runs, so that every
// response (2xx and 4xx alike) carries them; a refusal is answered 429.
// The asking happens in admit, whose frame (the principal, the decision)
// is gone before the handler runs: the handler's stack stays as deep as
// without a limiter.
func (s *server) rateLimit(next http.Handler) http.Handler {
	if s.limiter == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.admit(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// admit decides r under its key's plan and sets the rate-limit headers;
// it answers a refusal or an error itself and then returns false. Its own
// frame holds little more than the decision: the limiter runs below it.
func (s *server) admit(w http.ResponseWriter, r *http.Request) bool {
	// Not requestInfoFrom: its fallback, inlined here, would put a whole
	// requestInfo in this frame.
	info, ok := r.Context().Value(requestInfoKey{}).(*requestInfo)
	if !ok || !info.authenticated {
		s.writeError(w, r, errors.New("rate limit: no principal in the request context"))
		return false
	}
	d, err := s.limiter.Allow(r.Context(), info.principal.KeyID, info.principal.Policy)
	if err != nil {
		s.limitError(w, r, info.principal.KeyID, err)
		return false
	}
	return s.apply(w, r, info, &d)
}

// apply answers r as the limiter decided d.
func (s *server) apply(w http.ResponseWriter, r *http.Request, info *requestInfo, d *ratelimit.Decision) bool {
	info.decision, info.shadow = d.Outcome.String(), d.Shadow
	if d.Shadow {
		// A plan in shadow mode has no limits as far as its clients
		// know: no headers, never refused; what enforcement would have
		// done goes to metrics and, for refusals, a debug line.
		if !d.Allowed() {
			s.logShadowRefusal(r, info.id, &info.principal, d)
		}
		return true
	}
	setLimitHeaders(w.Header(), d, time.Now, s.draftFields)
	if !d.Allowed() {
		s.writeError(w, r, &refusedError{decision: *d})
		return false
	}
	return true
}

// limitError answers a request the limiter could not decide.
func (s *server) limitError(w http.ResponseWriter, r *http.Request, keyID string, err error) {
	s.writeError(w, r, fmt.Errorf("rate limit key %s: %w", keyID, err))
}

// logShadowRefusal logs what a plan in shadow mode would have refused.
func (s *server) logShadowRefusal(r *http.Request, requestID string, p *apikey.Principal, d *ratelimit.Decision) {
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "ratelimit: shadow refusal",
		slog.String("request_id", requestID),
		slog.String("key_id", p.KeyID), slog.String("plan", p.Policy.Name),
		slog.String("outcome", d.Outcome.String()), slog.Duration("retry_after", d.RetryAfter))
}

// throttleByIP charges requests that are never authenticated (the OpenAPI
// document, unknown paths) to the per-IP throttle.
func (s *server) throttleByIP(next http.Handler) http.Handler {
	if s.throttle == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.chargeIP(w, r); err != nil {
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// throttleUsage charges GET /v1/rate_limit to the caller's own throttle for
// the operation, in place of the key's limits: asking spends none of the
// quota, and asking fast is refused before it costs Redis a peek. Its
// fields go into the response (the handler replaces them on a 200); over
// the limit the answer is 429 rate_limited, as anywhere.
func (s *server) throttleUsage(next http.Handler) http.Handler {
	if s.usageThrottle == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := principalFrom(r.Context())
		if !ok {
			s.writeError(w, r, errors.New("usage throttle: no principal in the request context"))
			return
		}
		d, err := s.usageThrottle.Allow(r.Context(), p.KeyID)
		if err != nil {
			s.writeError(w, r, fmt.Errorf("usage throttle %s: %w", p.KeyID, err))
			return
		}
		setLimitHeaders(w.Header(), &d, s.now, s.draftFields)
		if !d.Allowed() {
			s.writeError(w, r, &refusedError{decision: d})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseThrottled fails, as chargeIP does, when the request's client
// address is out of throttle budget, and charges nothing otherwise; it
// reports whether it charged.
func (s *server) refuseThrottled(w http.ResponseWriter, r *http.Request) (bool, error) {
	if s.throttle == nil {
		return false, nil
	}
	key := throttleKey(requestInfoFrom(r.Context()).clientIP)
	throttled, err := s.throttle.Throttled(r.Context(), key)
	if err != nil {
		return false, fmt.Errorf("throttle %s: %w", key, err)
	}
	if !throttled {
		return false, nil
	}
	// Charging a throttled address refuses it with the right headers and
	// Retry-After, and changes nothing (unless budget came back meanwhile).
	return true, s.chargeIP(w, r)
}

// chargeIP counts the request against its client address's throttle and
// sets the throttle's headers. It fails with *refusedError when the address
// is over its limit.
func (s *server) chargeIP(w http.ResponseWriter, r *http.Request) error {
	if s.throttle == nil {
		return nil
	}
	key := throttleKey(requestInfoFrom(r.Context()).clientIP)
	d, err := s.throttle.Allow(r.Context(), key)
	if err != nil {
		return fmt.Errorf("throttle %s: %w", key, err)
	}
	setLimitHeaders(w.Header(), &d, time.Now, s.draftFields)
	if !d.Allowed() {
		return &refusedError{decision: d}
	}
	return nil
}

// The rate-limit fields, spelled as the API specification and
// draft-ietf-httpapi-ratelimit-headers spell them. Field names are
// case-insensitive, but logs, documentation and exact-match tooling read the
// spelling, and http.Header.Set would send the canonical X-Ratelimit-Limit
// and Ratelimit-Policy; so setLimitHeaders writes these spellings into the
// header map itself.
const (
	headerLimit     = "X-RateLimit-Limit"
	headerRemaining = "X-RateLimit-Remaining"
	headerReset     = "X-RateLimit-Reset"
	headerPolicy    = "RateLimit-Policy"
	headerRateLimit = "RateLimit"
)

// limitNames are the rate-limit fields in the order setLimitHeaders
// writes them: the specification's three, then the draft's two.
var limitNames = [...]string{headerLimit, headerRemaining, headerReset, headerPolicy, headerRateLimit}

// canonicalLimitNames are the canonical spellings of the rate-limit
// fields (http.CanonicalHeaderKey), which setLimitHeaders removes so that
// a response never carries a field twice.
var canonicalLimitNames = [...]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit"}

// setLimitHeaders describes a decision in two vocabularies:
//
//   - X-RateLimit-Limit, -Remaining and -Reset (Unix seconds, rounded up),
//     the fields the API specification names, for the binding window;
//   - RateLimit-Policy listing every window and RateLimit for the binding
//     one, per draft-ietf-httpapi-ratelimit-headers, each window named by
//     its period: RateLimit-Policy: "1m";q=60;w=60, "24h";q=1000;w=86400
//     and RateLimit: "1m";r=12;t=30.
//
// A refused request has nothing remaining; a banned key's window resets
// no earlier than its ban ends. Times are measured on the clock that made
// the decision (Redis's, for shared decisions) when it says which, as
// every decision of the limiter and the throttle does; the clock now is
// read only for one that does not (a read is 65 ns on some virtual
// machines). The values are written into one buffer and share one string
// and one slice: every limited response carries them. draft adds the
// draft's two fields (Config.DraftLimitFields).
func setLimitHeaders(h http.Header, d *ratelimit.Decision, clock func() time.Time, draft bool) {
	if len(d.Windows) == 0 {
		return
	}
	now := d.Time
	if now.IsZero() {
		now = clock()
	}
	bound := d.Bound()
	remaining, reset := bound.Remaining, bound.Reset
	if !d.Allowed() {
		remaining = 0
	}
	if d.Outcome == ratelimit.Banned {
		reset = later(reset, now.Add(d.RetryAfter))
	}
	reset = later(reset, now)

	// Built in a buffer on the stack (two windows take about 80 bytes),
	// then copied once into the string that every value cuts.
	var ends [5]int
	var buf [192]byte
	b := buf[:0]
	b = strconv.AppendInt(b, bound.Limit, 10)
	ends[0] = len(b)
	b = strconv.AppendInt(b, remaining, 10)
	ends[1] = len(b)
	b = strconv.AppendInt(b, ceilUnix(reset), 10)
	ends[2] = len(b)
	fields := len(limitNames)
	if draft {
		for i, w := range d.Windows {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPolicyName(b, w.Period)
			b = append(b, ";q="...)
			b = strconv.AppendInt(b, w.Limit, 10)
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, max(ceilSeconds(w.Period), 1), 10)
		}
		ends[3] = len(b)
		b = appendPolicyName(b, bound.Period)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(reset.Sub(now)), 10)
		ends[4] = len(b)
	} else {
		// The specification's three alone: a draft field set earlier
		// (a throttle's, before the key's) goes too.
		fields = 3
		for i := fields; i < len(limitNames); i++ {
			delete(h, limitNames[i])
			delete(h, canonicalLimitNames[i])
		}
	}

	all := string(b)
	vals := make([]string, fields)
	from := 0
	for i, name := range limitNames[:fields] {
		delete(h, canonicalLimitNames[i])
		vals[i] = all[from:ends[i]]
		h[name] = vals[i : i+1 : i+1]
		from = ends[i]
	}
}

// appendPolicyName appends a window's name as the rate-limit fields quote
// it: its period, "1m" or "24h" (FormatPeriod's digits and unit need no
// escaping).
func appendPolicyName(b []byte, period time.Duration) []byte {
	b = append(b, '"')
	b = ratelimit.AppendPeriod(b, period)
	return append(b, '"')
}

// clearLimitHeaders removes the rate-limit fields, in either spelling.
func clearLimitHeaders(h http.Header) {
	for _, name := range limitNames {
		h.Del(name)
		delete(h, name)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ceilSeconds rounds d up to whole seconds (never below zero).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ceilUnix is t in Unix seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}
