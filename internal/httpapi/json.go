package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/animal-store/petstore/internal/pet"
)

// writeJSON answers with v encoded as JSON (as json.Marshal writes it) and
// a newline. Only the package's own types are written, which always encode;
// should one ever fail the client still gets a well-formed 500 rather than
// half a body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := bodyBuffers.Get().(*[]byte)
	body, err := appendJSON((*buf)[:0], v)
	if err != nil {
		status = http.StatusInternalServerError
		body = append(body[:0], `{"code":"internal_error","message":"internal error","status":500}`...)
	}
	body = append(body, '\n')
	// Under names spelled canonically (Header.Set canonicalises again),
	// each value with capacity one, so that appending to it copies.
	h := w.Header()
	if len(body) <= netHTTPBuffered {
		// net/http sends Content-Length itself, outside the map.
		h["Content-Type"] = []string{"application/json"}
	} else {
		// Both values in one allocation (Header.Set makes one each).
		values := []string{"application/json", strconv.Itoa(len(body))}
		h["Content-Type"], h["Content-Length"] = values[0:1:1], values[1:2:2]
	}
	w.WriteHeader(status)
	_, _ = w.Write(body) // a Writer never keeps what it is given (io.Writer)
	if cap(body) <= maxPooledBody {
		*buf = body[:0]
		bodyBuffers.Put(buf)
	}
}

// netHTTPBuffered is how much of a body net/http's server holds before
// sending the header (its bufferBeforeChunkingSize): a body of at most
// this much, written in one piece, is still held when the handler
// returns, and the server then sends its Content-Length itself, beside
// Date, outside the handler's header map. writeJSON leaves the field out
// of the map for such bodies, so that a page of pets with the
// specification's three rate-limit fields holds eight entries, not nine:
// Go keeps a map of up to eight in one small group, and a ninth makes
// both the handler's map and the server's copy of it hash tables, about
// three times the cost of the header (BenchmarkResponseFieldCount).
// TestJSONBodiesCarryTheirLength holds the field to every length.
const netHTTPBuffered = 2048

// bodyBuffers holds response bodies between requests; a page of 100 pets
// with long names fits in maxPooledBody, larger ones are left to the GC.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxPooledBody = 64 << 10

// appendJSON appends v as json.Marshal encodes it. Pets, most of what is
// written, are encoded without reflection by appendPet.
func appendJSON(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case pet.Pet:
		return appendPet(b, v), nil
	case []pet.Pet:
		return appendPets(b, v), nil
	}
	m, err := json.Marshal(v)
	return append(b, m...), err
}

// appendPets appends pets as json.Marshal encodes a []pet.Pet.
func appendPets(b []byte, pets []pet.Pet) []byte {
	if pets == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, p := range pets {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendPet(b, p)
	}
	return append(b, ']')
}

// appendPet appends p as json.Marshal encodes it: the members in the order
// of pet.Pet's fields, named by their tags. TestAppendPet and
// FuzzAppendPet hold the two encodings to the same bytes, so a field added
// to pet.Pet without being added here fails them.
func appendPet(b []byte, p pet.Pet) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, p.ID, 10)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, p.Name, marshalEscapes)
	b = append(b, `,"categoryId":`...)
	b = strconv.AppendInt(b, p.CategoryID, 10)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, p.Status, marshalEscapes)
	return append(b, '}')
}

// jsonEscapes says how each ASCII byte is written inside a JSON string:
// as itself when plain, otherwise as spelled. Two encoders are matched
// byte for byte, and they differ here only.
type jsonEscapes struct {
	plain [256]bool // false beyond ASCII too, where characters are looked at whole
	spell [utf8.RuneSelf]string
}

var (
	// marshalEscapes is encoding/json's Marshal: control characters,
	// quote and backslash escaped (\b \f \n \r \t short), and <, > and &
	// as \u003c, \u003e and \u0026 so that no body can be read as HTML.
	marshalEscapes = newJSONEscapes(true)
	// logEscapes is log/slog's JSON handler: no HTML escaping, and only
	// \n \r \t short.
	logEscapes = newJSONEscapes(false)
)

func newJSONEscapes(marshal bool) *jsonEscapes {
	const hex = "0123456789abcdef"
	var e jsonEscapes
	for b := range byte(0x20) {
		e.spell[b] = `\u00` + string(hex[b>>4]) + string(hex[b&0xf])
	}
	e.spell['"'], e.spell['\\'] = `\"`, `\\`
	e.spell['\n'], e.spell['\r'], e.spell['\t'] = `\n`, `\r`, `\t`
	if marshal {
		e.spell['\b'], e.spell['\f'] = `\b`, `\f`
		e.spell['<'], e.spell['>'], e.spell['&'] = `\u003c`, `\u003e`, `\u0026`
	}
	for b, spelled := range e.spell {
		e.plain[b] = spelled == ""
	}
	// e.plain[utf8.RuneSelf:] stay false.
	return &e
}

