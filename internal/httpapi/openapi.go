package httpapi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// openAPIYAML is the API's OpenAPI 3.0 document.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIDocument is the document in both the forms it is served in.
type openAPIDocument struct {
	yaml []byte
	json []byte
	// err is why the JSON form could not be made (never, for the embedded
	// document: a test converts it).
	err error
}

// loadOpenAPI converts the embedded document to JSON once.
func loadOpenAPI() openAPIDocument {
	doc := openAPIDocument{yaml: openAPIYAML}
	var v any
	if err := yaml.Unmarshal(openAPIYAML, &v); err != nil {
		doc.err = fmt.Errorf("openapi.yaml: %w", err)
		return doc
	}
	b, err := json.Marshal(v)
	if err != nil {
		doc.err = fmt.Errorf("openapi.yaml to JSON: %w", err)
		return doc
	}
	doc.json = b
	return doc
}

// handleOpenAPIYAML serves the document as written.
func (s *server) handleOpenAPIYAML() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		serveDocument(w, "application/yaml", s.openapi.yaml)
	}
}

// handleOpenAPIJSON serves the document converted to JSON.
func (s *server) handleOpenAPIJSON() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.openapi.err != nil {
			s.writeError(w, r, s.openapi.err)
			return
		}
		serveDocument(w, "application/json", s.openapi.json)
	}
}

// serveDocument writes the document, which may be cached briefly: it
// changes only with a release.
func serveDocument(w http.ResponseWriter, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "public, max-age=300")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
