package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
)

func TestRequestID(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	generated := regexp.MustCompile(`^[0-9a-f]{32}$`)
	tests := []struct {
		name, incoming string
		kept           bool
	}{
		{"uuid", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{"trace style", "Root=1-67891233-abcdef012345678912345678;Parent=53995c3f", false},
		{"punctuation allowed", "req_42.a:b/c+d=e@f", true},
		{"128 characters", strings.Repeat("a", 128), true},
		{"129 characters", strings.Repeat("a", 129), false},
		{"space", "a b", false},
		{"newline escape", "a\\nb", false},
		{"absent", "", false},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		for _, key := range []string{keyFree, ""} { // answered by a handler and by authentication
			resp := ts.do(request{target: "/v1/pets", key: key, headers: map[string]string{"X-Request-Id": tt.incoming}})
			got := resp.Header.Get("X-Request-Id")
			switch {
			case tt.kept && got != tt.incoming:
				t.Errorf("%s: X-Request-Id %q, want it kept", tt.name, got)
			case !tt.kept && !generated.MatchString(got):
				t.Errorf("%s: X-Request-Id %q, want a generated id", tt.name, got)
			case !tt.kept && seen[got]:
				t.Errorf("%s: generated id %q repeats", tt.name, got)
			}
			seen[got] = true
		}
	}
}

func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		name      string
		remote    string
		xff       []string
		forwarded []string
		want      string
	}{
		{"direct client", "203.0.113.7:5555", nil, nil, "203.0.113.7"},
		{"untrusted peer's header ignored", "203.0.113.7:5555", []string{"198.51.100.1"}, nil, "203.0.113.7"},
		{"one trusted proxy", "10.0.0.2:80", []string{"198.51.100.1"}, nil, "198.51.100.1"},
		{"spoofed entry left of the real client", "10.0.0.2:80", []string{"1.2.3.4, 198.51.100.1"}, nil, "198.51.100.1"},
		{"chain of trusted proxies", "10.0.0.2:80", []string{"198.51.100.1, 10.1.1.1, 10.2.2.2"}, nil, "198.51.100.1"},
		{"header split over lines", "10.0.0.2:80", []string{"198.51.100.1", "10.1.1.1"}, nil, "198.51.100.1"},
		{"all hops trusted", "10.0.0.2:80", []string{"10.9.9.9, 10.1.1.1"}, nil, "10.9.9.9"},
		{"trusted peer without header", "10.0.0.2:80", nil, nil, "10.0.0.2"},
		{"garbage hop stops the walk", "10.0.0.2:80", []string{"198.51.100.1, garbage, 10.1.1.1"}, nil, "10.1.1.1"},
		{"hop with port", "10.0.0.2:80", []string{"198.51.100.1:4711"}, nil, "198.51.100.1"},
		{"IPv6 hop", "10.0.0.2:80", []string{"2001:db8::1"}, nil, "2001:db8::1"},
		{"bracketed IPv6 hop with port", "10.0.0.2:80", []string{"[2001:db8::1]:4711"}, nil, "2001:db8::1"},
		{"IPv4-mapped peer", "[::ffff:10.0.0.2]:80", []string{"198.51.100.1"}, nil, "198.51.100.1"},
		{"IPv6 trusted proxy", "[fd00::1]:80", []string{"198.51.100.1"}, nil, "198.51.100.1"},
		{"Forwarded", "10.0.0.2:80", nil, []string{`for=198.51.100.1;proto=https, for=10.1.1.1`}, "198.51.100.1"},
		{"Forwarded quoted IPv6", "10.0.0.2:80", nil, []string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded obfuscated", "10.0.0.2:80", nil, []string{`for=_hidden, for=10.1.1.1`}, "10.1.1.1"},
		{"X-Forwarded-For wins over Forwarded", "10.0.0.2:80", []string{"198.51.100.1"}, []string{"for=192.0.2.99"}, "198.51.100.1"},
		{"peer without port", "203.0.113.7", nil, nil, "203.0.113.7"},
		{"IPv6 peer with zone", "[fe80::1%eth0]:80", nil, nil, "fe80::1"},
		{"IPv6 peer without port", "2001:db8::7", nil, nil, "2001:db8::7"},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tt.remote
		r.Header["X-Forwarded-For"] = tt.xff
		r.Header["Forwarded"] = tt.forwarded
		if got := clientAddr(r, trusted); got.String() != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

// TestParsePeer: reading host:port first finds what parseHop finds, for
// any text made of the characters of addresses.
func TestParsePeer(t *testing.T) {
	t.Parallel()
	texts := []string{"", ":", "[]", "[]:80", "1.2.3.4", "1.2.3.4:80", "1.2.3.4:", ":80", "[1.2.3.4]:80",
		"::1", "::1:80", "[::1]:80", "[::1]", "[::1]:", "::ffff:1.2.3.4", "[::ffff:1.2.3.4]:0", "fe80::1%eth0",
		"[fe80::1%eth0]:65535", "[fe80::1%eth0]:65536", "1.2.3.4:99999", "01.2.3.4:80"}
	const alphabet = "0123456789af:.[]%"
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		texts = append(texts, string(b))
	}
	for _, s := range texts {
		got, gotOK := parsePeer(s)
		want, wantOK := parseHop(s)
		if got != want || gotOK != wantOK {
			t.Errorf("parsePeer(%q) = %v, %v; parseHop: %v, %v", s, got, gotOK, want, wantOK)
		}
	}
}

func TestClientAddrThroughRouter(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t) // trusts 10.0.0.0/8
	tests := []struct {
		remote, xff, key string
	}{
		{"203.0.113.7:1", "198.51.100.1", "ip:203.0.113.7"},
		{"10.0.0.2:1", "198.51.100.1, 10.3.3.3", "ip:198.51.100.1"},
		{"10.0.0.2:1", "2001:db8:1:2:3:4:5:6", "ip:2001:db8:1:2::/64"},
	}
	for _, tt := range tests {
		ts.throttle.keys = nil
		ts.do(request{target: "/v1/pets", remote: tt.remote, headers: map[string]string{"X-Forwarded-For": tt.xff}})
		if calls := ts.throttle.Calls(); len(calls) != 1 || calls[0] != tt.key {
			t.Errorf("%s via %s: throttle keys %v, want [%s]", tt.xff, tt.remote, calls, tt.key)
		}
	}
	recs := ts.logs.records(t)
	if got := recs[len(recs)-1]["client_ip"]; got != "2001:db8:1:2:3:4:5:6" {
		t.Errorf("access log client_ip %v", got)
	}
}

