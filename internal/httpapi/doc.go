// Package httpapi is the Animal Store's HTTP interface: the public router
// serving /v1 and the OpenAPI document, its middleware (request id, client
// IP behind trusted proxies, panic recovery, access log and metrics,
// authentication and rate limiting), the handlers, and the operations
// handler serving /healthz, /readyz and /metrics.
//
// A request travels one way:
//
//	router [request id, client IP, access log + metrics, recover]
//	  -> /v1: authenticate (bearer key -> principal | 401, charged to the per-IP throttle)
//	       -> rate limit (decision -> headers | 429 | 503)
//	       -> handler: decode -> validate -> store -> encode | writeError
//
// Every error reaches the client through writeError, the one place that maps
// errors to a status and an Error body. The OpenAPI document embedded from
// openapi.yaml describes every response the router can produce, and the
// tests check each response they receive against it.
package httpapi
