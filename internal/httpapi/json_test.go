package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/animal-store/petstore/internal/pet"
)

// jsonStringCases are strings that exercise every rule of JSON string
// encoding: the ASCII bytes each encoder escapes, bytes that are not UTF-8,
// the two line separators JavaScript minds, and characters of every width.
var jsonStringCases = []string{
	"",
	"Rex",
	"pet 17",
	`say "woof"`,
	`back\slash`,
	"<b>&amp;</b>",
	"tab\there, new\nline, return\r",
	"\b\f\v\x00\x01\x1f\x7f",
	asciiBytes(),
	"Ñandú 🐶 狗",
	"\u2028\u2029 \u2027\u202a",
	"\ufffd",
	"\xff",
	"R\xffx",
	"\xe2\x82",         // a truncated three-byte character
	"\xe2\x82\xac\xe2", // a whole one, then a truncated one
	"\xed\xa0\x80",     // a UTF-16 surrogate spelled in UTF-8
	"\xc0\xaf",         // an overlong encoding of /
	"\xf4\x90\x80\x80", // beyond U+10FFFF
	strings.Repeat("a", 300) + "\x00",
}

// asciiBytes is every ASCII byte once.
func asciiBytes() string {
	var b strings.Builder
	for c := range byte(utf8.RuneSelf) {
		b.WriteByte(c)
	}
	return b.String()
}

// TestAppendPet: pets encode to exactly the bytes json.Marshal writes.
func TestAppendPet(t *testing.T) {
	t.Parallel()
	var pets []pet.Pet
	for i, name := range jsonStringCases {
		pets = append(pets, pet.Pet{ID: int64(i + 1), Name: name, CategoryID: 3, Status: pet.Statuses[i%3]})
	}
	pets = append(pets,
		pet.Pet{ID: math.MaxInt64, Name: "max", CategoryID: math.MaxInt64, Status: pet.StatusSold},
		pet.Pet{ID: math.MinInt64, CategoryID: -1, Status: `odd "status" <\x01>`},
		pet.Pet{},
	)
	for _, p := range pets {
		assertSameJSON(t, p)
	}
	for _, page := range [][]pet.Pet{nil, {}, pets[:1], pets} {
		assertSameJSON(t, page)
	}
}

// FuzzAppendPet holds appendPet to json.Marshal for any pet, and checks
// that encoding/json reads back the pet that was written, each byte that
// is not UTF-8 read as U+FFFD.
//
//	go test -run '^$' -fuzz FuzzAppendPet -fuzztime 30s ./internal/httpapi/
func FuzzAppendPet(f *testing.F) {
	for i, s := range jsonStringCases {
		f.Add(int64(i), s, int64(1), string(pet.Statuses[i%3]))
	}
	f.Fuzz(func(t *testing.T, id int64, name string, category int64, status string) {
		p := pet.Pet{ID: id, Name: name, CategoryID: category, Status: pet.Status(status)}
		got := assertSameJSON(t, p)
		var back pet.Pet
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%s does not decode: %v", got, err)
		}
		want := pet.Pet{ID: id, Name: decodedJSONString(name), CategoryID: category, Status: pet.Status(decodedJSONString(status))}
		if back != want {
			t.Errorf("%s decodes to %+v, want %+v", got, back, want)
		}
		assertSameJSON(t, []pet.Pet{p, p})
	})
}

// assertSameJSON fails unless appendJSON writes v as json.Marshal does, and
// returns what appendJSON wrote.
func assertSameJSON(t *testing.T, v any) []byte {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("prefix ")
	got, err := appendJSON(bytes.Clone(prefix), v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("appendJSON(%+v) lost what it appended to: %q", v, got)
	}
	got = got[len(prefix):]
	if !bytes.Equal(got, want) {
		t.Errorf("appendJSON(%+v)\n got %s\nwant %s", v, got, want)
	}
	return got
}

// decodedJSONString is s as a JSON decoder reads it back after encoding:
// each byte that is not part of a UTF-8 character becomes U+FFFD.
func decodedJSONString(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r)
		i += size
	}
	return b.String()
}

// TestJSONBodiesCarryTheirLength: every JSON answer carries a
// Content-Length equal to its body's length, never chunked, whether
// writeJSON sets the field (bodies past netHTTPBuffered) or net/http does
// (bodies it still holds when the handler returns); HEAD the same field
// without the body. Over a real server, for every body length around the
// threshold and lengths drawn up to three times it, under each status
// writeJSON answers with.
func TestJSONBodiesCarryTheirLength(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		writeJSON(w, status, strings.Repeat("x", n)) // "x…x" and a newline: n + 3 bytes
	}))
	defer srv.Close()
	lengths := []int{0, 1}
	for n := netHTTPBuffered - 8; n <= netHTTPBuffered+8; n++ {
		lengths = append(lengths, n-3)
	}
	rng := rand.New(rand.NewPCG(1, uint64(len(lengths))))
	for range 40 {
		lengths = append(lengths, rng.IntN(3*netHTTPBuffered))
	}
	statuses := []int{http.StatusOK, http.StatusCreated, http.StatusNotFound, http.StatusTooManyRequests, http.StatusServiceUnavailable}
	for i, n := range lengths {
		status := statuses[i%len(statuses)]
		want := int64(n + 3)
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			req, _ := http.NewRequest(method, fmt.Sprintf("%s/?n=%d&status=%d", srv.URL, n, status), nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			cl := resp.Header.Get("Content-Length")
			if resp.StatusCode != status || cl != strconv.FormatInt(want, 10) || len(resp.TransferEncoding) != 0 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%s of a %d-byte body: %d, Content-Length %q, Transfer-Encoding %v, Content-Type %q; want %d, %d, none, application/json",
					method, want, resp.StatusCode, cl, resp.TransferEncoding, resp.Header.Get("Content-Type"), status, want)
			}
			if method == http.MethodGet && int64(len(body)) != want || method == http.MethodHead && len(body) != 0 {
				t.Fatalf("%s of a %d-byte body: %d bytes read", method, want, len(body))
			}
		}
	}
}
