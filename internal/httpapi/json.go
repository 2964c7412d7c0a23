package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

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
// Unlike json.Unmarshal it refuses, naming the culprit: an empty body,
// anything but an object, a member name given twice, and data after the
// object. Read errors, such as *http.MaxBytesError, are returned as they are.
func decodeJSONObject(body io.Reader, member func(name string, dec *json.Decoder) error) error {
	dec := json.NewDecoder(body)
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
