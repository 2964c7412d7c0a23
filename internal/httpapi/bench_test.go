package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
)

// BenchmarkListPets measures GET /v1/pets (a page of 20 of 1,000 pets)
// through the full router: request id, client IP, access log (JSON, as
// petstore serve writes it, to a discarding writer), metrics, authentication, limit headers (from a
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
		Logger:  slog.New(NewJSONLogHandler(discard{}, nil)),
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

// BenchmarkStackVsBareChi compares the whole router without a limiter
// (request id, client IP, recover, access log in JSON as petstore serve
// writes it, to a discarding writer, metrics, authentication, handler,
// encoding) with a bare chi router whose one handler lists the same page
// from the same store and encodes it with encoding/json; both answer with
// the same body. The two alternate in blocks of 2,000 requests in one
// run, so that machine load weighs on both alike, and the ratio of their
// times per request is reported (the target is at most 1.3): elapsed
// time, and where the system tells it the process's CPU time, which is
// what the target is about and what other work on a shared machine
// disturbs less.
//
//	go test -run '^$' -bench StackVsBareChi -benchtime 200000x -count 5 ./internal/httpapi/
func BenchmarkStackVsBareChi(b *testing.B) {
	store := memstore.New()
	for i := range 1000 {
		if _, _, err := store.Create(context.Background(), pet.NewPet{Name: fmt.Sprintf("pet %d", i), CategoryID: 1, Status: pet.Statuses[i%3]}, nil); err != nil {
			b.Fatal(err)
		}
	}
	stack := NewServer(Config{
		Store:   store,
		Auth:    testAuth{},
		Logger:  slog.New(NewJSONLogHandler(discard{}, nil)),
		Metrics: NewMetrics(prometheus.NewRegistry()),
	})
	bare := chi.NewRouter()
	bare.Get("/v1/pets", func(w http.ResponseWriter, r *http.Request) {
		pets, err := store.List(r.Context(), pet.ListQuery{Limit: 20})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(pets)
	})
	req := httptest.NewRequest(http.MethodGet, "/v1/pets", nil)
	req.Header.Set("Authorization", "Bearer "+keyFree)
	serve := func(h http.Handler) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d", rec.Code)
		}
		return rec
	}
	if s, c := serve(stack).Body.String(), serve(bare).Body.String(); s != c {
		b.Fatalf("the stack answers\n%s\nthe bare router\n%s", s, c)
	}
	const block = 2000
	var spent, cpu [2]time.Duration
	var n [2]int
	_, haveCPU := processCPU()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 2 * block {
		for k, h := range []http.Handler{stack, bare} {
			start := time.Now()
			cpuStart, _ := processCPU()
			for j := 0; j < block && i+j < b.N; j++ {
				serve(h)
				n[k]++
			}
			cpuEnd, _ := processCPU()
			spent[k] += time.Since(start)
			cpu[k] += cpuEnd - cpuStart
		}
	}
	b.StopTimer()
	s, c := float64(spent[0])/float64(n[0]), float64(spent[1])/float64(n[1])
	b.ReportMetric(s, "stack-ns/req")
	b.ReportMetric(c, "bare-chi-ns/req")
	b.ReportMetric(s/c, "ratio")
	if haveCPU {
		s, c := float64(cpu[0])/float64(n[0]), float64(cpu[1])/float64(n[1])
		b.ReportMetric(s, "stack-cpu-ns/req")
		b.ReportMetric(c, "bare-chi-cpu-ns/req")
		b.ReportMetric(s/c, "cpu-ratio")
	}
}
