package httpapi

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

// Route patterns referred to outside the route table.
const (
	getPetPattern = "/v1/pets/{petId}"
	getPetPrefix  = "/v1/pets/" // every path getPetPattern can match starts so
)

// routes lists every route of the public API.
func (s *server) routes() *chi.Mux {
	r := chi.NewRouter()
	r.Use(
		s.requestID,    // X-Request-Id in and out
		s.clientIP,     // the caller's address, believing only trusted proxies
		s.observe,      // access log and metrics, outside recover so panics are seen
		s.recoverPanic, // a panic becomes a 500 Error
		commonHeaders,  // X-Content-Type-Options, Cache-Control
		middleware.GetHead,
	)

	// Outside /v1 nobody authenticates: every request is charged to the
	// per-IP throttle. So are methods chi does not know (PROPFIND), which
	// it refuses for any path, /v1 included.
	r.With(s.throttleByIP).Get("/openapi.yaml", s.handleOpenAPIYAML())
	r.With(s.throttleByIP).Get("/openapi.json", s.handleOpenAPIJSON())
	r.With(s.throttleByIP).Get("/docs", s.handleDocs())
	r.With(s.throttleByIP).Get("/docs/{file}", s.handleDocsFile())

	// /v1: authenticate, then limit. Its routes are spelled out in full on
	// this router rather than mounted as a sub-router, so that a request is
	// routed once.
	v1 := r.With(s.deprecateGetPet, s.authenticate)
	v1.With(s.rateLimit).Get("/v1/pets", handleListPets(s.store, s.writeError))
	v1.With(s.rateLimit).Post("/v1/pets", handleCreatePet(s.store, s.maxBodyBytes, s.idempotencyTTL, s.writeError))
	v1.With(s.rateLimit).Get(getPetPattern, handleGetPet(s.store, s.writeError))
	// Reading the quota spends none of it: the operation has a per-key
	// throttle of its own instead of the key's limits.
	if s.usage != nil {
		v1.With(s.throttleUsage).Get("/v1/rate_limit", handleRateLimit(s.usage, s.now, s.draftFields, s.writeError))
	}

	// Unknown paths and methods under /v1 are answered after
	// authentication and limiting, not charged to the IP throttle; those
	// of a method chi does not know never reach /v1.
	notFound := s.throttleByIP(s.handleNotFound())
	v1NotFound := s.deprecateGetPet(s.authenticate(s.rateLimit(s.handleNotFound())))
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		if underV1(req) {
			v1NotFound.ServeHTTP(w, req)
			return
		}
		notFound.ServeHTTP(w, req)
	})
	methodNotAllowed := s.throttleByIP(s.handleMethodNotAllowed())
	v1MethodNotAllowed := s.deprecateGetPet(s.authenticate(s.rateLimit(s.handleMethodNotAllowed())))
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		if underV1(req) && routableMethod(req.Method) {
			v1MethodNotAllowed.ServeHTTP(w, req)
			return
		}
		methodNotAllowed.ServeHTTP(w, req)
	})
	return r
}

// underV1 reports whether r's path is /v1 or below it, as chi routes it
// (the escaped path when there is one).
func underV1(r *http.Request) bool {
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// routableMethod reports whether chi routes requests of method m: chi
// refuses any other method before it looks at the path.
func routableMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return true
	}
	return false
}
