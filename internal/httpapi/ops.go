package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness timing defaults.
const (
	// DefaultCheckInterval is how often Readiness.Run checks again, so that
	// a replica turns ready by itself within it once, say, its database is
	// migrated.
	DefaultCheckInterval = 2 * time.Second
	// checkTimeout bounds one run of a check: a hung dependency reads as
	// unreachable, not as a stuck loop.
	checkTimeout = 2 * time.Second
)

// Check is one thing readiness depends on. Readiness runs it in the
// background, never on a probe's request.
type Check struct {
	// Name names the dependency on /readyz and in logs, e.g. "database".
	Name string
	// Run returns nil when this replica can serve as far as the dependency
	// goes; a *NotReadyError when the dependency answered that it cannot
	// (a schema too old): not ready at once, until a later Run returns nil;
	// and any other error when it could not reach the dependency.
	Run func(context.Context) error
	// Tolerate is how long Run may keep failing to reach the dependency
	// before the replica turns unready; negative means never. A verdict
	// (*NotReadyError) is never tolerated.
	Tolerate time.Duration
}

// NotReadyError is a check's verdict that this replica cannot serve until
// something changes, as opposed to a dependency it could not reach. /readyz
// shows its message, so it must say what to do and hold no secrets.
type NotReadyError struct{ Err error }

func (e *NotReadyError) Error() string { return e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

// ReadinessConfig configures a Readiness.
type ReadinessConfig struct {
	Checks []Check
	// Interval is how often Run checks (DefaultCheckInterval when zero).
	Interval time.Duration
	// Logger receives one line whenever readiness changes; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Readiness says whether this replica should receive traffic. It is ready
// when it is not draining and every check is satisfied: each has answered
// at least once, none has returned a verdict (*NotReadyError) since its
// last success, and none has failed to reach its dependency for longer
// than it tolerates. Which dependencies count, and how long an outage is
// tolerated, is the caller's policy (see cmd/petstore and README.md).
type Readiness struct {
	checks   []Check
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time
	draining atomic.Bool

	mu     sync.Mutex   // serializes rounds of checks
	states []checkState // one per check, guarded by mu
	logged bool         // a round has logged where readiness stands, guarded by mu
	report atomic.Pointer[readyReport]
}

// checkState is what the rounds so far say about one check.
type checkState struct {
	answered     bool      // Run has reached its dependency at least once
	verdict      error     // the last *NotReadyError, nil once Run succeeds
	failingSince time.Time // when Run started failing to reach it; zero while it reaches it
	cause        error     // why it last failed to reach it
}

// readyReport is what /readyz answers between rounds.
type readyReport struct {
	ready   bool
	check   string // the check that keeps the replica unready
	message string // why, for operators
	cause   error  // the underlying error, for the log only
}

// NewReadiness returns a Readiness over cfg.Checks. With no checks it is
// ready at once; otherwise it is not ready until CheckNow or Run has run.
func NewReadiness(cfg ReadinessConfig) *Readiness {
	r := &Readiness{
		checks:   cfg.Checks,
		interval: cfg.Interval,
		log:      cfg.Logger,
		now:      cfg.Now,
		states:   make([]checkState, len(cfg.Checks)),
	}
	if r.interval <= 0 {
		r.interval = DefaultCheckInterval
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.report.Store(r.evaluate())
	return r
}

// SetDraining marks the replica as shutting down: /readyz fails from now
// on, so that the load balancer stops sending requests before the server
// stops accepting them.
func (r *Readiness) SetDraining(draining bool) { r.draining.Store(draining) }

// Draining reports whether SetDraining(true) was called.
func (r *Readiness) Draining() bool { return r.draining.Load() }

// Ready reports whether the replica should receive traffic, and if not,
// which check keeps it out and why ("draining" while it drains).
func (r *Readiness) Ready() (ready bool, check, message string) {
	if r.Draining() {
		return false, "", "draining"
	}
	rep := r.report.Load()
	return rep.ready, rep.check, rep.message
}

// Run checks every interval until ctx ends.
func (r *Readiness) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.CheckNow(ctx)
		}
	}
}