func TestNotFoundAndMethods(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	p := ts.create("Rex", 1, pet.StatusSold)
	tests := []struct {
		method, target string
		key            string
		status         int
		allow          string
		throttled      bool // charged to the per-IP throttle
	}{
		{http.MethodGet, "/nowhere", "", 404, "", true},
		{http.MethodGet, "/", "", 404, "", true},
		{http.MethodGet, "/v2/pets", keyFree, 404, "", true},
		{http.MethodGet, "/v1/nowhere", keyFree, 404, "", false},
		{http.MethodGet, "/v1/pets/1/owner", keyFree, 404, "", false},
		{http.MethodGet, "/v1", keyFree, 404, "", false},
		{http.MethodGet, "/v1/nowhere", "", 401, "", true},
		{http.MethodDelete, "/v1/pets", keyFree, 405, "GET, HEAD, POST", false},
		{http.MethodPut, "/v1/pets/" + itoa(p.ID), keyFree, 405, "GET, HEAD", false},
		{http.MethodOptions, "/v1/pets", keyFree, 405, "GET, HEAD, POST", false},
		// Methods chi does not know are refused before /v1 authenticates.
		{"PROPFIND", "/v1/pets", keyFree, 405, "GET, HEAD, POST", true},
		{"PROPFIND", "/v1/nowhere", keyFree, 404, "", true},
		{"PROPFIND", "/v1", keyFree, 404, "", true}, // no resource, so no Allow to offer
		{http.MethodDelete, "/v1/", keyFree, 404, "", false},
		{http.MethodPost, "/openapi.yaml", "", 405, "GET, HEAD", true},
		{http.MethodHead, "/v1/pets", keyFree, 200, "", false},
		{http.MethodHead, "/v1/pets/" + itoa(p.ID), keyFree, 200, "", false},
		{http.MethodHead, "/v1/pets/999", keyFree, 404, "", false},
		{http.MethodHead, "/openapi.json", "", 200, "", true},
	}
	for _, tt := range tests {
		ts.throttle.keys = nil
		resp := ts.do(request{method: tt.method, target: tt.target, key: tt.key})
		if resp.StatusCode != tt.status {
			t.Errorf("%s %s: status %d, want %d", tt.method, tt.target, resp.StatusCode, tt.status)
			continue
		}
		if got := resp.Header.Get("Allow"); got != tt.allow {
			t.Errorf("%s %s: Allow %q, want %q", tt.method, tt.target, got, tt.allow)
		}
		if throttled := len(ts.throttle.Calls()) > 0; throttled != tt.throttled {
			t.Errorf("%s %s: throttled %v, want %v", tt.method, tt.target, throttled, tt.throttled)
		}
		if tt.method != http.MethodHead && tt.status >= 400 {
			want := map[int]string{401: codeUnauthorized, 404: codeNotFound, 405: codeMethodNotAllowed}[tt.status]
			if e := resp.errorBody(t); e.Code != want {
				t.Errorf("%s %s: code %q, want %q", tt.method, tt.target, e.Code, want)
			}
		}
		if resp.Header.Get("X-RateLimit-Limit") == "" {
			t.Errorf("%s %s: no rate-limit headers", tt.method, tt.target)
		}
	}
}

