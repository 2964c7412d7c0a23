package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/animal-store/petstore/internal/pet"
)

// badCreateBodies are createPet bodies that must be refused with 400
// invalid_request naming field. They seed the decoder's fuzz corpus too.
var badCreateBodies = []struct {
	name  string
	body  string
	field string
}{
	{"empty body", ``, "body"},
	{"only spaces", `   `, "body"},
	{"array", `[{"name":"Rex","categoryId":1}]`, "body"},
	{"string", `"Rex"`, "body"},
	{"number", `42`, "body"},
	{"null", `null`, "body"},
	{"truncated", `{"name":"Rex","categoryId":1`, "body"},
	{"truncated in a member", `{"name":"Re`, "body"},
	{"malformed", `{"name":"Rex",,"categoryId":1}`, "body"},
	{"single quotes", `{'name':'Rex','categoryId':1}`, "body"},
	{"trailing object", `{"name":"Rex","categoryId":1}{}`, "body"},
	{"trailing garbage", `{"name":"Rex","categoryId":1} x`, "body"},
	{"trailing comma", `{"name":"Rex","categoryId":1,}`, "body"},
	{"unknown field", `{"name":"Rex","categoryId":1,"color":"brown"}`, "color"},
	{"field names are case-sensitive", `{"Name":"Rex","categoryId":1}`, "Name"},
	{"id in body", `{"id":7,"name":"Rex","categoryId":1}`, "id"},
	{"duplicate name", `{"name":"Rex","name":"Max","categoryId":1}`, "name"},
	{"duplicate through escapes", `{"name":"Rex","n\u0061me":"Max","categoryId":1}`, "name"},
	{"missing name", `{"categoryId":1}`, "name"},
	{"empty object", `{}`, "name"},
	{"name null", `{"name":null,"categoryId":1}`, "name"},
	{"name number", `{"name":5,"categoryId":1}`, "name"},
	{"name array", `{"name":["Rex"],"categoryId":1}`, "name"},
	{"name object", `{"name":{"first":"Rex"},"categoryId":1}`, "name"},
	{"name empty", `{"name":"","categoryId":1}`, "name"},
	{"name blank", `{"name":" \t\n ","categoryId":1}`, "name"},
	{"name too long", `{"name":"` + strings.Repeat("x", pet.MaxNameLength+1) + `","categoryId":1}`, "name"},
	{"name control character", `{"name":"Re\u0000x","categoryId":1}`, "name"},
	{"name escape character", `{"name":"Re\u001bx","categoryId":1}`, "name"},
	{"name invalid UTF-8", "{\"name\":\"\xff\xfe\",\"categoryId\":1}", "name"},
	{"name truncated UTF-8", "{\"name\":\"R\xc3\",\"categoryId\":1}", "name"},
	{"name UTF-8 surrogate bytes", "{\"name\":\"\xed\xa0\x80\",\"categoryId\":1}", "name"},
	{"name overlong UTF-8", "{\"name\":\"\xc0\xafx\",\"categoryId\":1}", "name"},
	{"name Latin-1", "{\"name\":\"Ca\xf1a\",\"categoryId\":1}", "name"},
	{"name unpaired high surrogate", `{"name":"\ud800","categoryId":1}`, "name"},
	{"name unpaired low surrogate", `{"name":"R\udc36x","categoryId":1}`, "name"},
	{"name reversed surrogates", `{"name":"\udc36\ud83d","categoryId":1}`, "name"},
	{"name high surrogate then letter", `{"name":"\ud83d\u0041","categoryId":1}`, "name"},
	{"name high surrogate at the end", `{"name":"x\ud83d","categoryId":1}`, "name"},
	{"name zero-width space", `{"name":"\u200b","categoryId":1}`, "name"},
	{"name zero-width space literal", "{\"name\":\" \u200b \",\"categoryId\":1}", "name"},
	{"name byte order mark", `{"name":"\ufeff\u2060","categoryId":1}`, "name"},
	{"name hangul filler", `{"name":"\u3164","categoryId":1}`, "name"},
	{"invalid UTF-8 after the name", "{\"name\":\"Rex\",\"categoryId\":1,\"status\":\"sold\xff\"}", "status"},
	{"invalid UTF-8 in an unknown member", "{\"name\":\"Rex\",\"color\":\"\xffbrown\",\"categoryId\":1}", "color"},
	{"invalid UTF-8 in a member name", "{\"na\xffme\":\"Rex\",\"categoryId\":1}", "body"},
	{"invalid UTF-8 between members", "{\"name\":\"Rex\" \xff,\"categoryId\":1}", "body"},
	{"missing categoryId", `{"name":"Rex"}`, "categoryId"},
	{"categoryId fraction", `{"name":"Rex","categoryId":1.5}`, "categoryId"},
	{"categoryId whole fraction", `{"name":"Rex","categoryId":1.0}`, "categoryId"},
	{"categoryId exponent", `{"name":"Rex","categoryId":1e3}`, "categoryId"},
	{"categoryId capital exponent", `{"name":"Rex","categoryId":1E3}`, "categoryId"},
	{"categoryId string", `{"name":"Rex","categoryId":"1"}`, "categoryId"},
	{"categoryId null", `{"name":"Rex","categoryId":null}`, "categoryId"},
	{"categoryId bool", `{"name":"Rex","categoryId":true}`, "categoryId"},
	{"categoryId zero", `{"name":"Rex","categoryId":0}`, "categoryId"},
	{"categoryId negative", `{"name":"Rex","categoryId":-1}`, "categoryId"},
	{"categoryId negative zero", `{"name":"Rex","categoryId":-0}`, "categoryId"},
	{"categoryId 2^63", `{"name":"Rex","categoryId":9223372036854775808}`, "categoryId"},
	{"categoryId huge", `{"name":"Rex","categoryId":` + strings.Repeat("9", 400) + `}`, "categoryId"},
	{"categoryId leading zero", `{"name":"Rex","categoryId":01}`, "categoryId"},
	{"status unknown", `{"name":"Rex","categoryId":1,"status":"lost"}`, "status"},
	{"status wrong case", `{"name":"Rex","categoryId":1,"status":"Sold"}`, "status"},
	{"status number", `{"name":"Rex","categoryId":1,"status":1}`, "status"},
	{"status empty", `{"name":"Rex","categoryId":1,"status":""}`, "status"},
}

