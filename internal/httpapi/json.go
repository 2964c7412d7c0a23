package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/animal-store/petstore/internal/pet"
)

// writeJSON answers with v encoded as JSON. Only the package's own types
// are written, which always encode; should one ever fail the client still
// gets a well-formed 500 rather than half a body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"code":"internal_error","message":"internal error","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
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