// appendJSONString appends s as a quoted JSON string, ASCII spelled by esc.
// Beyond ASCII, both encoders it matches write a byte that is not part of
// UTF-8 as \ufffd and escape U+2028 and U+2029 (which JavaScript takes for
// line ends); every other character is written as it is.
func appendJSONString[S ~string | ~[]byte](b []byte, s S, esc *jsonEscapes) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if esc.plain[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			b = append(b, esc.spell[c]...)
			i++
			start = i
			continue
		}
		// At most UTFMax bytes are converted, which needs no allocation.
		r, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		var e string
		switch {
		case r == utf8.RuneError && size == 1:
			e = `\ufffd`
		case r == '\u2028':
			e = `\u2028`
		case r == '\u2029':
			e = `\u2029`
		}
		if e != "" {
			b = append(b, s[start:i]...)
			b = append(b, e...)
			start = i + size
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeJSONObject reads a body that must hold exactly one JSON object and
// calls member for each of its members in order, with dec positioned at the
// member's value; member must consume exactly that value (or fail).
//
// Unlike json.Unmarshal it refuses, naming the culprit: text that is not
// UTF-8 or escapes an unpaired surrogate (see checkText), an empty body,
// anything but an object, a member name given twice, and data after the
// object. Read errors, such as *http.MaxBytesError, are returned as they are.
func decodeJSONObject(body io.Reader, member func(name string, dec *json.Decoder) error) error {
	b, err := io.ReadAll(body) // bounded by the caller (http.MaxBytesReader)
	if err != nil {
		return err
	}
	if err := checkText(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return &pet.ValidationError{Field: "body", Message: "must be a JSON object, got an empty body"}
	case err != nil:
		return syntaxError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return &pet.ValidationError{Field: "body", Message: "must be a JSON object, got " + jsonKind(tok)}
	}
	seen := make(map[string]bool, 4)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		name, ok := tok.(string) // the decoder yields only string keys here
		if !ok {
			return &pet.ValidationError{Field: "body", Message: "malformed JSON: object member names must be strings"}
		}
		if seen[name] {
			return &pet.ValidationError{Field: name, Message: "appears more than once"}
		}
		seen[name] = true
		if err := member(name, dec); err != nil {
			return syntaxError(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return syntaxError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil && !isSyntaxError(err) {
			return err
		}
		return &pet.ValidationError{Field: "body", Message: "must hold a single JSON object; found data after it"}
	}
	return nil
}

// syntaxError describes malformed JSON as a client error naming the body;
// other errors (validation, read failures) pass through.
func syntaxError(err error) error {
	if !isSyntaxError(err) {
		return err
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &pet.ValidationError{Field: "body", Message: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error())}
	}
	return &pet.ValidationError{Field: "body", Message: "malformed JSON: the body ends before the object does"}
}

// isSyntaxError reports malformed or truncated JSON; an end of input inside
// the object counts as truncation.
func isSyntaxError(err error) bool {
	var se *json.SyntaxError
	return errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// jsonKind names the JSON type of a token for error messages.
func jsonKind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return "an object"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// checkText refuses a body that encoding/json would silently change:
// bytes that are not UTF-8 (RFC 8259 requires it), and \u escapes of an
// unpaired UTF-16 surrogate. json.Unmarshal turns both into U+FFFD, so the
// pet stored would hold replacement characters the client never sent. The
// error names the member whose value holds the first offence ("body" when
// it lies outside any value).
func checkText(b []byte) error {
	off, problem := firstInvalidText(b)
	if off < 0 {
		return nil
	}
	return &pet.ValidationError{Field: memberAt(b, off), Message: problem}
}

// firstInvalidText returns the offset of the first byte that is not UTF-8,
// or of the first escaped unpaired surrogate inside a string, and what is
// wrong there; -1 when there is none. Other mistakes are left to the JSON
// decoder.
func firstInvalidText(b []byte) (int, string) {
	inString := false
	for i := 0; i < len(b); {
		c := b[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, fmt.Sprintf("must be UTF-8 text (RFC 8259); byte %d (0x%02x) is not part of a UTF-8 character", i, c)
			}
			i += size
			continue
		}
		switch {
		case !inString:
			inString = c == '"'
			i++
		case c == '"':
			inString = false
			i++
		case c == '\\' && i+1 < len(b) && b[i+1] == 'u':
			r, ok := hexRune(b[i+2:])
			if !ok || !utf16.IsSurrogate(r) {
				i += 2 // the decoder reports a malformed escape
				continue
			}
			if r < 0xdc00 && len(b) >= i+12 && b[i+6] == '\\' && b[i+7] == 'u' {
				if low, ok := hexRune(b[i+8:]); ok && 0xdc00 <= low && low <= 0xdfff {
					i += 12 // a surrogate pair: one character outside the BMP
					continue
				}
			}
			return i, fmt.Sprintf("must be valid Unicode; the escape %s at byte %d is an unpaired surrogate (write a character outside the BMP as a pair, as in \\ud83d\\udc36)", b[i:i+6], i)
		case c == '\\' && i+1 < len(b) && b[i+1] < utf8.RuneSelf:
			i += 2 // an escaped quote or backslash does not end the string
		default:
			i++
		}
	}
	return -1, ""
}

// hexRune reads the four hex digits of a \u escape.
func hexRune(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

// memberAt names the top-level object member whose value contains byte
// off of b, or "body" when off lies elsewhere (in a member name, between
// members, or b is not an object).
func memberAt(b []byte, off int) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "body"
	}
	for dec.More() {
		tok, err := dec.Token()
		name, ok := tok.(string)
		if err != nil || !ok || int64(off) < dec.InputOffset() {
			return "body"
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return "body"
		}
		if int64(off) < dec.InputOffset() {
			return shorten(name)
		}
	}
	return "body"
}