func TestCreatePetRejectsBadBodies(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for _, tt := range badCreateBodies {
		t.Run(tt.name, func(t *testing.T) {
			ts := *ts
			ts.t = t
			resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: tt.body,
				headers: map[string]string{"Content-Type": "application/json"}})
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", resp.StatusCode, resp.body)
			}
			e := resp.errorBody(t)
			if e.Code != codeInvalidRequest {
				t.Errorf("code %q, want %q", e.Code, codeInvalidRequest)
			}
			if !strings.HasPrefix(e.Message, tt.field+": ") {
				t.Errorf("message %q does not start with the field %q", e.Message, tt.field)
			}
			if len(e.Message) > 300 {
				t.Errorf("message of %d bytes echoes too much input", len(e.Message))
			}
		})
	}
	// Nothing was created by any of them.
	if list := ts.get("/v1/pets", keyFree); string(list.body) != "[]\n" {
		t.Errorf("pets after refused creates: %s", list.body)
	}
}

// TestCreatePetKeepsTheClientsText: what a client reads back is exactly
// the text it sent, escaped or not; a replacement character is stored only
// when the client sent one.
func TestCreatePetKeepsTheClientsText(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for body, want := range map[string]string{
		`{"name":"\ud83d\udc36","categoryId":1}`:      "\U0001F436",
		`{"name":"\uD83D\uDC36 Rex","categoryId":1}`:  "\U0001F436 Rex",
		"{\"name\":\"\U0001F436\",\"categoryId\":1}":  "\U0001F436",
		`{"name":"Caf\u00e9","categoryId":1}`:         "Caf\u00e9",
		"{\"name\":\"Caf\u00e9\",\"categoryId\":1}":   "Caf\u00e9",
		`{"name":"\ufffd","categoryId":1}`:            "\ufffd",
		"{\"name\":\"\ufffd\",\"categoryId\":1}":      "\ufffd",
		`{"name":"\u200bRex\u200d","categoryId":1}`:   "\u200bRex\u200d",
		`{"name":"a\\ud800","categoryId":1}`:          `a\ud800`, // an escaped backslash, not an escape
		`{"name":"q\"\\\ud83d\udc36","categoryId":1}`: "q\"\\\U0001F436",
	} {
		resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: body})
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("%s: status %d, body %s", body, resp.StatusCode, resp.body)
			continue
		}
		if got := resp.pet(t).Name; got != want {
			t.Errorf("%s: stored %q, want %q", body, got, want)
		}
	}
}

