package httpapi

import (
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
	// it refuses here for any path, /v1 included.
	r.NotFound(s.throttleByIP(s.handleNotFound()).ServeHTTP)
	r.MethodNotAllowed(s.throttleByIP(s.handleMethodNotAllowed()).ServeHTTP)
	r.With(s.throttleByIP).Get("/openapi.yaml", s.handleOpenAPIYAML())
	r.With(s.throttleByIP).Get("/openapi.json", s.handleOpenAPIJSON())
	r.With(s.throttleByIP).Get("/docs", s.handleDocs())
	r.With(s.throttleByIP).Get("/docs/{file}", s.handleDocsFile())

	r.Route("/v1", func(r chi.Router) {
		r.Use(s.deprecateGetPet, s.authenticate)
		// Set here so that unknown paths and methods under /v1 are answered
		// after authentication and limiting, not charged to the IP throttle.
		r.NotFound(s.rateLimit(s.handleNotFound()).ServeHTTP)
		r.MethodNotAllowed(s.rateLimit(s.handleMethodNotAllowed()).ServeHTTP)

		r.Group(func(r chi.Router) {
			r.Use(s.rateLimit)
			r.Get("/pets", handleListPets(s.store, s.writeError))
			r.Post("/pets", handleCreatePet(s.store, s.maxBodyBytes, s.idempotencyTTL, s.writeError))
			r.Get("/pets/{petId}", handleGetPet(s.store, s.writeError))
		})
		// Reading the quota spends none of it: the operation has a per-key
		// throttle of its own instead of the key's limits.
		if s.usage != nil {
			r.With(s.throttleUsage).Get("/rate_limit", handleRateLimit(s.usage, s.now, s.writeError))
		}
	})
	return r
}
