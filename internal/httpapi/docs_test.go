package httpapi

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

func TestDocsPage(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	page := ts.do(request{target: "/docs"})
	if page.StatusCode != http.StatusOK || page.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("/docs: %d %q", page.StatusCode, page.Header.Get("Content-Type"))
	}
	csp := page.Header.Get("Content-Security-Policy")
	for _, directive := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, directive+";") && !strings.HasSuffix(csp, directive) {
			t.Errorf("Content-Security-Policy %q lacks %s", csp, directive)
		}
	}
	// Everything the page refers to is on this host (or inline data).
	refs := regexp.MustCompile(`(?:src|href|spec-url)="([^"]*)"`).FindAllStringSubmatch(string(page.body), -1)
	if len(refs) < 3 {
		t.Fatalf("page refers to %d things: %s", len(refs), page.body)
	}
	fetched := 0
	for _, ref := range refs {
		u := ref[1]
		if !(strings.HasPrefix(u, "/") && !strings.HasPrefix(u, "//")) && !strings.HasPrefix(u, "data:") {
			t.Errorf("page refers to %q, not on this host", u)
			continue
		}
		if strings.HasPrefix(u, "/") {
			fetched++
			if resp := ts.do(request{target: u}); resp.StatusCode != http.StatusOK {
				t.Errorf("%s (referred to by the page): %d", u, resp.StatusCode)
			}
		}
	}
	// No key needed; each request is charged to the per-IP throttle.
	if page.Header.Get("X-RateLimit-Limit") == "" || len(ts.throttle.Calls()) != 1+fetched {
		t.Errorf("docs requests not throttled per IP: calls %v", ts.throttle.Calls())
	}
}

func TestDocsFiles(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for name, want := range map[string]struct {
		contentType string
		starts      string
	}{
		"redoc.standalone.js":             {"text/javascript; charset=utf-8", "/*! For license information please see redoc.standalone.js.LICENSE.txt */"},
		"redoc.standalone.js.LICENSE.txt": {"text/plain; charset=utf-8", ""},
		"LICENSE":                         {"text/plain; charset=utf-8", "The MIT License"},
	} {
		resp := ts.do(request{target: "/docs/" + name})
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != want.contentType {
			t.Errorf("%s: %d %q", name, resp.StatusCode, resp.Header.Get("Content-Type"))
			continue
		}
		if len(resp.body) < 1000 && name == "redoc.standalone.js" || !bytes.HasPrefix(resp.body, []byte(want.starts)) || len(resp.body) == 0 {
			t.Errorf("%s: %d bytes starting %.80q", name, len(resp.body), resp.body)
		}
	}
	for _, target := range []string{"/docs/", "/docs/redoc.js", "/docs/..%2Fopenapi.yaml", "/docs/license"} {
		if resp := ts.do(request{target: target}); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", target, resp.StatusCode)
		}
	}
	if resp := ts.do(request{method: http.MethodPost, target: "/docs"}); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /docs: %d, want 405", resp.StatusCode)
	}
}
