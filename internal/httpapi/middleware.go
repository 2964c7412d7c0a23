package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/animal-store/petstore/internal/apikey"
)

// requestInfo is what the middleware learns about a request on its way in
// and what the handlers report on the way out, for the access log and the
// metrics, which wrap everything else and so cannot read inner contexts.
// It is the one value the router adds to a request's context, and it holds
// the request's other per-request state too, so that a request costs one
// allocation for all of it.
type requestInfo struct {
	id       string
	clientIP netip.Addr
	// principal is the caller, once authenticate accepted its key
	// (authenticated); its key id and plan go into the access log.
	principal     apikey.Principal
	authenticated bool
	// decision is what the limiter decided for the request (empty when it
	// was not asked), shadow whether that was under a plan in shadow mode.
	// With the time, key and plan they are what a replay of the log needs
	// (petstore plans simulate).
	decision string
	shadow   bool
	// unmatched marks requests no route answered (404, 405).
	unmatched bool
	// clientGone marks requests abandoned by the client.
	clientGone bool
	status     int
	bytes      int
	// rec is the response writer observe hands down.
	rec recorder
	// fields hold the values of the header fields that every response
	// carries (see setField).
	fields [numFields]string
}

// The header fields every response carries, by their place in
// requestInfo.fields.
const (
	fieldRequestID = iota
	fieldContentTypeOptions
	fieldCacheControl
	numFields
)

// setField sets the header field name, which must be spelled canonically,
// to value, which it keeps in the request's fields[i]: one allocation per
// request holds them all, where Header.Set allocates for each (and
// canonicalises the name again). The value is handed out with capacity
// one, so that appending to it copies; it belongs to this one response.
func (info *requestInfo) setField(h http.Header, i int, name, value string) {
	info.fields[i] = value
	h[name] = info.fields[i : i+1 : i+1]
}

type requestInfoKey struct{}

// requestInfoFrom returns the request's info, or a throwaway one outside the
// router so that handlers never need to check.
func requestInfoFrom(ctx context.Context) *requestInfo {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info
	}
	return &requestInfo{}
}

// requestIDFrom returns the request id, for log lines.
func requestIDFrom(ctx context.Context) string { return requestInfoFrom(ctx).id }

// principalFrom returns the caller whose key authenticate accepted, if any.
func principalFrom(ctx context.Context) (apikey.Principal, bool) {
	info := requestInfoFrom(ctx)
	return info.principal, info.authenticated
}

// maxRequestIDLength bounds an incoming X-Request-Id worth keeping.
const maxRequestIDLength = 128

// requestID adopts a sane incoming X-Request-Id (so that a proxy's id
// follows the request into our logs) or makes one, and returns it.
func (s *server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !saneRequestID(id) {
			id = newRequestID()
		}
		info := &requestInfo{id: id}
		info.setField(w.Header(), fieldRequestID, "X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
	})
}

// saneRequestID accepts 1 to 128 characters that cannot break a log line or
// a header: letters, digits and - _ . : / + = @.
func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-_.:/+=@", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// newRequestID returns 128 random bits in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// clientIP records the caller's address (see clientAddr).
func (s *server) clientIP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requestInfoFrom(r.Context()).clientIP = clientAddr(r, s.proxies)
		next.ServeHTTP(w, r)
	})
}

// recorder notes the status and size of a response in its requestInfo.
type recorder struct {
	http.ResponseWriter
	info *requestInfo
}

