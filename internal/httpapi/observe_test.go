package httpapi

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// TestAccessLog: one line per request, with what an operator and a replay
// of the log (petstore plans simulate) need: the key, its plan and what
// the limiter decided, and never the key itself.
// The fields are the same whether the line is written by JSONLogHandler
// or through slog by another handler.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	handlers := map[string]func(io.Writer, *slog.HandlerOptions) slog.Handler{
		"JSONLogHandler":   func(w io.Writer, o *slog.HandlerOptions) slog.Handler { return NewJSONLogHandler(w, o) },
		"slog.JSONHandler": func(w io.Writer, o *slog.HandlerOptions) slog.Handler { return slog.NewJSONHandler(w, o) },
	}
	for name, newHandler := range handlers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logs := &logBuffer{}
			testAccessLog(t, newTestServer(t, func(c *Config) {
				c.Logger = slog.New(newHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}), logs)
		})
	}
}

func testAccessLog(t *testing.T, ts *testServer, logs *logBuffer) {
	ts.do(request{target: "/v1/pets?limit=5", key: keyFree, headers: map[string]string{"X-Request-Id": "req-1"}})
	ts.do(request{target: "/v1/pets", key: keyUnknown, headers: map[string]string{"X-Request-Id": "req-2"}})
	ts.do(request{method: "BREW", target: "/coffee", headers: map[string]string{"X-Request-Id": "req-3"}})
	window := []ratelimit.WindowState{{Window: ratelimit.Window{Limit: 60, Period: time.Minute}, Reset: time.Now().Add(time.Minute)}}
	ts.limiter.decision = ratelimit.Decision{Outcome: ratelimit.Limited, Windows: window, RetryAfter: time.Second}
	ts.do(request{target: "/v1/pets", key: keyFree, headers: map[string]string{"X-Request-Id": "req-4"}})
	ts.limiter.decision = ratelimit.Decision{Outcome: ratelimit.Banned, Windows: window, RetryAfter: time.Minute, Shadow: true}
	ts.do(request{target: "/v1/pets", key: keyFree, headers: map[string]string{"X-Request-Id": "req-5"}})

	// nil: the field must be absent.
	want := map[string]map[string]any{
		"req-1": {"method": "GET", "route": "/v1/pets", "path": "/v1/pets", "status": float64(200), "client_ip": "192.0.2.1",
			"key_id": "key_free", "plan": "free", "ratelimit": "allowed", "ratelimit_shadow": nil},
		"req-2": {"method": "GET", "route": "/v1/pets", "status": float64(401), "client_ip": "192.0.2.1", "key_id": nil, "plan": nil, "ratelimit": nil},
		"req-3": {"method": "BREW", "route": "unmatched", "status": float64(404), "key_id": nil, "ratelimit": nil},
		"req-4": {"status": float64(429), "key_id": "key_free", "plan": "free", "ratelimit": "limited", "ratelimit_shadow": nil},
		"req-5": {"status": float64(200), "key_id": "key_free", "plan": "free", "ratelimit": "banned", "ratelimit_shadow": true},
	}
	seen := 0
	for _, rec := range logs.records(t) {
		if rec["msg"] != "request" {
			continue
		}
		fields, ok := want[rec["request_id"].(string)]
		if !ok {
			continue
		}
		seen++
		for k, v := range fields {
			got, present := rec[k]
			if v == nil && present {
				t.Errorf("%s: %s = %v, want no such field", rec["request_id"], k, got)
			} else if v != nil && got != v {
				t.Errorf("%s: %s = %v, want %v", rec["request_id"], k, got, v)
			}
		}
		if _, ok := rec["duration_ms"].(float64); !ok {
			t.Errorf("%s: no duration_ms", rec["request_id"])
		}
		if _, ok := rec["bytes"].(float64); !ok || rec["bytes"].(float64) <= 0 {
			t.Errorf("%s: bytes = %v", rec["request_id"], rec["bytes"])
		}
	}
	if seen != len(want) {
		t.Errorf("%d access log lines, want %d:\n%s", seen, len(want), logs)
	}
	// No API key ever reaches the log.
	if out := logs.String(); strings.Contains(out, keyFree) || strings.Contains(out, keyUnknown) {
		t.Errorf("an API key was logged:\n%s", out)
	}
}

func TestRequestMetrics(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	p := ts.create("Rex", 1, "sold")
	ts.get("/v1/pets/"+itoa(p.ID), keyFree)
	ts.get("/v1/pets/"+itoa(p.ID), "")   // 401, refused before the /v1 router routes
	ts.get("/v1/pets/12345", keyFree)    // 404 from the handler: still the route
	ts.get("/v1/no/such/thing", keyFree) // unmatched
	ts.get("/v1", "")                    // refused where no route is: unmatched too
	ts.do(request{method: http.MethodDelete, target: "/v1/pets", key: keyFree})
	ts.do(request{method: "X-CUSTOM", target: "/v1/pets", key: keyFree})

	tests := []struct {
		route, method, code string
		want                float64
	}{
		{"/v1/pets", "POST", "201", 1},
		{"/v1/pets/{petId}", "GET", "200", 1},
		{"/v1/pets/{petId}", "GET", "401", 1},
		{"/v1/pets/{petId}", "GET", "404", 1},
		{"unmatched", "GET", "404", 1},
		{"unmatched", "GET", "401", 1},
		{"unmatched", "DELETE", "405", 1},
		{"unmatched", "other", "405", 1},
	}
	for _, tt := range tests {
		if got := metricValue(t, ts.metrics.requests.WithLabelValues(tt.route, tt.method, tt.code)); got != tt.want {
			t.Errorf("requests{%s %s %s} = %v, want %v", tt.route, tt.method, tt.code, got, tt.want)
		}
	}
	if got := metricValue(t, ts.metrics.inFlight); got != 0 {
		t.Errorf("in flight = %v after all requests finished", got)
	}
	if got := metricValue(t, ts.metrics.authFailures.WithLabelValues("missing")); got != 2 {
		t.Errorf("auth failures{missing} = %v", got)
	}
}

// TestSeriesFor: the cached handles count in the series WithLabelValues
// names, however many goroutines ask at once.
func TestSeriesFor(t *testing.T) {
	t.Parallel()
	m := NewMetrics(nil)
	routes := []string{"/v1/pets", "/v1/pets/{petId}", "unmatched"}
	codes := []int{200, 404, 429}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				for _, route := range routes {
					for _, code := range codes {
						s := m.seriesFor(route, "GET", code)
						s.requests.Inc()
						s.duration.Observe(0.001)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, route := range routes {
		for _, code := range codes {
			if got := metricValue(t, m.requests.WithLabelValues(route, "GET", itoa(int64(code)))); got != 40 {
				t.Errorf("requests{%s GET %d} = %v, want 40", route, code, got)
			}
		}
	}
	if n := len(*m.series.Load()); n != len(routes)*len(codes) {
		t.Errorf("%d cached series, want %d", n, len(routes)*len(codes))
	}
}
