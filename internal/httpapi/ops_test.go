package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/testenv"
)

func getOps(t *testing.T, ops http.Handler, path string) (int, opsStatus, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	ops.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Body)
	var st opsStatus
	if path != "/metrics" {
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatalf("%s: body %q: %v", path, b, err)
		}
	}
	return rec.Code, st, string(b)
}

// fakeDependency is a check's dependency whose answer a test sets.
type fakeDependency struct {
	mu  sync.Mutex
	err error
}

func (d *fakeDependency) set(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err = err
}

func (d *fakeDependency) run(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var (
	errRefused   = errors.New("dial tcp 10.1.2.3:5432: connection refused")
	errOldSchema = &NotReadyError{Err: errors.New("database schema version is none, this release needs 0001: run `petstore migrate`")}
)

// TestReadinessModel walks one check through every state readiness knows,
// for a dependency whose outage is tolerated for 30 s and for one whose
// outage never counts: a verdict is never tolerated, a short outage always
// is, and the answer on /readyz says which check keeps the replica out and
// why, without the underlying error.
func TestReadinessModel(t *testing.T) {
	t.Parallel()
	const tolerate = 30 * time.Second
	type step struct {
		name      string
		dep       error         // what the dependency answers from now on
		advance   time.Duration // clock moves before the round
		ready     bool
		message   string // part of /readyz's message when not ready
		tolerated bool   // the same step when outages never count: ready
	}
	steps := []step{
		{name: "unreachable before the first answer", dep: errRefused, message: "cannot reach it to check it"},
		{name: "schema too old", dep: errOldSchema, message: "run `petstore migrate`"},
		{name: "verdict kept while unreachable", dep: errRefused, advance: time.Hour, message: "run `petstore migrate`"},
		{name: "migrated", dep: nil, ready: true, tolerated: true},
		{name: "outage starts", dep: errRefused, ready: true, tolerated: true},
		{name: "outage just within tolerance", dep: errRefused, advance: tolerate - time.Millisecond, ready: true, tolerated: true},
		{name: "outage beyond tolerance", dep: errRefused, advance: time.Millisecond, message: "unreachable since", tolerated: true},
		{name: "back", dep: nil, ready: true, tolerated: true},
		{name: "a second outage starts its own clock", dep: errRefused, advance: time.Second, ready: true, tolerated: true},
		{name: "second outage within tolerance", dep: errRefused, advance: tolerate / 2, ready: true, tolerated: true},
		{name: "schema made too old by a newer release", dep: errOldSchema, message: "run `petstore migrate`"},
	}
	for _, policy := range []time.Duration{tolerate, -1} {
		clock := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
		dep := &fakeDependency{}
		var logs testenv.Buffer
		ready := NewReadiness(ReadinessConfig{
			Checks: []Check{{Name: "database", Run: dep.run, Tolerate: policy}},
			Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
			Now:    clock.Now,
		})
		ops := NewOpsHandler(OpsConfig{Readiness: ready})
		if code, st, _ := getOps(t, ops, "/readyz"); code != http.StatusServiceUnavailable || st.Message != "not checked yet" {
			t.Fatalf("tolerate %v: before any check: %d %+v", policy, code, st)
		}
		for _, s := range steps {
			dep.set(s.dep)
			clock.advance(s.advance)
			ready.CheckNow(t.Context())
			want := s.ready || (policy < 0 && s.tolerated)
			code, st, body := getOps(t, ops, "/readyz")
			if code, _, _ := getOps(t, ops, "/healthz"); code != http.StatusOK {
				t.Errorf("tolerate %v: %s: /healthz %d", policy, s.name, code)
			}
			switch {
			case want && (code != http.StatusOK || st.Status != "ok"):
				t.Errorf("tolerate %v: %s: /readyz %d %s, want 200", policy, s.name, code, body)
			case !want && (code != http.StatusServiceUnavailable || st.Status != "unavailable" || st.Check != "database" || !strings.Contains(st.Message, s.message)):
				t.Errorf("tolerate %v: %s: /readyz %d %s, want 503 naming database and %q", policy, s.name, code, body, s.message)
			}
			if strings.Contains(body, "connection refused") {
				t.Errorf("tolerate %v: %s: /readyz leaks the cause: %s", policy, s.name, body)
			}
			if ok, _, _ := ready.Ready(); ok != want {
				t.Errorf("tolerate %v: %s: Ready() = %v, want %v", policy, s.name, ok, want)
			}
		}
		// One line per change, not one per round.
		var ups, downs int
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			switch rec["msg"] {
			case "ready":
				ups++
			case "not ready":
				downs++
				if rec["check"] != "database" || rec["reason"] == "" {
					t.Errorf("not-ready line without check and reason: %s", line)
				}
			}
		}
		wantUps, wantDowns := 2, 4 // migrated, back; unreachable, old schema, beyond tolerance, old again
		if policy < 0 {
			wantUps, wantDowns = 1, 3
		}
		if ups != wantUps || downs != wantDowns {
			t.Errorf("tolerate %v: %d ready and %d not-ready lines, want %d and %d:\n%s", policy, ups, downs, wantUps, wantDowns, logs.String())
		}
	}
}

