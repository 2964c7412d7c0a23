package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"math"

	"github.com/animal-store/petstore/internal/pet"
)

// cursor is where the next page of listPets starts and which filter the
// pages belong to.
type cursor struct {
	after  int64
	status pet.Status
}

// cursorVersion is the first byte of every cursor, so the format can change
// while older cursors are still recognised (and refused clearly).
const cursorVersion = 1

// cursorCheckLen is the length of the checksum ending every cursor.
const cursorCheckLen = 4

// encodeCursor makes the opaque cursor: base64url (unpadded) of
//
//	version(1) | after (uvarint) | status (bytes, empty for no filter) | SHA-256[:4] of the rest
//
// The checksum catches corrupted and truncated cursors. It is not a
// signature: a client that crafts a cursor only chooses where its own
// listing resumes, which the API allows anyway.
func encodeCursor(c cursor) string { return string(appendCursor(nil, c)) }

// appendCursor appends encodeCursor(c) to dst.
func appendCursor(dst []byte, c cursor) []byte {
	var buf [64]byte // room for every status; a longer one only costs an allocation
	b := append(buf[:0], cursorVersion)
	b = binary.AppendUvarint(b, uint64(c.after))
	b = append(b, c.status...)
	sum := sha256.Sum256(b)
	b = append(b, sum[:cursorCheckLen]...)
	return base64.RawURLEncoding.AppendEncode(dst, b)
}

// decodeCursor reverses encodeCursor, failing with a *pet.ValidationError
// for the cursor parameter.
func decodeCursor(s string) (cursor, error) {
	invalid := &pet.ValidationError{Field: "cursor", Message: "is not a cursor this API issued; use the Link rel=\"next\" of a previous page"}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 1+1+cursorCheckLen {
		return cursor{}, invalid
	}
	payload, check := b[:len(b)-cursorCheckLen], b[len(b)-cursorCheckLen:]
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:cursorCheckLen], check) || payload[0] != cursorVersion {
		return cursor{}, invalid
	}
	after, n := binary.Uvarint(payload[1:])
	if n <= 0 || after < 1 || after > math.MaxInt64 {
		return cursor{}, invalid
	}
	c := cursor{after: int64(after), status: pet.Status(payload[1+n:])}
	if c.status != "" && !c.status.Valid() {
		return cursor{}, invalid
	}
	return c, nil
}