// faultyStore fails or panics on demand.
type faultyStore struct {
	*memstore.Store
	getErr  error
	listErr error
	panics  bool
}

func (f *faultyStore) Get(ctx context.Context, id int64) (pet.Pet, error) {
	if f.panics {
		panic(fmt.Sprintf("index out of range [%d] with secret internals", id))
	}
	if f.getErr != nil {
		return pet.Pet{}, f.getErr
	}
	return f.Store.Get(ctx, id)
}

func (f *faultyStore) List(ctx context.Context, q pet.ListQuery) ([]pet.Pet, error) {
	if f.listErr != nil {
		return nil, f.listErr
	}
	return f.Store.List(ctx, q)
}

func TestPanicRecovery(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, func(c *Config) { c.Store = &faultyStore{Store: memstore.New(), panics: true} })
	resp := ts.do(request{target: "/v1/pets/7", key: keyFree, headers: map[string]string{"X-Request-Id": "req-panic"}})
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", resp.StatusCode)
	}
	if e := resp.errorBody(t); e.Code != codeInternalError || e.Message != "internal error" {
		t.Errorf("body %s", resp.body)
	}
	if strings.Contains(string(resp.body), "secret") {
		t.Errorf("500 leaks the panic: %s", resp.body)
	}
	var logged bool
	for _, rec := range ts.logs.records(t) {
		if rec["msg"] == "panic serving request" {
			logged = rec["request_id"] == "req-panic" && strings.Contains(rec["panic"].(string), "secret internals") &&
				strings.Contains(rec["stack"].(string), "faultyStore")
		}
	}
	if !logged {
		t.Errorf("panic not logged with request id and stack:\n%s", ts.logs)
	}
	// The server keeps serving.
	if resp := ts.get("/v1/pets", keyFree); resp.StatusCode != http.StatusOK {
		t.Errorf("after a panic: %d", resp.StatusCode)
	}
}

