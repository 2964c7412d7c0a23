package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// contract is the OpenAPI document, loaded and validated once per test
// binary; kin-openapi only reads it afterwards.
var contract = sync.OnceValues(func() (*contractDoc, error) {
	// The docs page and its script are text, checked against their string
	// schemas like text/plain.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/javascript", openapi3filter.PlainBodyDecoder)
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate openapi.yaml: %w", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route openapi.yaml: %w", err)
	}
	return &contractDoc{doc: doc, router: router}, nil
})

type contractDoc struct {
	doc    *openapi3.T
	router routers.Router
}

func loadContract(t testing.TB) *contractDoc {
	t.Helper()
	c, err := contract()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Test API keys known to testAuth.
const (
	keyFree     = "pst_free_key"
	keyOther    = "pst_other_key"
	keyRevoked  = "pst_revoked_key"
	keyUnknown  = "pst_unknown_key"
	keyBadShape = "not-a-key"
	keyDBDown   = "pst_db_down"
	keyBroken   = "pst_broken"
)

var freePolicy = ratelimit.Policy{Name: "free", Windows: []ratelimit.Window{
	{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour},
}}

// testAuth is a map-backed Authenticator.
type testAuth struct{}

func (testAuth) Authenticate(_ context.Context, token string, _ func() error) (apikey.Principal, error) {
	switch token {
	case keyFree:
		return apikey.Principal{KeyID: "key_free", Label: "acme", Plan: "free", Policy: freePolicy}, nil
	case keyOther:
		return apikey.Principal{KeyID: "key_other", Label: "other", Plan: "free", Policy: freePolicy}, nil
	case keyRevoked:
		return apikey.Principal{}, fmt.Errorf("key_revoked: %w", apikey.ErrRevoked)
	case keyDBDown:
		return apikey.Principal{}, fmt.Errorf("%w: dial tcp: connection refused", apikey.ErrUnavailable)
	case keyBroken:
		return apikey.Principal{}, errors.New("apikey: cache invariant broken at entry 7")
	}
	if !strings.HasPrefix(token, "pst_") {
		return apikey.Principal{}, apikey.ErrMalformed
	}
	return apikey.Principal{}, apikey.ErrUnknown
}

// fakeLimiter answers every key with one decision (or error) and records the calls.
type fakeLimiter struct {
	mu       sync.Mutex
	decision ratelimit.Decision
	err      error
	keys     []string
}

func (f *fakeLimiter) Allow(_ context.Context, key string, _ ratelimit.Policy) (ratelimit.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	return f.decision, f.err
}

func (f *fakeLimiter) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// fakeThrottle is a Throttle built on fakeLimiter.
type fakeThrottle struct{ fakeLimiter }

func (f *fakeThrottle) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return f.fakeLimiter.Allow(ctx, key, ratelimit.Policy{})
}

// Throttled reports the fixed decision's verdict without recording a call.
func (f *fakeThrottle) Throttled(context.Context, string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.decision.Outcome != ratelimit.Allowed, f.err
}

