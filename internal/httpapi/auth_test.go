package httpapi

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

func TestAuthentication(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		authorization []string
		status        int
		challenge     string // WWW-Authenticate
		reason        string // petstore_auth_failures_total label
	}{
		{"valid", []string{"Bearer " + keyFree}, http.StatusOK, "", ""},
		{"scheme in any case", []string{"bEARER " + keyFree}, http.StatusOK, "", ""},
		{"missing", nil, http.StatusUnauthorized, `Bearer realm="petstore"`, "missing"},
		{"basic scheme", []string{"Basic dXNlcjpwYXNz"}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"no token", []string{"Bearer"}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"empty token", []string{"Bearer "}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"several spaces (RFC 7235 1*SP)", []string{"Bearer   " + keyFree}, http.StatusOK, "", ""},
		{"empty header", []string{""}, http.StatusUnauthorized, `Bearer realm="petstore"`, "missing"},
		{"two tokens", []string{"Bearer " + keyFree + " " + keyOther}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"two headers", []string{"Bearer " + keyFree, "Bearer " + keyFree}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"bare key", []string{keyFree}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_request"`, "malformed"},
		{"malformed key", []string{"Bearer " + keyBadShape}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_token"`, "malformed"},
		{"unknown key", []string{"Bearer " + keyUnknown}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_token"`, "unknown"},
		{"revoked key", []string{"Bearer " + keyRevoked}, http.StatusUnauthorized, `Bearer realm="petstore", error="invalid_token"`, "revoked"},
		{"key store down", []string{"Bearer " + keyDBDown}, http.StatusServiceUnavailable, "", "unavailable"},
		{"authenticator fault", []string{"Bearer " + keyBroken}, http.StatusInternalServerError, "", "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(t)
			r := httpRequest(http.MethodGet, "/v1/pets", "")
			r.Header["Authorization"] = tt.authorization
			resp := ts.serve(r)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tt.status, resp.body)
			}
			if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, tt.challenge) || (tt.challenge == "") != (got == "") {
				t.Errorf("WWW-Authenticate = %q, want prefix %q", got, tt.challenge)
			}
			switch tt.status {
			case http.StatusOK:
				if calls := ts.limiter.Calls(); len(calls) != 1 || calls[0] != "key_free" {
					t.Errorf("limiter calls %v, want [key_free]", calls)
				}
				if len(ts.throttle.Calls()) != 0 {
					t.Errorf("authenticated request charged to the IP throttle")
				}
			case http.StatusUnauthorized:
				e := resp.errorBody(t)
				if e.Code != codeUnauthorized {
					t.Errorf("code %q", e.Code)
				}
				if strings.Contains(e.Message, keyFree) || strings.Contains(e.Message, keyUnknown) {
					t.Errorf("message %q repeats the key", e.Message)
				}
				// Charged to the throttle of the client's address, whose
				// headers the 401 carries; the key limiter is not asked.
				if calls := ts.throttle.Calls(); len(calls) != 1 || calls[0] != "ip:192.0.2.1" {
					t.Errorf("throttle calls %v", calls)
				}
				if resp.Header.Get("X-RateLimit-Limit") != "10" || resp.Header.Get("RateLimit") == "" {
					t.Errorf("401 without the throttle's headers: %v", resp.Header)
				}
				if len(ts.limiter.Calls()) != 0 {
					t.Errorf("refused key reached the key limiter")
				}
			case http.StatusServiceUnavailable:
				if e := resp.errorBody(t); e.Code != codeUnavailable || resp.Header.Get("Retry-After") != "1" {
					t.Errorf("503: %s Retry-After %q", resp.body, resp.Header.Get("Retry-After"))
				}
			case http.StatusInternalServerError:
				if e := resp.errorBody(t); e.Code != codeInternalError {
					t.Errorf("500: %s", resp.body)
				}
			}
			if strings.Contains(string(resp.body), "connection refused") || strings.Contains(string(resp.body), "invariant") {
				t.Errorf("answer leaks the cause: %s", resp.body)
			}
			if tt.reason != "" {
				if got := metricValue(t, ts.metrics.authFailures.WithLabelValues(tt.reason)); got != 1 {
					t.Errorf("auth failures{reason=%q} = %v, want 1", tt.reason, got)
				}
			}
		})
	}
}

func TestUnauthenticatedThrottled(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.throttle.decision = ratelimit.Decision{
		Outcome:    ratelimit.Limited,
		Windows:    []ratelimit.WindowState{{Window: ratelimit.Window{Limit: 10, Period: time.Minute}, Remaining: 0}},
		RetryAfter: 2500 * time.Millisecond,
	}
	for _, target := range []string{"/v1/pets", "/v1/pets/1", "/openapi.yaml", "/nowhere"} {
		resp := ts.do(request{target: target, key: keyUnknown})
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s: status %d, want 429", target, resp.StatusCode)
			continue
		}
		if e := resp.errorBody(t); e.Code != codeRateLimited || resp.Header.Get("Retry-After") != "3" {
			t.Errorf("%s: %s Retry-After %q", target, e.Code, resp.Header.Get("Retry-After"))
		}
		if resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("%s: X-RateLimit-Remaining %q", target, resp.Header.Get("X-RateLimit-Remaining"))
		}
	}
	// A valid key is not subject to the IP throttle.
	if resp := ts.get("/v1/pets", keyFree); resp.StatusCode != http.StatusOK {
		t.Errorf("valid key while the IP is throttled: %d", resp.StatusCode)
	}
}
