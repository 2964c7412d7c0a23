package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/animal-store/petstore/internal/pet"
)

// Operations, as labelled in petstore_store_errors_total.
const (
	opCreate = "create"
	opGet    = "get"
	opList   = "list"
)

// Page sizes of listPets.
const (
	defaultPageSize = 20
	maxPageSize     = 100
)

// handleListPets answers GET /v1/pets: one page of pets in ascending id
// order, and a Link rel="next" while more remain.
func handleListPets(store PetStore, fail errorWriter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := parseListQuery(r)
		if err != nil {
			fail(w, r, err)
			return
		}
		// One more than asked tells whether a next page exists.
		pets, err := store.List(r.Context(), pet.ListQuery{Status: q.status, After: q.after, Limit: q.limit + 1})
		if err != nil {
			fail(w, r, &storeError{op: opList, err: err})
			return
		}
		if len(pets) > q.limit {
			pets = pets[:q.limit]
			w.Header().Set("Link", nextPageLink(q, pets[len(pets)-1].ID))
		}
		if pets == nil {
			pets = []pet.Pet{} // an empty page is [], never null
		}
		writeJSON(w, http.StatusOK, pets)
	}
}

// listQuery is listPets' validated query string.
type listQuery struct {
	limit  int
	status pet.Status
	after  int64
}

// parseListQuery validates listPets' parameters: each at most once, no
// others, and a cursor only with the status filter it was made for.
func parseListQuery(r *http.Request) (listQuery, error) {
	q := listQuery{limit: defaultPageSize}
	values, err := queryParams(r, "limit", "status", "cursor")
	if err != nil {
		return q, err
	}
	if v, ok := values["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || !allDigits(v) || n < 1 || n > maxPageSize {
			return q, &pet.ValidationError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d, got %s", maxPageSize, quoteShort(v))}
		}
		q.limit = n
	}
	if v, ok := values["status"]; ok {
		if q.status, err = pet.ParseStatus("status", v); err != nil {
			return q, err
		}
	}
	if v, ok := values["cursor"]; ok {
		c, err := decodeCursor(v)
		if err != nil {
			return q, err
		}
		if c.status != q.status {
			return q, &pet.ValidationError{Field: "cursor", Message: fmt.Sprintf(
				"was made for %s; repeat that filter with it, or start again without a cursor", describeFilter(c.status))}
		}
		q.after = c.after
	}
	return q, nil
}

func describeFilter(s pet.Status) string {
	if s == "" {
		return "the unfiltered list"
	}
	return "status=" + string(s)
}

// nextPageLink is the RFC 8288 link to the page after the pet lastID.
func nextPageLink(q listQuery, lastID int64) string {
	b := make([]byte, 0, 128) // the link of any valid query fits
	b = append(b, "</v1/pets?limit="...)
	b = strconv.AppendInt(b, int64(q.limit), 10)
	if q.status != "" {
		b = append(b, "&status="...)
		b = append(b, url.QueryEscape(string(q.status))...)
	}
	b = append(b, "&cursor="...)
	b = appendCursor(b, cursor{after: lastID, status: q.status})
	b = append(b, `>; rel="next"`...)
	return string(b)
}

// handleCreatePet answers POST /v1/pets: decode, validate, store (once per
// Idempotency-Key), 201 with the pet and its Location.
func handleCreatePet(store PetStore, maxBodyBytes int64, idempotencyTTL time.Duration, fail errorWriter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := queryParams(r); err != nil {
			fail(w, r, err)
			return
		}
		if !isJSON(r.Header.Get("Content-Type")) {
			fail(w, r, errUnsupportedMediaType)
			return
		}
		key, err := idempotencyKey(r.Header)
		if err != nil {
			fail(w, r, err)
			return
		}
		np, err := decodeNewPet(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if err != nil {
			fail(w, r, err)
			return
		}
		np = np.Normalize()
		if err := np.Validate(); err != nil {
			fail(w, r, err)
			return
		}
		var idem *pet.Idempotency
		if key != "" {
			p, _ := principalFrom(r.Context())
			idem = &pet.Idempotency{Key: p.KeyID + "/" + key, Fingerprint: fingerprint(np), TTL: idempotencyTTL}
		}
		created, replayed, err := store.Create(r.Context(), np, idem)
		if err != nil {
			fail(w, r, &storeError{op: opCreate, err: err})
			return
		}
		h := w.Header()
		h.Set("Location", "/v1/pets/"+strconv.FormatInt(created.ID, 10))
		if replayed {
			h.Set("Idempotent-Replayed", "true")
		}
		writeJSON(w, http.StatusCreated, created)
	}
}