// A replica turns ready by itself once its dependency comes right, within
// the check interval, and draining overrides everything.
func TestReadinessRunRecovers(t *testing.T) {
	t.Parallel()
	dep := &fakeDependency{err: errOldSchema}
	ready := NewReadiness(ReadinessConfig{
		Checks:   []Check{{Name: "database", Run: dep.run, Tolerate: -1}},
		Interval: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready.CheckNow(ctx)
	go ready.Run(ctx)
	ops := NewOpsHandler(OpsConfig{Readiness: ready})
	if code, st, _ := getOps(t, ops, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(st.Message, "petstore migrate") {
		t.Fatalf("old schema: %d %+v", code, st)
	}
	dep.set(nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, _ := getOps(t, ops, "/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never turned ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ready.SetDraining(true)
	if code, st, _ := getOps(t, ops, "/readyz"); code != http.StatusServiceUnavailable || st.Status != "draining" {
		t.Errorf("draining: %d %+v", code, st)
	}
	if !ready.Draining() {
		t.Error("Draining() false after SetDraining(true)")
	}
}

// A check that hangs counts as unreachable after checkTimeout, and a round
// cut short by shutdown changes nothing.
func TestReadinessCheckTimeout(t *testing.T) {
	t.Parallel()
	var calls int
	ready := NewReadiness(ReadinessConfig{Checks: []Check{{Name: "slow", Tolerate: 0, Run: func(ctx context.Context) error {
		calls++
		if calls == 1 {
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	}}}})
	ready.CheckNow(t.Context())
	if ok, _, _ := ready.Ready(); !ok {
		t.Fatal("not ready after a good check")
	}
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	ready.CheckNow(canceled)
	if ok, _, _ := ready.Ready(); !ok {
		t.Fatal("a round cut short by shutdown turned the replica unready")
	}
	start := time.Now()
	ready.CheckNow(t.Context())
	if ok, check, msg := ready.Ready(); ok || check != "slow" || !strings.Contains(msg, "unreachable since") {
		t.Errorf("after a hung check: %v %s %s", ok, check, msg)
	}
	if d := time.Since(start); d < checkTimeout || d > checkTimeout+5*time.Second {
		t.Errorf("hung check took %v, want about %v", d, checkTimeout)
	}
}

func TestOpsHandler(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	ops := NewOpsHandler(OpsConfig{Gatherer: reg})

	// Without checks: ready at once, until draining.
	if code, st, _ := getOps(t, ops, "/readyz"); code != http.StatusOK || st.Status != "ok" {
		t.Errorf("/readyz without checks: %d %+v", code, st)
	}
	if code, _, _ := getOps(t, ops, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}

	// /metrics exposes what the public server records.
	srv := NewServer(Config{Store: nil, Auth: testAuth{}, Metrics: metrics})
	srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/nowhere", nil))
	code, _, body := getOps(t, ops, "/metrics")
	if code != 200 || !strings.Contains(body, `petstore_http_requests_total{code="404",method="GET",route="unmatched"} 1`) {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	for _, name := range []string{"petstore_http_request_duration_seconds_bucket", "petstore_http_requests_in_flight",
		"petstore_store_errors_total", "petstore_auth_failures_total"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	rec := httptest.NewRecorder()
	ops.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/nowhere", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("unknown ops path: %d", rec.Code)
	}
}

func TestOpsPprof(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pprof bool
		path  string
		code  int
		body  string
	}{
		{false, "/debug/pprof/", http.StatusNotFound, ""},
		{false, "/debug/pprof/heap", http.StatusNotFound, ""},
		{true, "/debug/pprof/", http.StatusOK, "Types of profiles available"},
		{true, "/debug/pprof/goroutine?debug=1", http.StatusOK, "goroutine profile:"},
		{true, "/debug/pprof/cmdline", http.StatusOK, ""},
		{true, "/debug/pprof/nosuchprofile", http.StatusNotFound, "Unknown profile"},
	}
	for _, tt := range tests {
		ops := NewOpsHandler(OpsConfig{Pprof: tt.pprof})
		rec := httptest.NewRecorder()
		ops.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
		if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.body) {
			t.Errorf("pprof %v: GET %s = %d %.80q, want %d with %q", tt.pprof, tt.path, rec.Code, rec.Body.String(), tt.code, tt.body)
		}
	}
}
