package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/pet"
)

func TestCreateAndGetPet(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)

	resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree,
		body: `{"name": "  Rex ", "categoryId": 3}`})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, body %s", resp.StatusCode, resp.body)
	}
	created := resp.pet(t)
	want := pet.Pet{ID: created.ID, Name: "Rex", CategoryID: 3, Status: pet.StatusAvailable}
	if created != want || created.ID < 1 {
		t.Fatalf("created %+v, want %+v", created, want)
	}
	if got, want := resp.Header.Get("Location"), fmt.Sprintf("/v1/pets/%d", created.ID); got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	if got := resp.Header.Get("Idempotent-Replayed"); got != "" {
		t.Errorf("Idempotent-Replayed = %q on a first create", got)
	}

	got := ts.get(resp.Header.Get("Location"), keyFree)
	if got.StatusCode != http.StatusOK {
		t.Fatalf("get: status %d, body %s", got.StatusCode, got.body)
	}
	if p := got.pet(t); p != created {
		t.Errorf("get = %+v, want %+v", p, created)
	}
}

func TestCreatePetStatusAndUnicode(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	tests := []struct {
		body string
		want pet.Pet
	}{
		{`{"name":"Mia","categoryId":1,"status":"sold"}`, pet.Pet{Name: "Mia", CategoryID: 1, Status: pet.StatusSold}},
		{`{"status":"pending","categoryId":9223372036854775807,"name":"Max"}`, pet.Pet{Name: "Max", CategoryID: 9223372036854775807, Status: pet.StatusPending}},
		{`{"name":"Ñandú 🐦","categoryId":2,"status":null}`, pet.Pet{Name: "Ñandú 🐦", CategoryID: 2, Status: pet.StatusAvailable}},
		{`{"name":"\u00e9l\u00e8ve","categoryId":2}`, pet.Pet{Name: "élève", CategoryID: 2, Status: pet.StatusAvailable}},
		{`{"name":"` + strings.Repeat("é", pet.MaxNameLength) + `","categoryId":2}`, pet.Pet{Name: strings.Repeat("é", pet.MaxNameLength), CategoryID: 2, Status: pet.StatusAvailable}},
	}
	for _, tt := range tests {
		resp := ts.do(request{method: http.MethodPost, target: "/v1/pets", key: keyFree, body: tt.body})
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("%s: status %d, body %s", tt.body, resp.StatusCode, resp.body)
			continue
		}
		got := resp.pet(t)
		tt.want.ID = got.ID
		if got != tt.want {
			t.Errorf("%s: created %+v, want %+v", tt.body, got, tt.want)
		}
	}
}
