package apikey

import (
	"errors"

	"github.com/animal-store/petstore/ratelimit"
)

// Principal is the authenticated caller: which key, which plan, and the
// effective rate-limit policy (plan windows with the key's overrides applied).
type Principal struct {
	// KeyID is the key's public identifier (never the secret).
	KeyID  string
	Label  string
	Plan   string
	Policy ratelimit.Policy
}

// Errors returned by Authenticate. ErrMissing, ErrMalformed, ErrUnknown and
// ErrRevoked all mean 401 to a client; they are distinct so that logs and
// metrics can tell them apart (see Reason).
var (
	ErrMissing   = errors.New("apikey: no API key")
	ErrMalformed = errors.New("apikey: malformed API key")
	ErrUnknown   = errors.New("apikey: unknown API key")
	ErrRevoked   = errors.New("apikey: revoked API key")
)

// ErrUnavailable wraps a failure to reach the key database (or a lookup cut
// short by the request's deadline): the key may well be valid, so a client
// gets 503 and should retry, not 401. Such failures are never cached.
var ErrUnavailable = errors.New("apikey: key store unavailable")