func TestCreatePetContentType(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	body := `{"name":"Rex","categoryId":1}`
	tests := []struct {
		contentType string
		status      int
	}{
		{"application/json", http.StatusCreated},
		{"application/json; charset=utf-8", http.StatusCreated},
		{"Application/JSON; Charset=UTF-8", http.StatusCreated},
		{"application/json; charset=iso-8859-1", http.StatusUnsupportedMediaType},
		{"text/plain", http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"application/merge-patch+json", http.StatusUnsupportedMediaType},
		{"application/json;;", http.StatusUnsupportedMediaType},
		{" ", http.StatusUnsupportedMediaType},
	}
	for _, tt := range tests {
		resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: body,
			headers: map[string]string{"Content-Type": tt.contentType}})
		if resp.StatusCode != tt.status {
			t.Errorf("Content-Type %q: status %d, want %d", tt.contentType, resp.StatusCode, tt.status)
		}
		if tt.status == http.StatusUnsupportedMediaType && resp.errorBody(t).Code != codeUnsupportedMediaType {
			t.Errorf("Content-Type %q: code %q", tt.contentType, resp.errorBody(t).Code)
		}
	}
	// No Content-Type at all.
	r := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree})
	if r.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("no Content-Type: status %d, want 415", r.StatusCode)
	}
}

func TestCreatePetBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 256
	ts := newTestServer(t, func(c *Config) { c.MaxBodyBytes = limit })
	pad := func(n int) string {
		// A valid body of exactly n bytes: white space is allowed anywhere.
		b := `{"name":"Rex","categoryId":1}`
		return b + strings.Repeat(" ", n-len(b))
	}
	if r := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: pad(limit)}); r.StatusCode != http.StatusCreated {
		t.Errorf("body of exactly the limit: status %d, body %s", r.StatusCode, r.body)
	}
	r := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: pad(limit + 1)})
	if r.StatusCode != http.StatusRequestEntityTooLarge || r.errorBody(t).Code != codePayloadTooLarge {
		t.Errorf("body over the limit: status %d, body %s", r.StatusCode, r.body)
	}
	big := `{"name":"` + strings.Repeat("x", 10*limit) + `","categoryId":1}`
	if r := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: big}); r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("large body: status %d, want 413", r.StatusCode)
	}
}

