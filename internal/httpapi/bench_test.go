package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
)

// BenchmarkListPets measures GET /v1/pets (a page of 20 of 1,000 pets)
// through the full router: request id, client IP, access log (to a
// discarding JSON handler), metrics, authentication, limit headers (from a
// fake limiter), handler and encoding.
//
//	go test -run '^$' -bench ListPets -benchmem ./internal/httpapi/
func BenchmarkListPets(b *testing.B) {
	store := memstore.New()
	for i := range 1000 {
		if _, _, err := store.Create(context.Background(), pet.NewPet{Name: fmt.Sprintf("pet %d", i), CategoryID: 1, Status: pet.Statuses[i%3]}, nil); err != nil {
			b.Fatal(err)
		}
	}
	h := NewServer(Config{
		Store:   store,
		Auth:    testAuth{},
		Limiter: &fakeLimiter{decision: allowed(time.Now(), 59, 999)},
		Logger:  slog.New(slog.NewJSONHandler(discard{}, nil)),
	})
	for _, target := range []string{"/v1/pets", "/v1/pets?status=sold&limit=20"} {
		b.Run(target, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, target, nil)
			req.Header.Set("Authorization", "Bearer "+keyFree)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
