package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	c := loadContract(t)
	for _, op := range []string{"listPets", "createPet", "getPet", "getRateLimit", "getOpenAPIYAML", "getOpenAPIJSON"} {
		found := false
		for _, item := range c.doc.Paths.Map() {
			for _, o := range item.Operations() {
				found = found || o.OperationID == op
			}
		}
		if !found {
			t.Errorf("operation %s is not documented", op)
		}
	}
	if !c.doc.Paths.Value("/pets/{petId}").Get.Deprecated {
		t.Error("getPet is not marked deprecated")
	}
}

// TestErrorCodesMatchDocument keeps the code enum and the codes writeError
// uses identical.
func TestErrorCodesMatchDocument(t *testing.T) {
	t.Parallel()
	var documented []string
	for _, v := range loadContract(t).doc.Components.Schemas["Error"].Value.Properties["code"].Value.Enum {
		documented = append(documented, v.(string))
	}
	used := []string{codeInvalidRequest, codeUnauthorized, codeNotFound, codeMethodNotAllowed, codePayloadTooLarge,
		codeUnsupportedMediaType, codeIdempotencyKeyReused, codeRateLimited, codeKeyBanned, codeInternalError, codeUnavailable}
	slices.Sort(documented)
	slices.Sort(used)
	if !slices.Equal(documented, used) {
		t.Errorf("documented codes %v, used %v", documented, used)
	}
}

// TestContractCheckCatchesMismatches proves the response check used by
// every test is not vacuous.
func TestContractCheckCatchesMismatches(t *testing.T) {
	t.Parallel()
	c := loadContract(t)
	good := func() *response {
		rec := httptest.NewRecorder()
		h := rec.Header()
		h.Set("X-Request-Id", "abc")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Type", "application/json")
		return &response{Response: &http.Response{StatusCode: http.StatusOK, Header: h}, body: []byte(`{"id":1,"name":"Rex","categoryId":2,"status":"sold"}`)}
	}
	req := httptest.NewRequest(http.MethodGet, "/v1/pets/1", nil)
	deprecated := func(r *response) *response {
		r.Header.Set("Deprecation", deprecationValue)
		r.Header.Set("Sunset", sunsetValue)
		r.Header.Set("Link", deprecationLinks)
		return r
	}
	if errs := c.check(req, deprecated(good())); len(errs) != 0 {
		t.Fatalf("a conforming response fails the check: %v", errs)
	}
	tests := map[string]func(r *response){
		"missing id":          func(r *response) { r.body = []byte(`{"name":"Rex","categoryId":2,"status":"sold"}`) },
		"bad status":          func(r *response) { r.body = []byte(`{"id":1,"name":"Rex","categoryId":2,"status":"lost"}`) },
		"undocumented status": func(r *response) { r.StatusCode = http.StatusTeapot },
		"no deprecation":      func(r *response) { r.Header.Del("Deprecation") },
		"no request id":       func(r *response) { r.Header.Del("X-Request-Id") },
		"cacheable":           func(r *response) { r.Header.Del("Cache-Control") },
		"canonical X-Ratelimit-Limit": func(r *response) {
			r.Header.Set("X-RateLimit-Limit", "60") // Set sends X-Ratelimit-Limit
		},
		"error status mismatch": func(r *response) {
			r.StatusCode = http.StatusNotFound
			r.body = []byte(`{"code":"not_found","message":"x","status":400}`)
		},
		"unknown error code": func(r *response) {
			r.StatusCode = http.StatusNotFound
			r.body = []byte(`{"code":"gone","message":"x","status":404}`)
		},
	}
	for name, breakIt := range tests {
		r := deprecated(good())
		breakIt(r)
		if errs := c.check(req, r); len(errs) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
}

func TestOpenAPIDocumentServed(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	y := ts.do(request{target: "/openapi.yaml"})
	if y.StatusCode != http.StatusOK || y.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("openapi.yaml: %d %q", y.StatusCode, y.Header.Get("Content-Type"))
	}
	j := ts.do(request{target: "/openapi.json"})
	if j.StatusCode != http.StatusOK || j.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("openapi.json: %d %q", j.StatusCode, j.Header.Get("Content-Type"))
	}
	var fromYAML, fromJSON any
	if err := yaml.Unmarshal(y.body, &fromYAML); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(j.body, &fromJSON); err != nil {
		t.Fatal(err)
	}
	// Compare through JSON so both sides use the same number types.
	b, _ := json.Marshal(fromYAML)
	var yamlAsJSON any
	_ = json.Unmarshal(b, &yamlAsJSON)
	if !reflect.DeepEqual(yamlAsJSON, fromJSON) {
		t.Error("openapi.json differs from openapi.yaml")
	}
	if !strings.Contains(string(y.body), "openapi: 3.0.3") {
		t.Error("openapi.yaml is not the OpenAPI 3.0.3 document")
	}
	// Served without a key, charged to the per-IP throttle.
	if y.Header.Get("X-RateLimit-Limit") == "" || len(ts.throttle.Calls()) != 2 {
		t.Errorf("document requests not throttled per IP: calls %v", ts.throttle.Calls())
	}
}
