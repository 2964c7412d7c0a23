package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
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
	_, haveCPU := testenv.ProcessCPU()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 2 * block {
		for k, h := range []http.Handler{stack, bare} {
			start := time.Now()
			cpuStart, _ := testenv.ProcessCPU()
			for j := 0; j < block && i+j < b.N; j++ {
				serve(h)
				n[k]++
			}
			cpuEnd, _ := testenv.ProcessCPU()
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

// BenchmarkLimitFields measures what a limited request costs the HTTP
// layer beyond the limiter itself: the stack with a limiter that answers
// at once with a fixed decision (two windows), against the same stack
// with none, on the same page of 20 pets. The difference is the rate-limit
// middleware and its response fields; "on" sends all five (the
// specification's three and, with DraftLimitFields, the draft's two);
// with the request id, the two
// common fields, Link and Content-Type they make ten, past the eight a
// small Go map holds, so the handler's header map grows into a table and
// net/http's copy of it at WriteHeader is one too; the copy is then
// written sorted by name, as the server writes it (wireWriter; the page's
// Content-Length net/http sends itself, outside the map, writeJSON). A
// third side, "spec", sends the specification's three alone (petstore's
// default): eight in the map, under the line; draft-ns/req is what the
// draft's two cost. The sides
// alternate in blocks of 2,000 requests in one run; time, allocations and
// bytes per request are reported for each, and the differences.
//
//	go test -run '^$' -bench LimitFields -benchtime 200000x -count 5 ./internal/httpapi/
//
// One side alone, its instructions counted (callgrind needs Go's
// preemption signals off):
//
//	go test -c -o httpapi.test ./internal/httpapi/
//	BENCH_FIELDS_SIDE=on GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind \
//	  ./httpapi.test -test.run '^$' -test.bench LimitFields -test.benchtime 40000x
func BenchmarkLimitFields(b *testing.B) {
	store := memstore.New()
	for i := range 1000 {
		if _, _, err := store.Create(context.Background(), pet.NewPet{Name: fmt.Sprintf("pet %d", i), CategoryID: 1, Status: pet.Statuses[i%3]}, nil); err != nil {
			b.Fatal(err)
		}
	}
	server := func(l Limiter, omitDraft bool) http.Handler {
		return NewServer(Config{
			Store:            store,
			Auth:             testAuth{},
			Limiter:          l,
			Logger:           slog.New(NewJSONLogHandler(discard{}, nil)),
			Metrics:          NewMetrics(prometheus.NewRegistry()),
			DraftLimitFields: !omitDraft,
		})
	}
	fixed := fixedLimiter{allowed(time.Now().Add(time.Hour), 59, 999)}
	// off, on (five fields), spec (the specification's three alone).
	names := [...]string{"off", "on", "spec"}
	sides := [...]http.Handler{server(nil, false), server(fixed, false), server(fixed, true)}
	req := httptest.NewRequest(http.MethodGet, "/v1/pets?limit=20", nil)
	req.Header.Set("Authorization", "Bearer "+keyFree)
	var fields [len(sides)]int
	for k, h := range sides {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d", rec.Code)
		}
		fields[k] = len(rec.Result().Header)
	}
	if fields[1] != fields[0]+5 || fields[2] != fields[0]+3 {
		b.Fatalf("response fields: %d without a limiter, %d with one, %d without the draft's; want five and three more", fields[0], fields[1], fields[2])
	}
	// BENCH_FIELDS_SIDE (off, on or spec) runs that side alone, for
	// callgrind or a profile of one side.
	only := os.Getenv("BENCH_FIELDS_SIDE")
	if only != "" && !slices.Contains(names[:], only) {
		b.Fatalf("BENCH_FIELDS_SIDE=%s: want one of %v", only, names)
	}
	var st [len(sides)]sideStats
	interleave(b, st[:], func(k int) bool { return only == "" || names[k] == only }, func(k int) {
		sides[k].ServeHTTP(&wireWriter{h: make(http.Header)}, req)
	})
	for k, name := range names {
		st[k].report(b, name+"-")
	}
	if only != "" {
		return
	}
	b.ReportMetric(st[1].ns()-st[0].ns(), "fields-ns/req")
	b.ReportMetric(st[1].allocsPer()-st[0].allocsPer(), "fields-allocs/req")
	b.ReportMetric(st[1].bytesPer()-st[0].bytesPer(), "fields-B/req")
	b.ReportMetric(st[1].ns()-st[2].ns(), "draft-ns/req")
}

// sideStats is what interleave measured of one side: its requests, and
// the time, allocations and bytes they took.
type sideStats struct {
	n, allocs, bytes uint64
	spent            time.Duration
}

func (s sideStats) ns() float64        { return float64(s.spent) / float64(s.n) }
func (s sideStats) allocsPer() float64 { return float64(s.allocs) / float64(s.n) }
func (s sideStats) bytesPer() float64  { return float64(s.bytes) / float64(s.n) }

// report reports a side's time, allocations and bytes a request, each
// named with prefix, if it ran.
func (s sideStats) report(b *testing.B, prefix string) {
	if s.n == 0 {
		return
	}
	b.ReportMetric(s.ns(), prefix+"ns/req")
	b.ReportMetric(s.allocsPer(), prefix+"allocs/req")
	b.ReportMetric(s.bytesPer(), prefix+"B/req")
}

// interleave makes b.N requests, serve(k) making one of side k, in turns
// of 2,000 for each side that runs says it runs, so that load from
// elsewhere on the machine weighs on all alike, and adds up each side's
// figures in st[k].
func interleave(b *testing.B, st []sideStats, runs func(k int) bool, serve func(k int)) {
	const block = 2000
	var m0, m1 runtime.MemStats
	b.ResetTimer()
	for i := 0; i < b.N; {
		for k := range st {
			if !runs(k) {
				continue
			}
			runtime.ReadMemStats(&m0)
			start := time.Now()
			j := 0
			for ; j < block && i < b.N; j++ {
				serve(k)
				i++
			}
			st[k].spent += time.Since(start)
			runtime.ReadMemStats(&m1)
			st[k].n += uint64(j)
			st[k].allocs += m1.Mallocs - m0.Mallocs
			st[k].bytes += m1.TotalAlloc - m0.TotalAlloc
		}
	}
	b.StopTimer()
}

// wireWriter answers as net/http's server does, but for the socket: at
// WriteHeader it copies the handler's header map and writes the copy as
// the response's header block, its fields sorted by name, to nowhere; the
// body is dropped. So a response field costs here what it costs a
// server: the map, the copy, the sort and the line.
type wireWriter struct {
	h    http.Header
	code int
}

func (w *wireWriter) Header() http.Header { return w.h }

func (w *wireWriter) WriteHeader(code int) {
	if w.code != 0 {
		return
	}
	w.code = code
	if err := w.h.Clone().Write(io.Discard); err != nil {
		panic(err)
	}
}

func (w *wireWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// fixedLimiter answers every request with one decision, at once.
type fixedLimiter struct{ d ratelimit.Decision }

func (f fixedLimiter) Allow(context.Context, string, ratelimit.Policy) (ratelimit.Decision, error) {
	return f.d, nil
}

// BenchmarkResponseFieldCount measures what net/http's handling of a
// response's header map costs by the number of fields in it: a list
// page's five (request id, the two hardening fields, Content-Type, the
// next page's Link), then the specification's three rate-limit fields,
// the draft's two and Content-Length (a body past netHTTPBuffered), one
// by one. Each count is set in a fresh map as a handler sets it, copied
// and written sorted as the server does (wireWriter), in interleaved
// blocks. Go keeps a map of up to 8 entries in one small group; the 9th
// makes both the handler's map and the server's copy hash tables.
//
//	go test -run '^$' -bench ResponseFieldCount -benchtime 300000x -count 3 ./internal/httpapi/
func BenchmarkResponseFieldCount(b *testing.B) {
	names := [...]string{"X-Request-Id", "X-Content-Type-Options", "Cache-Control", "Content-Type", "Link",
		"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy", "Content-Length"}
	const first = 5
	var st [len(names) + 1]sideStats
	value := []string{"0123456789"}
	interleave(b, st[:], func(k int) bool { return k >= first }, func(k int) {
		w := &wireWriter{h: make(http.Header)}
		h := w.Header()
		for _, name := range names[:k] {
			h[name] = value
		}
		w.WriteHeader(http.StatusOK)
	})
	for k := first; k <= len(names); k++ {
		st[k].report(b, fmt.Sprintf("%d-fields-", k))
	}
}