// isJSON accepts application/json with, at most, a utf-8 charset (JSON is
// UTF-8 by definition, RFC 8259) and any other parameters.
func isJSON(contentType string) bool {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil || mediaType != "application/json" {
		return false
	}
	charset, ok := params["charset"]
	return !ok || strings.EqualFold(charset, "utf-8")
}

// maxIdempotencyKeyLength bounds the Idempotency-Key.
const maxIdempotencyKeyLength = 255

// idempotencyKey returns the request's Idempotency-Key, "" when it has none.
// The key is 1 to 255 visible ASCII characters, sent bare (abc) or, as
// draft-ietf-httpapi-idempotency-key-header writes it, as a structured
// string ("abc"); both spell the same key.
func idempotencyKey(h http.Header) (string, error) {
	values := h.Values("Idempotency-Key")
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", &pet.ValidationError{Field: "Idempotency-Key", Message: "must be sent at most once"}
	}
	k := values[0]
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
		if strings.ContainsAny(k, `"\`) {
			return "", &pet.ValidationError{Field: "Idempotency-Key", Message: `a quoted key must not contain " or \`}
		}
	}
	if len(k) == 0 || len(k) > maxIdempotencyKeyLength {
		return "", &pet.ValidationError{Field: "Idempotency-Key", Message: fmt.Sprintf("must be 1 to %d characters, got %d", maxIdempotencyKeyLength, len(k))}
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", &pet.ValidationError{Field: "Idempotency-Key", Message: "must be visible ASCII characters only (no spaces)"}
		}
	}
	return k, nil
}

// fingerprint identifies a create request by the pet it asks for, after
// decoding and normalization, so that retries differing only in JSON
// spelling (spacing, member order, escapes, an explicit default status)
// count as the same request.
func fingerprint(np pet.NewPet) string {
	// Names hold no control characters, so NUL separates fields safely.
	sum := sha256.Sum256(fmt.Appendf(nil, "createPet\x00%s\x00%d\x00%s", np.Name, np.CategoryID, np.Status))
	return hex.EncodeToString(sum[:])
}

