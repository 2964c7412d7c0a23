package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/animal-store/petstore/internal/apikey"
)

// authenticate resolves the bearer key to a principal and puts it in the
// request's context. Guessing keys costs the guesser its per-IP throttle,
// and the key database never pays for a throttled guesser: before a key
// that needs a database lookup (well formed, neither static nor cached) is
// looked up, the address's throttle is consulted (not charged), and an
// address out of budget is answered 429 with no query, so its made-up keys
// never reach the database or the key cache. Every refused key is charged
// after, so a guesser runs out of budget within its burst; keys that are
// found are never charged, so many keys behind one address (a NAT) are not
// throttled by their lookups. A throttled request is answered 429, a
// refused key 401, and 503 when keys cannot be checked at all.
//
// The work happens in identify, whose frame is gone before the rest of
// the chain runs, so that the handler and the limiter below run no deeper
// than they must (see (*server).rateLimit).
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.identify(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// identify puts the request's principal in its context and returns true,
// or answers the request itself and returns false.
func (s *server) identify(w http.ResponseWriter, r *http.Request) bool {
	// What the throttle said before a lookup, in one variable: the
	// closure shares it, and one allocation is cheaper than two.
	var guard struct {
		charged   bool
		throttled error
	}
	p, err := s.principal(r, func() error {
		guard.charged, guard.throttled = s.refuseThrottled(w, r)
		return guard.throttled
	})
	if err == nil {
		info := requestInfoFrom(r.Context())
		info.principal, info.authenticated = p, true
		return true
	}
	if r.Context().Err() != nil {
		s.writeError(w, r, fmt.Errorf("authenticate: %w", r.Context().Err()))
		return false
	}
	if guard.throttled != nil {
		// Refused (or undecidable) before the key database was asked.
		s.metrics.authFailures.WithLabelValues("throttled").Inc()
		s.writeError(w, r, guard.throttled)
		return false
	}
	reason := apikey.Reason(err)
	s.metrics.authFailures.WithLabelValues(reason).Inc()
	switch {
	case errors.Is(err, apikey.ErrUnavailable):
		s.writeError(w, r, &unavailableError{what: "authenticate", err: err})
		return false
	case reason == "error":
		s.writeError(w, r, fmt.Errorf("authenticate: %w", err))
		return false
	}
	if !guard.charged {
		if err := s.chargeIP(w, r); err != nil {
			s.writeError(w, r, err)
			return false
		}
	}
	s.writeError(w, r, err)
	return false
}

// principal authenticates the request's bearer key, calling beforeLookup
// first when that needs the key database.
func (s *server) principal(r *http.Request, beforeLookup func() error) (apikey.Principal, error) {
	token, err := bearerToken(r.Header)
	if err != nil {
		return apikey.Principal{}, err
	}
	return s.auth.Authenticate(r.Context(), token, beforeLookup)
}

// bearerToken returns the key of the request's one Authorization header,
// "Bearer <key>" (apikey.ParseAuthorization: the scheme in any case). A
// header that is not of that form, or that holds more than one token, is
// errAuthorizationSyntax; a missing or empty one is apikey.ErrMissing.
func bearerToken(h http.Header) (string, error) {
	values := h.Values("Authorization")
	switch len(values) {
	case 0:
		return "", apikey.ErrMissing
	case 1:
	default:
		return "", errAuthorizationSyntax
	}
	token, err := apikey.ParseAuthorization(values[0])
	switch {
	case errors.Is(err, apikey.ErrMalformed):
		return "", fmt.Errorf("%w (%w)", errAuthorizationSyntax, err)
	case err != nil:
		return "", err
	case strings.ContainsAny(token, " \t"):
		return "", errAuthorizationSyntax
	}
	return token, nil
}