func TestIdempotentCreate(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	post := func(key, idem, body string) *response {
		return ts.do(request{method: http.MethodPost, target: "/v1/pets", key: key, body: body,
			headers: map[string]string{"Idempotency-Key": idem}})
	}
	first := post(keyFree, "order-1", `{"name":"Rex","categoryId":1}`)
	if first.StatusCode != http.StatusCreated {
		t.Fatalf("first: %d %s", first.StatusCode, first.body)
	}
	// The same pet spelled differently is the same request; the structured
	// string form of the header names the same key.
	for _, retry := range []struct{ idem, body string }{
		{"order-1", `{"name":"Rex","categoryId":1}`},
		{"order-1", "{ \"categoryId\" : 1,\n \"name\" : \" Rex \", \"status\": \"available\" }"},
		{`"order-1"`, `{"name":"\u0052ex","categoryId":1}`},
	} {
		again := post(keyFree, retry.idem, retry.body)
		if again.StatusCode != http.StatusCreated {
			t.Fatalf("replay %s: %d %s", retry.body, again.StatusCode, again.body)
		}
		if string(again.body) != string(first.body) || again.Header.Get("Location") != first.Header.Get("Location") {
			t.Errorf("replay %s: body %s Location %s, want %s %s", retry.body, again.body, again.Header.Get("Location"), first.body, first.Header.Get("Location"))
		}
		if again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay %s: no Idempotent-Replayed: true", retry.body)
		}
	}
	// A different pet under the same key is refused.
	conflict := post(keyFree, "order-1", `{"name":"Max","categoryId":1}`)
	if conflict.StatusCode != http.StatusUnprocessableEntity || conflict.errorBody(t).Code != codeIdempotencyKeyReused {
		t.Errorf("conflict: %d %s", conflict.StatusCode, conflict.body)
	}
	// Keys are scoped per API key: another key's order-1 is a new request.
	other := post(keyOther, "order-1", `{"name":"Max","categoryId":1}`)
	if other.StatusCode != http.StatusCreated || other.Header.Get("Idempotent-Replayed") != "" || other.pet(t).ID == first.pet(t).ID {
		t.Errorf("other key: %d %s replayed=%q", other.StatusCode, other.body, other.Header.Get("Idempotent-Replayed"))
	}
	var list []pet.Pet
	decodeJSON(t, ts.get("/v1/pets", keyFree).body, &list)
	if len(list) != 2 {
		t.Errorf("%d pets created, want 2: %+v", len(list), list)
	}
}

func TestIdempotentCreateConcurrent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	const n = 16
	ids := make([]int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree,
				body: `{"name":"Rex","categoryId":1}`, headers: map[string]string{"Idempotency-Key": "same"}})
			if resp.StatusCode == http.StatusCreated {
				ids[i] = resp.pet(t).ID
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		if id != ids[0] || id == 0 {
			t.Fatalf("request %d got pet %d, request 0 got %d", i, id, ids[0])
		}
	}
}

func TestIdempotencyKeyValidation(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	tests := []struct {
		name  string
		value []string
		ok    bool
	}{
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, true},
		{"quoted", []string{`"0b5d3c2e-65b1-4c8f-9a51-2f7f0e4d7a10"`}, true},
		{"255 characters", []string{strings.Repeat("k", 255)}, true},
		{"visible punctuation", []string{"a!#$%&'()*+,-./:;<=>?@[]^_`{|}~z"}, true},
		{"256 characters", []string{strings.Repeat("k", 256)}, false},
		{"empty", []string{""}, false},
		{"empty quoted", []string{`""`}, false},
		{"inner space", []string{"a b"}, false},
		{"non-ASCII", []string{"clé"}, false},
		{"control", []string{"a\x01b"}, false},
		{"quote inside quotes", []string{`"a"b"`}, false},
		{"twice", []string{"a", "b"}, false},
	}
	for i, tt := range tests {
		r := httpRequest(http.MethodPost, "/v1/pets", fmt.Sprintf(`{"name":"Pet %d","categoryId":1}`, i))
		r.Header.Set("Authorization", "Bearer "+keyFree)
		r.Header["Idempotency-Key"] = tt.value
		resp := ts.serve(r)
		switch {
		case tt.ok && resp.StatusCode != http.StatusCreated:
			t.Errorf("%s: status %d, body %s", tt.name, resp.StatusCode, resp.body)
		case !tt.ok && resp.StatusCode != http.StatusBadRequest:
			t.Errorf("%s: status %d, want 400", tt.name, resp.StatusCode)
		case !tt.ok && !strings.HasPrefix(resp.errorBody(t).Message, "Idempotency-Key: "):
			t.Errorf("%s: message %q does not name Idempotency-Key", tt.name, resp.errorBody(t).Message)
		}
	}
}
