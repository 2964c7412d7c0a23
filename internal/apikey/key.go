// Package apikey turns the bearer token of a request into the Principal it
// belongs to: which key, which plan, and the rate-limit policy in force.
//
// Keys look like pst_ followed by 32 random base62 characters and a 6-character
// base62 CRC32 of those (see Generate). The prefix lets secret scanners find
// leaked keys and the checksum lets a mistyped or made-up key be rejected
// without any lookup. A key is never stored or logged: only its SHA-256
// (Hash) is kept, and its public identifier (IDFromHash) is what logs,
// metrics, the command line and the rate limiter use.
//
// Keys come from a static YAML keys file (see ParseKeys) and from an
// optional database (KeyLookup). An Authenticator resolves tokens against
// both, caching database answers briefly; a Watcher reloads the plans and
// keys files when their content changes.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// Prefix starts every key.
const Prefix = "pst_"

const (
	secretLen   = 32
	checksumLen = 6
	// KeyLen is the length of a key: prefix, secret and checksum.
	KeyLen = len(Prefix) + secretLen + checksumLen
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// isBase62 tells the bytes of base62 apart, for CheckFormat: every request
// with a key has each of its characters checked.
var isBase62 = func() (t [256]bool) {
	for i := range len(base62) {
		t[base62[i]] = true
	}
	return t
}()

// Generate returns a new random key. Its 32 base62 characters carry about
// 190 bits from crypto/rand.
func Generate() (string, error) {
	key := make([]byte, 0, KeyLen)
	key = append(key, Prefix...)
	var buf [64]byte
	for len(key) < len(Prefix)+secretLen {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", fmt.Errorf("apikey: generate: %w", err)
		}
		for _, b := range buf {
			// 248 = 4*62: dropping larger bytes keeps every character
			// equally likely.
			if b >= 248 {
				continue
			}
			key = append(key, base62[b%62])
			if len(key) == len(Prefix)+secretLen {
				break
			}
		}
	}
	sum := checksum(key[len(Prefix):])
	return string(append(key, sum[:]...)), nil
}

// checksum is the CRC32 (IEEE) of secret in 6 base62 digits, zero-padded
// (62^6 > 2^32).
func checksum(secret []byte) [checksumLen]byte {
	n := crc32.ChecksumIEEE(secret)
	var out [checksumLen]byte
	for i := checksumLen - 1; i >= 0; i-- {
		out[i] = base62[n%62]
		n /= 62
	}
	return out
}

// CheckFormat reports, without any lookup, whether token is shaped like a
// key and its checksum matches; if not, the error wraps ErrMalformed. The
// error never quotes the token.
func CheckFormat(token string) error {
	if len(token) != KeyLen {
		return fmt.Errorf("%w: want %d characters, got %d", ErrMalformed, KeyLen, len(token))
	}
	if !strings.HasPrefix(token, Prefix) {
		return fmt.Errorf("%w: does not start with %s", ErrMalformed, Prefix)
	}
	body := token[len(Prefix):]
	for i := 0; i < len(body); i++ {
		if !isBase62[body[i]] {
			return fmt.Errorf("%w: characters outside 0-9, A-Z, a-z", ErrMalformed)
		}
	}
	if sum := checksum([]byte(body[:secretLen])); string(sum[:]) != body[secretLen:] {
		return fmt.Errorf("%w: checksum does not match", ErrMalformed)
	}
	return nil
}

// Hash returns the lowercase hex SHA-256 of key: what is stored instead of
// the key. Keys carry enough randomness that an unsalted fast hash is safe
// and lets a key be found by its hash.
func Hash(key string) string {
	h := appendHash(make([]byte, 0, hashLen), key)
	return string(h)
}

// hashLen is the length of a Hash.
const hashLen = 2 * sha256.Size

// appendHash appends Hash(key) to dst.
func appendHash(dst []byte, key string) []byte {
	var buf [KeyLen]byte // a well-formed key is hashed without allocating
	sum := sha256.Sum256(append(buf[:0], key...))
	return hex.AppendEncode(dst, sum[:])
}

// IDFromHash returns a key's public identifier: "key_" followed by the first
// 16 hex characters of its hash, e.g. key_3a7bd3e2360a3d29. It identifies the
// key in logs, metrics and on the command line, and is the rate limiter's
// key, without revealing anything usable to call the API.
func IDFromHash(hash string) string {
	if len(hash) > 16 {
		hash = hash[:16]
	}
	return "key_" + hash
}

// validHash reports whether h is a lowercase hex SHA-256.
func validHash(h string) bool {
	if len(h) != sha256.Size*2 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ParseAuthorization returns the token of an "Authorization: Bearer TOKEN"
// header value. The scheme is matched in any case (RFC 7235). An empty
// header is ErrMissing; any other scheme, or no token, is ErrMalformed.
func ParseAuthorization(header string) (string, error) {
	header = strings.TrimSpace(header)
	if header == "" {
		return "", ErrMissing
	}
	scheme, token, _ := strings.Cut(header, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: authorization scheme is not Bearer", ErrMalformed)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("%w: empty bearer token", ErrMalformed)
	}
	return token, nil
}

// Reason names the kind of an authentication error in one word, for the
// reason label of petstore_auth_failures_total: missing, malformed, unknown,
// revoked, unavailable, or error for anything else.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrMissing):
		return "missing"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrUnknown):
		return "unknown"
	case errors.Is(err, ErrRevoked):
		return "revoked"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "error"
}
