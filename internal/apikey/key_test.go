package apikey_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/apikey"
)

// Keys of testdata/keys.yaml.
const (
	devKey     = "pst_wSXq4KkNxr5dynwXqpHJ9CiLJ2aBU3W926TIk9" // free, listed in plaintext
	acmeKey    = "pst_3xG5rqfz0txeVU5PKUfpxf39fR0CRId02gTxb9" // enterprise, listed by sha256
	revokedKey = "pst_FC2UnCPDPwTQSHLcGscaN9wJOlHwRuhe26gzBc" // pro, revoked
	otherKey   = "pst_WEs4Wr08jJcKwoXvB8ujvfl2nVnDA9tp3zqugo" // well formed, not listed
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func TestGenerate(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 1000 {
		k, err := apikey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != apikey.KeyLen || !strings.HasPrefix(k, "pst_") || strings.Trim(k[4:], base62) != "" {
			t.Fatalf("Generate() = %q: want pst_ and %d base62 characters", k, apikey.KeyLen-4)
		}
		if err := apikey.CheckFormat(k); err != nil {
			t.Fatalf("CheckFormat(Generate()) = %v", err)
		}
		if seen[k] {
			t.Fatalf("Generate() repeated %q", k)
		}
		seen[k] = true
	}
}

func TestCheckFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"generated", devKey, true},
		{"another", otherKey, true},
		{"empty", "", false},
		{"too short", devKey[:len(devKey)-1], false},
		{"too long", devKey + "0", false},
		{"other prefix", "psk_" + devKey[4:], false},
		{"prefix in capitals", "PST_" + devKey[4:], false},
		{"not base62", devKey[:10] + "-" + devKey[11:], false},
		{"non-ASCII", devKey[:10] + "é" + devKey[12:], false},
		{"checksum changed", devKey[:len(devKey)-1] + "A", false},
		{"two characters swapped", devKey[:5] + devKey[6:7] + devKey[5:6] + devKey[7:], false},
		{"plausible but made up", "pst_" + strings.Repeat("a", 38), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := apikey.CheckFormat(tt.token)
			if tt.ok {
				if err != nil {
					t.Fatalf("CheckFormat() = %v", err)
				}
				return
			}
			if !errors.Is(err, apikey.ErrMalformed) {
				t.Fatalf("CheckFormat() = %v, want ErrMalformed", err)
			}
			if tt.token != "" && strings.Contains(err.Error(), tt.token) {
				t.Fatalf("the error quotes the token: %v", err)
			}
		})
	}
}

// A key's characters are base62 and nothing else: each of the 256 byte
// values in a key is refused as a character or else only by the checksum.
func TestCheckFormatCharacters(t *testing.T) {
	t.Parallel()
	for c := range 256 {
		token := devKey[:10] + string([]byte{byte(c)}) + devKey[11:]
		err := apikey.CheckFormat(token)
		outside := err != nil && strings.Contains(err.Error(), "characters outside")
		if want := strings.IndexByte(base62, byte(c)) < 0; outside != want {
			t.Errorf("byte %#x: CheckFormat = %v, want refused as a character: %v", c, err, want)
		}
	}
}

// Every single mistyped character is caught by the checksum.
func TestCheckFormatCatchesEveryTypo(t *testing.T) {
	t.Parallel()
	for i := len("pst_"); i < len(devKey); i++ {
		for _, c := range []byte(base62) {
			if c == devKey[i] {
				continue
			}
			typo := devKey[:i] + string(c) + devKey[i+1:]
			if err := apikey.CheckFormat(typo); !errors.Is(err, apikey.ErrMalformed) {
				t.Fatalf("CheckFormat(%q) = %v, want ErrMalformed", typo, err)
			}
		}
	}
}

func TestHashAndID(t *testing.T) {
	t.Parallel()
	// SHA-256 test vector (FIPS 180-2).
	if got := apikey.Hash("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("Hash(abc) = %s", got)
	}
	h := apikey.Hash(devKey)
	if got := apikey.IDFromHash(h); got != "key_efa9af1043711561" {
		t.Fatalf("IDFromHash = %s", got)
	}
	if got := apikey.IDFromHash("abc"); got != "key_abc" {
		t.Fatalf("IDFromHash(short) = %s", got)
	}
}

func TestParseAuthorization(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		token  string
		err    error
	}{
		{"Bearer " + devKey, devKey, nil},
		{"bearer " + devKey, devKey, nil},
		{"BEARER   " + devKey + " ", devKey, nil},
		{"", "", apikey.ErrMissing},
		{"   ", "", apikey.ErrMissing},
		{"Bearer", "", apikey.ErrMalformed},
		{"Bearer   ", "", apikey.ErrMalformed},
		{"Basic dXNlcjpwYXNz", "", apikey.ErrMalformed},
		{devKey, "", apikey.ErrMalformed},
	}
	for _, tt := range tests {
		token, err := apikey.ParseAuthorization(tt.header)
		if token != tt.token || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("ParseAuthorization(%q) = %q, %v; want %q, %v", tt.header, token, err, tt.token, tt.err)
		}
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{apikey.ErrMissing, "missing"},
		{fmt.Errorf("%w: checksum", apikey.ErrMalformed), "malformed"},
		{fmt.Errorf("%w key_1", apikey.ErrUnknown), "unknown"},
		{apikey.ErrRevoked, "revoked"},
		{fmt.Errorf("%w: %w", apikey.ErrUnavailable, errors.New("timeout")), "unavailable"},
		{errors.New("plan gone"), "error"},
	}
	for _, tt := range tests {
		if got := apikey.Reason(tt.err); got != tt.want {
			t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
