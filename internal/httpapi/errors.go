package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/ratelimit"
)

// Error codes of the Error body (the code enum of openapi.yaml).
const (
	codeInvalidRequest       = "invalid_request"
	codeUnauthorized         = "unauthorized"
	codeNotFound             = "not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codePayloadTooLarge      = "payload_too_large"
	codeUnsupportedMediaType = "unsupported_media_type"
	codeIdempotencyKeyReused = "idempotency_key_reused"
	codeRateLimited          = "rate_limited"
	codeKeyBanned            = "key_banned"
	codeInternalError        = "internal_error"
	codeUnavailable          = "unavailable"
)

// errorBody is the Error schema.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// errorWriter answers a request with the Error body err maps to.
type errorWriter func(w http.ResponseWriter, r *http.Request, err error)

// Errors raised by the HTTP layer itself; the domain's come from package pet.
var (
	errNoRoute              = errors.New("no resource at this path")
	errUnsupportedMediaType = errors.New("content type is not application/json")
	// errAuthorizationSyntax is an Authorization header that is not
	// "Bearer <key>"; it counts as a malformed key.
	errAuthorizationSyntax = fmt.Errorf("%w: the Authorization header must be \"Bearer <key>\"", apikey.ErrMalformed)
)

// methodNotAllowedError is a request for a method the resource lacks.
type methodNotAllowedError struct {
	method string
	allow  []string
}

func (e *methodNotAllowedError) Error() string {
	return fmt.Sprintf("method %s not allowed; allowed: %s", e.method, strings.Join(e.allow, ", "))
}

// refusedError is a request the limiter or the throttle did not admit.
type refusedError struct {
	decision ratelimit.Decision
}

func (e *refusedError) Error() string { return "rate limit: " + e.decision.Outcome.String() }

// unavailableError is a dependency that could not answer in time, so the
// request can be retried shortly (503).
type unavailableError struct {
	what string
	err  error
}

func (e *unavailableError) Error() string { return e.what + ": " + e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// storeError is a failed store call; op labels petstore_store_errors_total.
type storeError struct {
	op  string
	err error
}

func (e *storeError) Error() string { return "store " + e.op + ": " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// writeError is the one place that turns an error into a status and an Error
// body. Client mistakes are answered in full; anything unexpected is a 500
// whose cause is logged once, with the request id, and never sent.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		validation  *pet.ValidationError
		tooLarge    *http.MaxBytesError
		notAllowed  *methodNotAllowedError
		refused     *refusedError
		unavailable *unavailableError
		failedStore *storeError
	)
	h := w.Header()
	switch {
	case errors.As(err, &validation):
		s.respondError(w, http.StatusBadRequest, codeInvalidRequest, validation.Error())
	case errors.As(err, &tooLarge):
		s.respondError(w, http.StatusRequestEntityTooLarge, codePayloadTooLarge,
			fmt.Sprintf("request body must be at most %d bytes", tooLarge.Limit))
	case errors.Is(err, errUnsupportedMediaType):
		s.respondError(w, http.StatusUnsupportedMediaType, codeUnsupportedMediaType,
			"Content-Type must be application/json (charset, if given, utf-8)")
	case errors.Is(err, errNoRoute):
		s.respondError(w, http.StatusNotFound, codeNotFound, "no resource at "+shorten(r.URL.Path))
	case errors.As(err, &notAllowed):
		h.Set("Allow", strings.Join(notAllowed.allow, ", "))
		s.respondError(w, http.StatusMethodNotAllowed, codeMethodNotAllowed,
			fmt.Sprintf("method %s is not allowed here; allowed: %s", notAllowed.method, strings.Join(notAllowed.allow, ", ")))
	case errors.Is(err, pet.ErrNotFound):
		s.respondError(w, http.StatusNotFound, codeNotFound, "pet not found")
	case errors.Is(err, pet.ErrIdempotencyConflict):
		s.respondError(w, http.StatusUnprocessableEntity, codeIdempotencyKeyReused,
			"Idempotency-Key was already used with a different request body; use a new key for a new request")
	case errors.Is(err, apikey.ErrMissing):
		h.Set("WWW-Authenticate", `Bearer realm="petstore"`)
		s.respondError(w, http.StatusUnauthorized, codeUnauthorized, "API key required: send Authorization: Bearer <key>")
	case errors.Is(err, errAuthorizationSyntax):
		h.Set("WWW-Authenticate", `Bearer realm="petstore", error="invalid_request", error_description="Authorization must be Bearer <key>"`)
		s.respondError(w, http.StatusUnauthorized, codeUnauthorized, "malformed Authorization header: send Authorization: Bearer <key>")
	case errors.Is(err, apikey.ErrMalformed), errors.Is(err, apikey.ErrUnknown), errors.Is(err, apikey.ErrRevoked):
		// One answer for every refused key: which it was is for logs and
		// metrics, not for whoever holds the key.
		h.Set("WWW-Authenticate", `Bearer realm="petstore", error="invalid_token", error_description="invalid API key"`)
		s.respondError(w, http.StatusUnauthorized, codeUnauthorized, "invalid API key")
	case errors.As(err, &refused):
		retry := retryAfterSeconds(refused.decision.RetryAfter)
		h.Set("Retry-After", strconv.FormatInt(retry, 10))
		if refused.decision.Outcome == ratelimit.Banned {
			s.respondError(w, http.StatusTooManyRequests, codeKeyBanned,
				fmt.Sprintf("API key temporarily banned for repeated requests over its rate limit; retry after %d s", retry))
			return
		}
		s.respondError(w, http.StatusTooManyRequests, codeRateLimited,
			fmt.Sprintf("rate limit exceeded; retry after %d s", retry))
	case r.Context().Err() != nil && errors.Is(err, context.Canceled):
		// The client went away: nobody reads an answer and it is no
		// server fault, so log quietly and count it as 499.
		requestInfoFrom(r.Context()).clientGone = true
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "client closed request",
			slog.String("request_id", requestIDFrom(r.Context())), slog.String("error", err.Error()))
	case errors.As(err, &unavailable), errors.Is(err, ratelimit.ErrUnavailable), errors.Is(err, pet.ErrUnavailable):
		if errors.As(err, &failedStore) {
			s.metrics.storeErrors.WithLabelValues(failedStore.op).Inc()
		}
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "dependency unavailable",
			slog.String("request_id", requestIDFrom(r.Context())), slog.String("error", err.Error()))
		h.Set("Retry-After", "1")
		s.respondError(w, http.StatusServiceUnavailable, codeUnavailable, "service temporarily unavailable; retry shortly")
	default:
		if errors.As(err, &failedStore) {
			s.metrics.storeErrors.WithLabelValues(failedStore.op).Inc()
		}
		s.log.LogAttrs(r.Context(), slog.LevelError, "internal error",
			slog.String("request_id", requestIDFrom(r.Context())), slog.String("error", err.Error()))
		s.respondError(w, http.StatusInternalServerError, codeInternalError, "internal error")
	}
}

// respondError writes an Error body.
func (s *server) respondError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorBody{Code: code, Message: message, Status: status})
}

// retryAfterSeconds rounds a wait up to whole seconds, at least one, so a
// client that waits exactly that long is not refused again for being early.
func retryAfterSeconds(d time.Duration) int64 {
	return max(ceilSeconds(d), 1)
}
