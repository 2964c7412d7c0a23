package httpapi

import (
	_ "embed"
	"net/http"

	"github.com/go-chi/chi/v5"
)

// The docs page renders the embedded OpenAPI document with Redoc. Redoc's
// standalone bundle and its license notices are vendored in docs/ from the
// npm package redoc at the version deploy/api/package-lock.json pins
// (make api-lint checks that they are identical); deploy/api/vendor-redoc
// copies them after a version change. The page makes no request to any
// other host, and its Content-Security-Policy keeps it so.
var (
	//go:embed docs/redoc.standalone.js
	redocScript []byte
	//go:embed docs/redoc.standalone.js.LICENSE.txt
	redocScriptNotices []byte
	//go:embed docs/LICENSE
	redocLicense []byte
)

// docsPage loads the script and the document from this host only. The
// empty data: icon spares the browser a request for /favicon.ico.
const docsPage = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Animal Store API</title>
<link rel="icon" href="data:,">
</head>
<body>
<redoc spec-url="/openapi.json"></redoc>
<script src="/docs/redoc.standalone.js"></script>
</body>
</html>
`

// docsPolicy allows the page only this host's script and document. Redoc
// needs inline styles (it renders with styled-components), data: images
// and fonts in its theme, and a blob: worker for its search index.
const docsPolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// docsFiles are the files the page refers to, by the name in their path.
var docsFiles = map[string]struct {
	contentType string
	body        []byte
}{
	"redoc.standalone.js":             {"text/javascript; charset=utf-8", redocScript},
	"redoc.standalone.js.LICENSE.txt": {"text/plain; charset=utf-8", redocScriptNotices},
	"LICENSE":                         {"text/plain; charset=utf-8", redocLicense},
}

// handleDocs serves the docs page.
func (s *server) handleDocs() http.HandlerFunc {
	page := []byte(docsPage)
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", docsPolicy)
		serveDocument(w, "text/html; charset=utf-8", page)
	}
}

// handleDocsFile serves the page's script and its license notices.
func (s *server) handleDocsFile() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, ok := docsFiles[chi.URLParam(r, "file")]
		if !ok {
			s.writeError(w, r, errNoRoute)
			return
		}
		serveDocument(w, f.contentType, f.body)
	}
}
