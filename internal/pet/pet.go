// Package pet defines the Animal Store's domain: pets, their statuses, the
// rules a new pet must satisfy and the errors every store reports.
package pet

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Status is a pet's availability.
type Status string

// The statuses of the PetStatus enumeration.
const (
	StatusAvailable Status = "available"
	StatusPending   Status = "pending"
	StatusSold      Status = "sold"
)

// Statuses lists every valid status in a stable order.
var Statuses = []Status{StatusAvailable, StatusPending, StatusSold}

// Valid reports whether s is one of the PetStatus values.
func (s Status) Valid() bool {
	switch s {
	case StatusAvailable, StatusPending, StatusSold:
		return true
	}
	return false
}

// ParseStatus returns the Status named by v or a *ValidationError for field.
func ParseStatus(field, v string) (Status, error) {
	s := Status(v)
	if !s.Valid() {
		return "", &ValidationError{Field: field, Message: fmt.Sprintf("must be one of available, pending, sold; got %q", v)}
	}
	return s, nil
}

// Name length bounds, counted in Unicode code points after trimming.
const (
	MaxNameLength = 100
)

// Pet is an animal held by the store.
type Pet struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     Status `json:"status"`
}

// NewPet is what a client supplies to add a pet; the store assigns the id.
type NewPet struct {
	Name       string
	CategoryID int64
	Status     Status
}

// Normalize trims the name and applies the default status. Call it before
// Validate; stores receive normalized values.
func (n NewPet) Normalize() NewPet {
	n.Name = strings.TrimSpace(n.Name)
	if n.Status == "" {
		n.Status = StatusAvailable
	}
	return n
}

// Validate checks a normalized NewPet against the documented rules: the
// name is 1 to MaxNameLength code points of valid UTF-8 without control
// characters, at least one of them Visible.
func (n NewPet) Validate() error {
	switch l := utf8.RuneCountInString(n.Name); {
	case l == 0:
		return &ValidationError{Field: "name", Message: "must not be empty"}
	case l > MaxNameLength:
		return &ValidationError{Field: "name", Message: fmt.Sprintf("must be at most %d characters, got %d", MaxNameLength, l)}
	}
	if !utf8.ValidString(n.Name) {
		return &ValidationError{Field: "name", Message: "must be valid UTF-8"}
	}
	for _, r := range n.Name {
		if unicode.IsControl(r) {
			return &ValidationError{Field: "name", Message: "must not contain control characters"}
		}
	}
	if !strings.ContainsFunc(n.Name, Visible) {
		return &ValidationError{Field: "name", Message: "must contain at least one visible character (a letter, digit, punctuation mark or symbol)"}
	}
	if n.CategoryID < 1 {
		return &ValidationError{Field: "categoryId", Message: "must be an integer from 1 to 9223372036854775807"}
	}
	if !n.Status.Valid() {
		return &ValidationError{Field: "status", Message: fmt.Sprintf("must be one of available, pending, sold; got %q", n.Status)}
	}
	return nil
}

// Visible reports whether r shows as a mark of its own: a letter, digit,
// punctuation mark or symbol that is not default-ignorable. Spaces,
// combining marks, format characters (U+200B ZERO WIDTH SPACE, U+FEFF
// BYTE ORDER MARK, U+200D ZERO WIDTH JOINER), variation selectors and
// fillers such as U+3164 HANGUL FILLER are not: a name made only of them
// looks empty. A name must contain at least one visible character.
func Visible(r rune) bool {
	return unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S) &&
		!unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// ListQuery selects one page of pets ordered by ascending id.
type ListQuery struct {
	// Status filters by status; empty means every status.
	Status Status
	// After excludes pets whose id is <= After (keyset pagination).
	After int64
	// Limit is the maximum number of pets returned; stores may assume > 0.
	Limit int
}

// Idempotency asks a store to make a create safe to retry. A create with a
// Key seen within TTL returns the pet that the first create made instead of
// making another; a Key seen with a different Fingerprint fails with
// ErrIdempotencyConflict.
type Idempotency struct {
	// Key is already scoped to the caller (for example "keyID/header value").
	Key string
	// Fingerprint identifies the request body (a hex SHA-256 of it).
	Fingerprint string
	// TTL is how long the key is remembered.
	TTL time.Duration
}

// Errors reported by stores and validation. Stores wrap them with %w.
var (
	ErrNotFound            = errors.New("pet not found")
	ErrIdempotencyConflict = errors.New("idempotency key reused with a different request body")
	// ErrUnavailable means the store cannot serve the request now (say,
	// its database schema is not migrated yet); a retry later may succeed.
	ErrUnavailable = errors.New("pet store unavailable")
)

// ValidationError says which field of a request is wrong and why.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}
