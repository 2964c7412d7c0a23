package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
)

// downLookup is a key database that cannot be reached.
type downLookup struct{}

func (downLookup) KeyByHash(context.Context, string) (apikey.Record, error) {
	return apikey.Record{}, errors.New("dial tcp 10.0.0.5:5432: connection refused")
}

// goneLookup is a key database that knows no keys.
type goneLookup struct{}

func (goneLookup) KeyByHash(_ context.Context, hash string) (apikey.Record, error) {
	return apikey.Record{}, fmt.Errorf("key %s: %w", hash[:8], apikey.ErrUnknown)
}

// TestWithRealAuthenticator checks that the apikey Authenticator's answers
// map to the documented responses.
func TestWithRealAuthenticator(t *testing.T) {
	t.Parallel()
	active, revoked, stranger := generateKey(t), generateKey(t), generateKey(t)
	keys, err := apikey.ParseKeys(fmt.Appendf(nil, "keys:\n  - {key: %s, plan: pro}\n  - {key: %s, plan: free, revoked: true}\n", active, revoked), plan.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	// Changing a checksum character leaves a key that fails its checksum.
	swap := map[bool]string{true: "B", false: "A"}[active[len(active)-1] == 'A']
	malformed := active[:len(active)-1] + swap
	tests := []struct {
		name   string
		lookup apikey.KeyLookup
		key    string
		status int
	}{
		{"static key", nil, active, http.StatusOK},
		{"revoked static key", nil, revoked, http.StatusUnauthorized},
		{"bad checksum", nil, malformed, http.StatusUnauthorized},
		{"unknown without a database", nil, stranger, http.StatusUnauthorized},
		{"unknown to the database", goneLookup{}, stranger, http.StatusUnauthorized},
		{"database down", downLookup{}, stranger, http.StatusServiceUnavailable},
		{"static key with the database down", downLookup{}, active, http.StatusOK},
	}
	for _, tt := range tests {
		auth, err := apikey.NewAuthenticator(apikey.Options{Keys: keys, Lookup: tt.lookup})
		if err != nil {
			t.Fatal(err)
		}
		ts := newTestServer(t, func(c *Config) { c.Auth = auth })
		resp := ts.get("/v1/pets", tt.key)
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, resp.body)
			continue
		}
		if tt.status == http.StatusOK {
			want := apikey.IDFromHash(apikey.Hash(tt.key))
			if calls := ts.limiter.Calls(); len(calls) != 1 || calls[0] != want {
				t.Errorf("%s: limiter keys %v, want [%s]", tt.name, calls, want)
			}
		}
		if strings.Contains(ts.logs.String(), tt.key) {
			t.Errorf("%s: the key was logged", tt.name)
		}
	}
}

func generateKey(t *testing.T) string {
	t.Helper()
	k, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}