// allowed returns an admitting decision for the free policy with the given
// remaining counts, resetting at the given times.
func allowed(now time.Time, remMinute, remDay int64) ratelimit.Decision {
	d := ratelimit.Decision{Outcome: ratelimit.Allowed, Windows: []ratelimit.WindowState{
		{Window: freePolicy.Windows[0], Remaining: remMinute, Reset: now.Add(30 * time.Second)},
		{Window: freePolicy.Windows[1], Remaining: remDay, Reset: now.Add(20 * time.Hour)},
	}}
	if remDay < remMinute {
		d.Binding = 1
	}
	return d
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct{ testenv.Buffer }

// lines returns the JSON log records.
func (b *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// testServer is a NewServer with test doubles and a client that checks every
// response against the OpenAPI document.
type testServer struct {
	t        *testing.T
	contract *contractDoc
	handler  http.Handler
	store    PetStore
	limiter  *fakeLimiter
	throttle *fakeThrottle
	registry *prometheus.Registry
	metrics  *Metrics
	logs     *logBuffer
}

type serverOption func(*Config)

func newTestServer(t *testing.T, opts ...serverOption) *testServer {
	t.Helper()
	ts := &testServer{
		t:        t,
		contract: loadContract(t),
		limiter:  &fakeLimiter{decision: allowed(time.Now(), 59, 999)},
		throttle: &fakeThrottle{fakeLimiter{decision: ratelimit.Decision{Outcome: ratelimit.Allowed, Windows: []ratelimit.WindowState{
			{Window: ratelimit.Window{Limit: 10, Period: time.Minute}, Remaining: 9, Reset: time.Now().Add(6 * time.Second)},
		}}}},
		registry: prometheus.NewRegistry(),
		logs:     &logBuffer{},
	}
	cfg := Config{
		Store:          memstore.New(),
		Auth:           testAuth{},
		Limiter:        ts.limiter,
		Throttle:       ts.throttle,
		Logger:         slog.New(NewJSONLogHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:        NewMetrics(ts.registry),
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		// Every rate-limit field, so that the tests check the draft's
		// two as well; TestDraftLimitFieldsOmitted checks a server
		// without them (the default).
		DraftLimitFields: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	ts.store = cfg.Store
	ts.metrics = cfg.Metrics
	ts.handler = NewServer(cfg)
	return ts
}

// response is a served response with its body read.
type response struct {
	*http.Response
	body []byte
}

// errorBody decodes an Error body.
func (r *response) errorBody(t *testing.T) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("decode Error body %q: %v", r.body, err)
	}
	return e
}

// pet decodes a Pet body.
func (r *response) pet(t *testing.T) pet.Pet {
	t.Helper()
	var p pet.Pet
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode Pet body %q: %v", r.body, err)
	}
	return p
}

// request describes a request to send.
type request struct {
	method  string
	target  string
	body    string
	key     string // sent as a bearer token unless empty
	headers map[string]string
	remote  string // socket peer, default 192.0.2.1:1234
	ctx     context.Context
}

// do serves req and validates the response against the OpenAPI document.
func (ts *testServer) do(req request) *response {
	ts.t.Helper()
	method := req.method
	if method == "" {
		method = http.MethodGet
	}
	var body io.Reader
	if req.body != "" {
		body = strings.NewReader(req.body)
	}
	r := httptest.NewRequest(method, req.target, body)
	if req.ctx != nil {
		r = r.WithContext(req.ctx)
	}
	r.RemoteAddr = "192.0.2.1:1234"
	if req.remote != "" {
		r.RemoteAddr = req.remote
	}
	if req.key != "" {
		r.Header.Set("Authorization", "Bearer "+req.key)
	}
	if req.body != "" && req.headers["Content-Type"] == "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range req.headers {
		r.Header.Set(k, v)
	}
	return ts.serve(r)
}

// serve serves a prepared request and validates the response.
func (ts *testServer) serve(r *http.Request) *response {
	ts.t.Helper()
	rec := httptest.NewRecorder()
	ts.handler.ServeHTTP(rec, r)
	resp := &response{Response: rec.Result(), body: rec.Body.Bytes()}
	ts.validate(r, resp)
	// Read the fields as a client reading the wire would: by any spelling.
	resp.Header = canonicalHeader(resp.Header)
	return resp
}

// exactSpellings are the field names the server must send spelled exactly
// so, not in Go's canonical form.
var exactSpellings = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}

// spellingErrors reports fields of h that are not spelled as the
// specification spells them, or, for the others, in canonical form (the
// server writes some names straight into the map).
func spellingErrors(h http.Header) []error {
	var errs []error
	for name := range h {
		exact := false
		for _, want := range exactSpellings {
			if strings.EqualFold(name, want) {
				exact = true
				if name != want {
					errs = append(errs, fmt.Errorf("header %s is sent as %q", want, name))
				}
			}
		}
		if !exact && name != http.CanonicalHeaderKey(name) {
			errs = append(errs, fmt.Errorf("header %s is sent as %q", http.CanonicalHeaderKey(name), name))
		}
	}
	return errs
}

// canonicalHeader is h with every name in canonical form, as a client
// reading the response off the wire sees it.
func canonicalHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for name, values := range h {
		for _, v := range values {
			out.Add(name, v)
		}
	}
	return out
}

// httpRequest builds a request from the default client address.
func httpRequest(method, target, body string) *http.Request {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	r.RemoteAddr = "192.0.2.1:1234"
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	return r
}

// decodeJSON decodes a response body into v.
func decodeJSON(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
}

