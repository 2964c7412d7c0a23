package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
)

// FuzzCreatePet sends arbitrary bodies to createPet through the full
// router: the answer is always 201 with a valid pet or a 400/413 Error,
// never a 500 (which a recovered panic would also produce).
//
//	go test -run '^$' -fuzz FuzzCreatePet -fuzztime 30s ./internal/httpapi/
func FuzzCreatePet(f *testing.F) {
	for _, tt := range badCreateBodies {
		f.Add([]byte(tt.body))
	}
	for _, s := range []string{
		`{"name":"Rex","categoryId":1}`,
		`{"name":"Rex","categoryId":1,"status":"sold"}`,
		`{"status":null,"categoryId":9223372036854775807,"name":" Ñandú "}`,
		`{"name":"\ud83d\udc36","categoryId":2}`,
		`{"name":"\ud800","categoryId":2}`,
		"{\"name\":\"R\xffx\",\"categoryId\":2}",
		`{"a":{"b":[1,2,{"c":null}]},"name":"x","categoryId":1}`,
		`{"name":"x","categoryId":1}` + strings.Repeat(" ", 100),
		"{\"name\":\"\xff\xfe\",\"categoryId\":1}",
		`{"name":"\u200b","categoryId":1}`,
		"{\"name\":\"\u200b\ufeff\",\"categoryId\":1}",
		`{"name":"\ud83d\udc36\udc36","categoryId":1}`,
		`{"name":"\\ud800\ufffd","categoryId":1}`,
	} {
		f.Add([]byte(s))
	}
	const limit = 4096
	ts := &testServer{handler: NewServer(Config{Store: memstore.New(), Auth: testAuth{}, MaxBodyBytes: limit})}
	c, err := contract()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/pets", strings.NewReader(string(body)))
		r.Header.Set("Authorization", "Bearer "+keyFree)
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		ts.handler.ServeHTTP(rec, r)
		resp := &response{Response: rec.Result(), body: rec.Body.Bytes()}
		for _, err := range c.check(r, resp) {
			t.Errorf("%q: %v", body, err)
		}
		switch resp.StatusCode {
		case http.StatusCreated:
			var p pet.Pet
			if err := json.Unmarshal(resp.body, &p); err != nil {
				t.Fatalf("%q: 201 body %q: %v", body, resp.body, err)
			}
			n := pet.NewPet{Name: p.Name, CategoryID: p.CategoryID, Status: p.Status}
			if p.ID < 1 || n.Validate() != nil || n.Normalize() != n || !utf8.ValidString(p.Name) {
				t.Fatalf("%q: created an invalid pet %+v", body, p)
			}
			// A replacement character is stored only when the client sent
			// one, as UTF-8 or as an escape.
			if strings.ContainsRune(p.Name, utf8.RuneError) && !sentReplacement(body) {
				t.Fatalf("%q: stored %q, a replacement character the client did not send", body, p.Name)
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var e errorBody
			if err := json.Unmarshal(resp.body, &e); err != nil || e.Message == "" {
				t.Fatalf("%q: error body %q", body, resp.body)
			}
			if len(body) <= limit && resp.StatusCode == http.StatusRequestEntityTooLarge {
				t.Fatalf("%q: 413 for %d bytes, limit %d", body, len(body), limit)
			}
		default:
			t.Fatalf("%q: status %d, body %s", body, resp.StatusCode, resp.body)
		}
	})
}

// sentReplacement reports whether a body holds U+FFFD as UTF-8 or as a
// \ufffd escape.
func sentReplacement(body []byte) bool {
	return strings.ContainsRune(string(body), utf8.RuneError) && utf8.Valid(body) ||
		strings.Contains(strings.ToLower(string(body)), `\ufffd`)
}
