package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/animal-store/petstore/internal/apikey"
)

// authenticate resolves the bearer key to a principal and puts it in the
// request's context. A request without a valid key is answered 401, after
// being charged to the per-IP throttle (which may answer 429 instead), so
// that guessing keys costs the guesser its throttle. When keys cannot be
// checked at all the answer is 503.
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.principal(r)
		if err == nil {
			requestInfoFrom(r.Context()).keyID = p.KeyID
			next.ServeHTTP(w, r.WithContext(apikey.NewContext(r.Context(), p)))
			return
		}
		if r.Context().Err() != nil {
			s.writeError(w, r, fmt.Errorf("authenticate: %w", r.Context().Err()))
			return
		}
		reason := apikey.Reason(err)
		s.metrics.authFailures.WithLabelValues(reason).Inc()
		switch {
		case errors.Is(err, apikey.ErrUnavailable):
			s.writeError(w, r, &unavailableError{what: "authenticate", err: err})
			return
		case reason == "error":
			s.writeError(w, r, fmt.Errorf("authenticate: %w", err))
			return
		}
		if err := s.chargeIP(w, r); err != nil {
			s.writeError(w, r, err)
			return
		}
		s.writeError(w, r, err)
	})
}

// principal authenticates the request's bearer key.
func (s *server) principal(r *http.Request) (apikey.Principal, error) {
	token, err := bearerToken(r.Header)
	if err != nil {
		return apikey.Principal{}, err
	}
	return s.auth.Authenticate(r.Context(), token)
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