func TestStoreFailureIsInternalError(t *testing.T) {
	t.Parallel()
	cause := errors.New("postgres: list pets: dial tcp 10.1.2.3:5432: connection refused")
	ts := newTestServer(t, func(c *Config) {
		c.Store = &faultyStore{Store: memstore.New(), listErr: cause, getErr: fmt.Errorf("postgres: get pet 1: %w", pet.ErrNotFound)}
	})
	resp := ts.do(request{target: "/v1/pets", key: keyFree, headers: map[string]string{"X-Request-Id": "req-store"}})
	if resp.StatusCode != http.StatusInternalServerError || resp.errorBody(t).Message != "internal error" {
		t.Fatalf("%d %s", resp.StatusCode, resp.body)
	}
	if strings.Contains(string(resp.body), "10.1.2.3") {
		t.Errorf("500 leaks the cause: %s", resp.body)
	}
	var causes int
	for _, rec := range ts.logs.records(t) {
		if rec["msg"] == "internal error" && rec["request_id"] == "req-store" && strings.Contains(rec["error"].(string), "connection refused") {
			causes++
		}
	}
	if causes != 1 {
		t.Errorf("cause logged %d times, want once:\n%s", causes, ts.logs)
	}
	if got := metricValue(t, ts.metrics.storeErrors.WithLabelValues(opList)); got != 1 {
		t.Errorf("store errors{list} = %v", got)
	}
	// A wrapped not-found is the client's 404, not a store error.
	if resp := ts.get("/v1/pets/1", keyFree); resp.StatusCode != http.StatusNotFound {
		t.Errorf("wrapped ErrNotFound: %d", resp.StatusCode)
	}
	if got := metricValue(t, ts.metrics.storeErrors.WithLabelValues(opGet)); got != 0 {
		t.Errorf("store errors{get} = %v after a 404", got)
	}
}

// A store that cannot serve for now (say, an unmigrated database) is a 503
// with Retry-After, never a 500.
func TestStoreUnavailableIsRetryable(t *testing.T) {
	t.Parallel()
	cause := fmt.Errorf("postgres: list pets: %w: relation \"pets\" does not exist", pet.ErrUnavailable)
	ts := newTestServer(t, func(c *Config) {
		c.Store = &faultyStore{Store: memstore.New(), listErr: cause, getErr: fmt.Errorf("postgres: get pet 1: %w", pet.ErrUnavailable)}
	})
	for _, target := range []string{"/v1/pets", "/v1/pets/1"} {
		resp := ts.get(target, keyFree)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || resp.errorBody(t).Code != codeUnavailable {
			t.Errorf("%s: %d %v %s", target, resp.StatusCode, resp.Header, resp.body)
		}
		if strings.Contains(string(resp.body), "relation") {
			t.Errorf("%s: 503 leaks the cause: %s", target, resp.body)
		}
	}
	if got := metricValue(t, ts.metrics.storeErrors.WithLabelValues(opList)); got != 1 {
		t.Errorf("store errors{list} = %v", got)
	}
}

func TestClientGoneIsNotAServerError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ts := newTestServer(t, func(c *Config) {
		c.Store = &faultyStore{Store: memstore.New(), listErr: fmt.Errorf("memstore: list: %w", context.Canceled)}
	})
	rec := httpRequest(http.MethodGet, "/v1/pets", "").WithContext(ctx)
	rec.Header.Set("Authorization", "Bearer "+keyFree)
	w := newRecorderOnly()
	ts.handler.ServeHTTP(w, rec)
	if got := metricValue(t, ts.metrics.requests.WithLabelValues("/v1/pets", "GET", "499")); got != 1 {
		t.Errorf("requests{code=499} = %v", got)
	}
	if got := metricValue(t, ts.metrics.storeErrors.WithLabelValues(opList)); got != 0 {
		t.Errorf("a canceled request counted as a store error")
	}
	for _, r := range ts.logs.records(t) {
		if r["level"] == "ERROR" {
			t.Errorf("canceled request logged as an error: %v", r)
		}
	}
}

// TestHeadOverTheNetwork checks HEAD through a real server, which drops the
// body and keeps the headers GET would send.
func TestHeadOverTheNetwork(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	srv := httptest.NewServer(ts.handler)
	defer srv.Close()
	for _, target := range []string{"/v1/pets", "/openapi.yaml"} {
		req, _ := http.NewRequest(http.MethodHead, srv.URL+target, nil)
		req.Header.Set("Authorization", "Bearer "+keyFree)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.ContentLength <= 0 || resp.Header.Get("X-Request-Id") == "" {
			t.Errorf("HEAD %s: %d, %d body bytes, Content-Length %d", target, resp.StatusCode, len(body), resp.ContentLength)
		}
	}
}
