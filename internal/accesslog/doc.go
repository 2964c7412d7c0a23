// Package accesslog reads the service's JSON access log back: of each
// line the HTTP layer writes for a request (httpapi's observe middleware),
// what a replay against other plans needs (when the request reached the
// limiter, its key and plan, what the limiter decided), from any number of
// logs, plain or gzip-compressed, grouped by key in time order.
package accesslog
