package chartest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// The service rejects a bearer token that is not shaped like a key before
// any lookup: "pst_", 32 base62 characters, and the CRC32 (IEEE) of those
// in 6 zero-padded base62 digits. A test key in the chart's values must
// pass that check or the rate-limit helm test only ever sees 401s. This
// mirrors internal/apikey.CheckFormat, which this module cannot import.

const keyBase62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func checkKeyFormat(key string) error {
	const prefix, secretLen, sumLen = "pst_", 32, 6
	if len(key) != len(prefix)+secretLen+sumLen || !strings.HasPrefix(key, prefix) {
		return errors.New("not pst_ followed by 38 base62 characters")
	}
	body := key[len(prefix):]
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(keyBase62, body[i]) < 0 {
			return errors.New("characters outside base62")
		}
	}
	n := crc32.ChecksumIEEE([]byte(body[:secretLen]))
	sum := make([]byte, sumLen)
	for i := sumLen - 1; i >= 0; i-- {
		sum[i] = keyBase62[n%62]
		n /= 62
	}
	if string(sum) != body[secretLen:] {
		return errors.New("checksum does not match")
	}
	return nil
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestCheckKeyFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key string
		ok  bool
	}{
		{"pst_ci0helm0test0key0rate0limit000012RjBW3", true},
		{"pst_acme0static0key0for0ci0values0011POUDs", true},
		{"pst_ci0helm0test0key0rate0limit000012RjBW4", false}, // checksum
		{"pst_ci0helm0test0key0rate0limit000012RjBW", false},  // length
		{"pat_ci0helm0test0key0rate0limit000012RjBW3", false}, // prefix
		{"pst_ci0helm0test0key0rate0limit0000-2RjBW3", false}, // alphabet
	}
	for _, tt := range tests {
		if err := checkKeyFormat(tt.key); (err == nil) != tt.ok {
			t.Errorf("checkKeyFormat(%s) = %v, want ok=%v", tt.key, err, tt.ok)
		}
	}
}
