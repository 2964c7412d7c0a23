package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readinessTimeout bounds one readiness check, well inside the probe's own
// timeout so that a hung dependency reads as "not ready", not as a timeout.
const readinessTimeout = 2 * time.Second

// Readiness says whether this replica should receive traffic: not while it
// drains for shutdown, and not while its check (say, a database ping) fails.
type Readiness struct {
	check    func(context.Context) error
	draining atomic.Bool
}

// NewReadiness returns a Readiness that runs check on every /readyz; a nil
// check always passes.
func NewReadiness(check func(context.Context) error) *Readiness {
	return &Readiness{check: check}
}

// SetDraining marks the replica as shutting down: /readyz fails from now
// on, so that the load balancer stops sending requests before the server
// stops accepting them.
func (r *Readiness) SetDraining(draining bool) { r.draining.Store(draining) }

// Draining reports whether SetDraining(true) was called.
func (r *Readiness) Draining() bool { return r.draining.Load() }

// OpsConfig holds what the operations handler needs.
type OpsConfig struct {
	Readiness *Readiness
	// Gatherer is what /metrics exposes.
	Gatherer prometheus.Gatherer
	// Logger receives failed readiness checks; nil discards them.
	Logger *slog.Logger
}

// opsStatus is the body of /healthz and /readyz.
type opsStatus struct {
	Status string `json:"status"`
}

// NewOpsHandler returns the operations handler, served on its own port
// without authentication or limits: /healthz (the process answers: always
// 200), /readyz (200 when ready, else 503) and /metrics.
func NewOpsHandler(cfg OpsConfig) http.Handler {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ready := cfg.Readiness
	if ready == nil {
		ready = NewReadiness(nil)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, opsStatus{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready.Draining() {
			writeJSON(w, http.StatusServiceUnavailable, opsStatus{Status: "draining"})
			return
		}
		if ready.check != nil {
			ctx, cancel := context.WithTimeout(r.Context(), readinessTimeout)
			defer cancel()
			if err := ready.check(ctx); err != nil {
				log.Warn("not ready", slog.String("error", err.Error()))
				writeJSON(w, http.StatusServiceUnavailable, opsStatus{Status: "unavailable"})
				return
			}
		}
		writeJSON(w, http.StatusOK, opsStatus{Status: "ok"})
	})
	gatherer := cfg.Gatherer
	if gatherer == nil {
		gatherer = prometheus.NewRegistry()
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	return mux
}
