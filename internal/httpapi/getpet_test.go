package httpapi

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/pet"
)

func TestDeprecationConstants(t *testing.T) {
	t.Parallel()
	if got := "@" + itoa(time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC).Unix()); got != deprecationValue {
		t.Errorf("Deprecation %q, want %q", deprecationValue, got)
	}
	if got := time.Date(2030, time.December, 5, 0, 0, 0, 0, time.UTC).Format(http.TimeFormat); got != sunsetValue {
		t.Errorf("Sunset %q, want %q", sunsetValue, got)
	}
}

func TestGetPet(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	p := ts.create("Rex", 1, pet.StatusPending)
	tests := []struct {
		name   string
		target string
		key    string
		status int
		code   string
		field  string
	}{
		{"found", "/v1/pets/" + itoa(p.ID), keyFree, http.StatusOK, "", ""},
		{"unknown id", "/v1/pets/999", keyFree, http.StatusNotFound, codeNotFound, ""},
		{"largest id", "/v1/pets/9223372036854775807", keyFree, http.StatusNotFound, codeNotFound, ""},
		{"zero", "/v1/pets/0", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"negative", "/v1/pets/-1", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"plus sign", "/v1/pets/+1", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"word", "/v1/pets/rex", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"fraction", "/v1/pets/1.5", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"2^63", "/v1/pets/9223372036854775808", keyFree, http.StatusBadRequest, codeInvalidRequest, "petId"},
		{"query parameter", "/v1/pets/1?verbose=1", keyFree, http.StatusBadRequest, codeInvalidRequest, "verbose"},
		{"no key", "/v1/pets/1", "", http.StatusUnauthorized, codeUnauthorized, ""},
	}
	for _, tt := range tests {
		resp := ts.get(tt.target, tt.key)
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d; body %s", tt.name, resp.StatusCode, tt.status, resp.body)
			continue
		}
		// Every response of the deprecated operation says so.
		h := resp.Header
		if h.Get("Deprecation") != "@1767225600" || h.Get("Sunset") != "Thu, 05 Dec 2030 00:00:00 GMT" ||
			!strings.Contains(h.Get("Link"), `</v1/pets>; rel="successor-version"`) {
			t.Errorf("%s: deprecation headers %q %q %q", tt.name, h.Get("Deprecation"), h.Get("Sunset"), h.Get("Link"))
		}
		if tt.status == http.StatusOK {
			if got := resp.pet(t); got != p {
				t.Errorf("%s: %+v, want %+v", tt.name, got, p)
			}
			continue
		}
		e := resp.errorBody(t)
		if e.Code != tt.code || !strings.HasPrefix(e.Message, tt.field) {
			t.Errorf("%s: %s %q, want %s naming %q", tt.name, e.Code, e.Message, tt.code, tt.field)
		}
	}
	// Other resources are not deprecated.
	if h := ts.get("/v1/pets", keyFree).Header; h.Get("Deprecation") != "" || h.Get("Sunset") != "" {
		t.Errorf("listPets carries deprecation headers")
	}
}