func (w *recorder) WriteHeader(code int) {
	if w.info.status == 0 {
		w.info.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.info.status == 0 {
		w.info.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.info.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// statusClientClosed is recorded for requests the client abandoned, as
// nginx does, so that they are not counted as server errors.
const statusClientClosed = 499

// observe writes the access log line and the request metrics.
func (s *server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := requestInfoFrom(r.Context())
		s.metrics.inFlight.Inc()
		defer s.metrics.inFlight.Dec()

		info.rec = recorder{ResponseWriter: w, info: info}
		next.ServeHTTP(&info.rec, r)

		now := time.Now()
		elapsed := now.Sub(start)
		status := info.status
		switch {
		case info.clientGone:
			status = statusClientClosed
		case status == 0:
			status = http.StatusOK
		}
		route := routeLabel(r, info)
		method := methodLabel(r.Method)
		series := s.metrics.seriesFor(route, method, status)
		series.requests.Inc()
		series.duration.Observe(elapsed.Seconds())

		s.logRequest(r.Context(), now, &accessLine{
			requestID: info.id,
			method:    r.Method,
			route:     route,
			path:      r.URL.Path,
			status:    status,
			duration:  elapsed,
			bytes:     info.bytes,
			clientIP:  info.clientIP,
			keyID:     info.principal.KeyID,
			plan:      info.principal.Plan,
			decision:  info.decision,
			shadow:    info.shadow,
		})
	})
}

// routeLabel names the route for metrics and logs: the chi pattern, or
// "unmatched" when no route answered, which bounds the label's values.
// The router chooses the route before any middleware can refuse a request
// (401, 429, 503), so refusals count against their route too.
func routeLabel(r *http.Request, info *requestInfo) string {
	if info.unmatched {
		return "unmatched"
	}
	if pattern := chi.RouteContext(r.Context()).RoutePattern(); pattern != "" {
		return pattern
	}
	return "unmatched"
}

// findRoute returns the pattern of the route that serves method at r's
// path, or "".
func (s *server) findRoute(method string, r *http.Request) string {
	if method == http.MethodHead {
		method = http.MethodGet // answered by the GET route
	}
	path := r.URL.RawPath // what chi routes on, when set
	if path == "" {
		path = r.URL.Path
	}
	return s.mux.Find(chi.NewRouteContext(), method, path)
}

// methodLabel bounds the method label to the standard methods.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

// recoverPanic turns a panic into a 500 Error (when nothing was sent yet)
// and logs it with its stack. http.ErrAbortHandler keeps its meaning.
func (s *server) recoverPanic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			info := requestInfoFrom(r.Context())
			s.log.LogAttrs(r.Context(), slog.LevelError, "panic serving request",
				slog.String("request_id", info.id),
				slog.String("panic", fmt.Sprint(v)),
				slog.String("stack", string(debug.Stack())))
			if info.status == 0 {
				s.respondError(w, http.StatusInternalServerError, codeInternalError, "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// commonHeaders sets the headers every public response carries. Responses
// are not to be cached: they depend on the caller's key and on its
// remaining quota. Only the OpenAPI document overrides that.
func commonHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, h := requestInfoFrom(r.Context()), w.Header()
		info.setField(h, fieldContentTypeOptions, "X-Content-Type-Options", "nosniff")
		info.setField(h, fieldCacheControl, "Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// getPet deprecation: RFC 9745 Deprecation is a structured date, the moment
// v1.0.0 declared the operation deprecated (2026-01-01T00:00:00Z); RFC 8594
// Sunset is the HTTP date of its removal (5 December 2030).
const (
	deprecationValue = "@1767225600"
	sunsetValue      = "Thu, 05 Dec 2030 00:00:00 GMT"
	deprecationLinks = `</v1/pets>; rel="successor-version", </openapi.yaml>; rel="deprecation"; type="application/yaml"`
)

// deprecateGetPet marks every response for the getPet resource, including
// the 401 and 429 given before routing completes, as deprecated.
func (s *server) deprecateGetPet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The prefix test spares list and create requests, most of the
		// traffic, a second route lookup; the route table stays the judge.
		if strings.HasPrefix(r.URL.Path, getPetPrefix) && s.findRoute(http.MethodGet, r) == getPetPattern {
			h := w.Header()
			h.Set("Deprecation", deprecationValue)
			h.Set("Sunset", sunsetValue)
			h.Set("Link", deprecationLinks)
		}
		next.ServeHTTP(w, r)
	})
}