// CheckNow runs every check once and updates readiness, logging a line if
// it changed (and always on the first round, so that start-up says where
// the replica stands).
func (r *Readiness) CheckNow(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, c := range r.checks {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		err := c.Run(cctx)
		cancel()
		if ctx.Err() != nil {
			return // shutting down: this round proves nothing
		}
		r.record(c, &r.states[i], err)
	}
	prev := r.report.Load()
	rep := r.evaluate()
	r.report.Store(rep)
	if r.logged && prev.ready == rep.ready && prev.check == rep.check && prev.message == rep.message {
		return
	}
	r.logged = true
	if rep.ready {
		r.log.Info("ready")
		return
	}
	attrs := []any{slog.String("check", rep.check), slog.String("reason", rep.message)}
	if rep.cause != nil && rep.cause.Error() != rep.message {
		attrs = append(attrs, slog.String("error", rep.cause.Error()))
	}
	r.log.Warn("not ready", attrs...)
}

// record folds one Run's result into the check's state.
func (r *Readiness) record(c Check, st *checkState, err error) {
	var verdict *NotReadyError
	switch {
	case err == nil || errors.As(err, &verdict):
		if !st.failingSince.IsZero() {
			r.log.Info("readiness check reaches its dependency again", slog.String("check", c.Name),
				slog.Duration("after", r.now().Sub(st.failingSince).Round(time.Millisecond)))
		}
		st.answered, st.failingSince, st.cause = true, time.Time{}, nil
		st.verdict = nil
		if err != nil {
			st.verdict = verdict
		}
	default:
		if st.failingSince.IsZero() {
			st.failingSince = r.now()
			tolerated := "never turns the replica unready"
			if c.Tolerate >= 0 {
				tolerated = "tolerated for " + c.Tolerate.String()
			}
			r.log.Warn("readiness check cannot reach its dependency", slog.String("check", c.Name),
				slog.String("error", err.Error()), slog.String("outage", tolerated))
		}
		st.cause = err
	}
}

// evaluate derives the report from the checks' states; the first check
// that keeps the replica unready names the reason.
func (r *Readiness) evaluate() *readyReport {
	for i, c := range r.checks {
		st := r.states[i]
		switch {
		case st.verdict != nil:
			return &readyReport{check: c.Name, message: st.verdict.Error()}
		case !st.answered:
			msg := "not checked yet"
			if st.cause != nil {
				msg = "cannot reach it to check it"
			}
			return &readyReport{check: c.Name, message: msg, cause: st.cause}
		case !st.failingSince.IsZero() && c.Tolerate >= 0 && r.now().Sub(st.failingSince) >= c.Tolerate:
			return &readyReport{check: c.Name, cause: st.cause, message: fmt.Sprintf("unreachable since %s (tolerated for %s)",
				st.failingSince.UTC().Format(time.RFC3339), c.Tolerate)}
		}
	}
	return &readyReport{ready: true}
}

// OpsConfig holds what the operations handler needs.
type OpsConfig struct {
	// Readiness decides /readyz; nil means always ready.
	Readiness *Readiness
	// Gatherer is what /metrics exposes.
	Gatherer prometheus.Gatherer
	// Logger receives /metrics errors; nil discards them.
	Logger *slog.Logger
	// Pprof serves the Go runtime's profiles (net/http/pprof) under
	// /debug/pprof/. Only the ops handler ever has them: a profile shows
	// the program's internals and a CPU profile costs CPU, so they must not
	// be reachable by API clients.
	Pprof bool
}

// opsStatus is the body of /healthz and /readyz.
type opsStatus struct {
	Status string `json:"status"`
	// Check and Message say what keeps the replica unready.
	Check   string `json:"check,omitempty"`
	Message string `json:"message,omitempty"`
}

// NewOpsHandler returns the operations handler, served on its own port
// without authentication or limits: /healthz (the process answers: always
// 200), /readyz (200 when ready, else 503 saying why), /metrics and, with
// cfg.Pprof, /debug/pprof/.
func NewOpsHandler(cfg OpsConfig) http.Handler {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ready := cfg.Readiness
	if ready == nil {
		ready = NewReadiness(ReadinessConfig{})
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
		ok, check, message := ready.Ready()
		if !ok {
			writeJSON(w, http.StatusServiceUnavailable, opsStatus{Status: "unavailable", Check: check, Message: message})
			return
		}
		writeJSON(w, http.StatusOK, opsStatus{Status: "ok"})
	})
	gatherer := cfg.Gatherer
	if gatherer == nil {
		gatherer = prometheus.NewRegistry()
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	if cfg.Pprof {
		// Index serves the named profiles too (/debug/pprof/heap, ...).
		// Profile and Trace extend the server's write deadline by the time
		// they are asked to run. Importing net/http/pprof also registers
		// these on http.DefaultServeMux, which nothing here serves.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