// get is do for a GET with a key.
func (ts *testServer) get(target, key string) *response {
	ts.t.Helper()
	return ts.do(request{target: target, key: key})
}

// create adds a pet through the API and returns it.
func (ts *testServer) create(name string, categoryID int64, status pet.Status) pet.Pet {
	ts.t.Helper()
	resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree,
		body: fmt.Sprintf(`{"name":%q,"categoryId":%d,"status":%q}`, name, categoryID, status)})
	if resp.StatusCode != http.StatusCreated {
		ts.t.Fatalf("create %q: status %d, body %s", name, resp.StatusCode, resp.body)
	}
	return resp.pet(ts.t)
}

// validate reports every way a response breaks the document or the rules
// every response follows.
func (ts *testServer) validate(req *http.Request, resp *response) {
	ts.t.Helper()
	for _, err := range ts.contract.check(req, resp) {
		ts.t.Errorf("%s %s: %v", req.Method, req.URL, err)
	}
}

// check returns the ways resp breaks the document or the common rules.
func (c *contractDoc) check(req *http.Request, resp *response) []error {
	errs := spellingErrors(resp.Header)
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	h := canonicalHeader(resp.Header)
	if h.Get("X-Request-Id") == "" {
		fail("no X-Request-Id")
	}
	if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
		fail("X-Content-Type-Options = %q", got)
	}
	wantCache := "no-store"
	if resp.StatusCode == http.StatusOK && (req.URL.Path == "/openapi.yaml" || req.URL.Path == "/openapi.json" ||
		req.URL.Path == "/docs" || strings.HasPrefix(req.URL.Path, "/docs/")) {
		wantCache = "public, max-age=300"
	}
	if got := h.Get("Cache-Control"); got != wantCache {
		fail("Cache-Control = %q, want %q", got, wantCache)
	}
	if resp.StatusCode >= 400 && req.Method != http.MethodHead {
		if ct := h.Get("Content-Type"); ct != "application/json" {
			fail("error Content-Type = %q", ct)
		}
		var e errorBody
		if err := json.Unmarshal(resp.body, &e); err != nil {
			fail("error body %q: %v", resp.body, err)
		} else if e.Status != resp.StatusCode {
			fail("Error.status %d != HTTP status %d", e.Status, resp.StatusCode)
		}
	}

	// Route as the document sees it; HEAD is documented through GET.
	routed := req.Clone(context.Background())
	if routed.Method == http.MethodHead {
		routed.Method = http.MethodGet
	}
	route, params, err := c.router.FindRoute(routed)
	if err != nil {
		return append(errs, c.checkUnrouted(req, resp, err)...)
	}
	if req.Method == http.MethodHead {
		// The server drops a HEAD response's body (see TestHeadOverTheNetwork).
		if route.Operation.Responses.Status(resp.StatusCode) == nil {
			fail("status %d not documented for GET", resp.StatusCode)
		}
		return errs
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: routed, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  resp.StatusCode,
		Header:  h,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(resp.body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		fail("response %d does not match the document: %v\nbody: %s", resp.StatusCode, err, resp.body)
	}
	return errs
}

// checkUnrouted checks responses to requests the document has no operation
// for: they can only be errors the router gives for any path.
func (c *contractDoc) checkUnrouted(req *http.Request, resp *response, routeErr error) []error {
	var errs []error
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		errs = append(errs, fmt.Errorf("status %d for a request the document does not route (%v)", resp.StatusCode, routeErr))
	}
	if resp.StatusCode == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "" {
		errs = append(errs, errors.New("405 without Allow"))
	}
	if req.Method == http.MethodHead {
		return errs
	}
	var v any
	if err := json.Unmarshal(resp.body, &v); err != nil {
		return append(errs, fmt.Errorf("body is not JSON: %w", err))
	}
	if err := c.doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
		errs = append(errs, fmt.Errorf("body does not match Error: %w", err))
	}
	return errs
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// metricValue reads a counter's or gauge's value.
func metricValue(t *testing.T, m prometheus.Metric) float64 { return testenv.MetricValue(t, m) }

// newRecorderOnly is a recorder for requests whose answer nobody reads.
func newRecorderOnly() *httptest.ResponseRecorder { return httptest.NewRecorder() }
