package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestOpsHandler(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	ready := NewReadiness(func(ctx context.Context) error {
		if failing.Load() {
			return errors.New("ping: connection refused")
		}
		return ctx.Err()
	})
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	ops := NewOpsHandler(OpsConfig{Readiness: ready, Gatherer: reg})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		ops.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}

	steps := []struct {
		name            string
		setup           func()
		healthz, readyz int
	}{
		{"serving", func() {}, 200, 200},
		{"dependency down", func() { failing.Store(true) }, 200, 503},
		{"dependency back", func() { failing.Store(false) }, 200, 200},
		{"draining", func() { ready.SetDraining(true) }, 200, 503},
		{"draining with dependency down", func() { failing.Store(true) }, 200, 503},
	}
	for _, s := range steps {
		s.setup()
		if code, _ := get("/healthz"); code != s.healthz {
			t.Errorf("%s: /healthz %d, want %d", s.name, code, s.healthz)
		}
		code, body := get("/readyz")
		if code != s.readyz {
			t.Errorf("%s: /readyz %d, want %d (%s)", s.name, code, s.readyz, body)
		}
		if strings.Contains(body, "connection refused") {
			t.Errorf("%s: /readyz leaks the cause: %s", s.name, body)
		}
	}
	if !ready.Draining() {
		t.Error("Draining() false after SetDraining(true)")
	}

	// /metrics exposes what the public server records.
	srv := NewServer(Config{Store: nil, Auth: testAuth{}, Metrics: metrics})
	srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/nowhere", nil))
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `petstore_http_requests_total{code="404",method="GET",route="unmatched"} 1`) {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	for _, name := range []string{"petstore_http_request_duration_seconds_bucket", "petstore_http_requests_in_flight",
		"petstore_store_errors_total", "petstore_auth_failures_total"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if code, _ := get("/nowhere"); code != http.StatusNotFound {
		t.Errorf("unknown ops path: %d", code)
	}
}

func TestReadinessWithoutCheck(t *testing.T) {
	t.Parallel()
	ops := NewOpsHandler(OpsConfig{})
	rec := httptest.NewRecorder()
	ops.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/readyz without a check: %d", rec.Code)
	}
}