// decodeNewPet reads a NewPet strictly: name (string) and categoryId
// (integer literal) required, status optional (null means omitted), no
// other members; each mistake is reported naming its field.
func decodeNewPet(body io.Reader) (pet.NewPet, error) {
	var (
		np                     pet.NewPet
		haveName, haveCategory bool
	)
	err := decodeJSONObject(body, func(name string, dec *json.Decoder) error {
		switch name {
		case "name", "categoryId", "status":
		case "id":
			return &pet.ValidationError{Field: "id", Message: "is assigned by the server; leave it out"}
		default:
			return &pet.ValidationError{Field: shorten(name), Message: "is not a field of NewPet (name, categoryId, status)"}
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch name {
		case "name":
			s, ok := tok.(string)
			if !ok {
				return &pet.ValidationError{Field: "name", Message: "must be a string, got " + jsonKind(tok)}
			}
			np.Name, haveName = s, true
		case "categoryId":
			id, err := categoryID(tok)
			if err != nil {
				return err
			}
			np.CategoryID, haveCategory = id, true
		case "status":
			switch v := tok.(type) {
			case nil:
				np.Status = ""
			case string:
				if np.Status, err = pet.ParseStatus("status", v); err != nil {
					return err
				}
			default:
				return &pet.ValidationError{Field: "status", Message: "must be one of available, pending, sold; got " + jsonKind(tok)}
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return pet.NewPet{}, err
	case !haveName:
		return pet.NewPet{}, &pet.ValidationError{Field: "name", Message: "is required"}
	case !haveCategory:
		return pet.NewPet{}, &pet.ValidationError{Field: "categoryId", Message: "is required"}
	}
	return np, nil
}

// categoryID accepts a JSON integer literal from 1 to 2^63-1. Numbers
// with a fraction or an exponent (1.0, 1e3) are refused even when their
// value is whole: an id is written as an integer.
func categoryID(tok json.Token) (int64, error) {
	n, ok := tok.(json.Number)
	if !ok {
		return 0, &pet.ValidationError{Field: "categoryId", Message: "must be an integer, got " + jsonKind(tok)}
	}
	s := string(n)
	if strings.ContainsAny(s, ".eE") {
		return 0, &pet.ValidationError{Field: "categoryId", Message: "must be an integer without fraction or exponent, got " + shorten(s)}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, &pet.ValidationError{Field: "categoryId", Message: "must be an integer from 1 to 9223372036854775807, got " + shorten(s)}
	}
	return id, nil
}

// handleGetPet answers GET /v1/pets/{petId} (deprecated; see deprecateGetPet).
func handleGetPet(store PetStore, fail errorWriter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := queryParams(r); err != nil {
			fail(w, r, err)
			return
		}
		raw := chi.URLParam(r, "petId")
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || !allDigits(raw) || id < 1 {
			fail(w, r, &pet.ValidationError{Field: "petId", Message: "must be an integer from 1 to 9223372036854775807, got " + quoteShort(raw)})
			return
		}
		p, err := store.Get(r.Context(), id)
		if err != nil {
			fail(w, r, &storeError{op: opGet, err: err})
			return
		}
		writeJSON(w, http.StatusOK, p)
	}
}

// handleNotFound answers paths no route serves.
func (s *server) handleNotFound() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		requestInfoFrom(r.Context()).unmatched = true
		s.writeError(w, r, errNoRoute)
	}
}

// handleMethodNotAllowed answers methods a path does not serve, listing
// those it does in Allow. OPTIONS is not served: there is no browser (CORS)
// use of this API. A method chi does not know reaches this handler for any
// path; where the path serves nothing at all the answer is 404.
func (s *server) handleMethodNotAllowed() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		requestInfoFrom(r.Context()).unmatched = true
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if s.findRoute(m, r) != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			s.writeError(w, r, errNoRoute)
			return
		}
		s.writeError(w, r, &methodNotAllowedError{method: r.Method, allow: allow})
	}
}

// queryParams returns the single values of the allowed query parameters and
// refuses any other parameter, and any parameter given twice, by name.
func queryParams(r *http.Request, allowed ...string) (map[string]string, error) {
	if r.URL.RawQuery == "" {
		return nil, nil
	}
	values, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, &pet.ValidationError{Field: "query", Message: "malformed query string: " + err.Error()}
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	slices.Sort(names) // report the same parameter every time
	single := make(map[string]string, len(values))
	for _, name := range names {
		if !slices.Contains(allowed, name) {
			expected := "none"
			if len(allowed) > 0 {
				expected = strings.Join(allowed, ", ")
			}
			return nil, &pet.ValidationError{Field: shorten(name), Message: "is not a query parameter of this operation (expected: " + expected + ")"}
		}
		if len(values[name]) > 1 {
			return nil, &pet.ValidationError{Field: name, Message: "must be given at most once"}
		}
		single[name] = values[name][0]
	}
	return single, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// maxEcho bounds how much of a client's input an error message repeats.
const maxEcho = 64

// shorten cuts s to maxEcho bytes for an error message.
func shorten(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	return strings.ToValidUTF8(s[:maxEcho], "") + "..."
}

// quoteShort quotes a shortened s for an error message.
func quoteShort(s string) string { return strconv.Quote(shorten(s)) }
