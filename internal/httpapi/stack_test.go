//go:build !race

// The race detector enlarges every frame and the stack guard, so these
// checks run without it (make unit runs them so).

package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"testing"
	"time"
	"unsafe"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// connFrames is about the stack net/http's own frames hold above the
// router on a connection's goroutine ((*conn).serve and
// serverHandler.ServeHTTP, from the compiler's frame sizes, Go 1.26).
const connFrames = 1280

// TestLeasedRequestFitsTheConnectionStack checks that a request its lease
// serves runs, through the real router and limiter, within the 8 KB stack
// an idle keep-alive connection's goroutine settles at. Each collection
// shrinks such a stack back while the connection waits to read; a request
// that needs more copies its stack again, walking every frame, about 0.8
// µs a request on a busy replica (cmd/petstore/BENCHMARKS.md). Each
// measured request runs on a fresh goroutine whose stack has been grown to
// 8 KB and holds net/http's frames' worth; it fails if the stack had to
// move. Collections are off meanwhile, so that none shrinks the stack
// under the test.
func TestLeasedRequestFitsTheConnectionStack(t *testing.T) {
	h, reg := stackTestServer(t, 0, busyPlan)
	leased := func() float64 {
		return testenv.CounterSum(t, reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "busy"})
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	measured := 0
	for i := 0; i < 2000 && measured < 50; i++ {
		before := leased()
		moved := stackTestRequest(t, h, i)
		if leased() == before+1 {
			measured++
			if moved {
				t.Fatalf("a request its lease served outgrew the %d-byte stack a keep-alive connection settles at", 8<<10)
			}
		}
	}
	if measured < 50 {
		t.Fatalf("only %d of 2000 requests were served by a lease", measured)
	}
}

// TestRoundTripRequestFitsTheConnectionStack checks the same for a request
// that waits for its own round trip to Redis (leases off: every request
// makes one), as a cold key's requests do, and a busy key's when its lease
// runs out. Such a request is deepest while it waits (the pipeline's
// select, the runtime's timer), and its frames (roundTrip, decide) fill
// the caller's decision rather than returning one to copy.
func TestRoundTripRequestFitsTheConnectionStack(t *testing.T) {
	h, reg := stackTestServer(t, 1, busyPlan)
	decided := func() float64 {
		return testenv.CounterSum(t, reg, "petstore_ratelimit_decisions_total", map[string]string{"plan": "busy", "outcome": "allowed"})
	}
	// The plan's first request compiles it, once per plan and process:
	// not a request a busy replica serves, and not measured.
	stackTestRequest(t, h, -1)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for i := range 50 {
		before := decided()
		if stackTestRequest(t, h, i) {
			t.Fatalf("request %d: a request that made a round trip outgrew the %d-byte stack a keep-alive connection settles at", i, 8<<10)
		}
		if decided() != before+1 {
			t.Fatalf("request %d: the limiter counted %v admissions, want 1", i, decided()-before)
		}
	}
	if leased := testenv.CounterSum(t, reg, "petstore_ratelimit_leased_total", map[string]string{"plan": "busy"}); leased != 0 {
		t.Fatalf("%v requests were served by a lease; every one must make a round trip", leased)
	}
}

// TestBlockTripRequestFitsTheConnectionStack checks the same for the
// requests of a key too slow to lease, with blocks in force (the
// limiter finalized), whose path to Redis is a frame deeper than the
// others' (blockTrip): a one-second window beside the day, whose 5 ms
// buckets leave no time for a lease, so that every request makes a round
// trip asking for a block, until one is granted and spent in process.
func TestBlockTripRequestFitsTheConnectionStack(t *testing.T) {
	p := ratelimit.Policy{Name: "cold", Windows: []ratelimit.Window{{Limit: 100_000, Period: time.Second}, {Limit: 10_000_000, Period: 24 * time.Hour}}}
	h, reg, lim := stackTestLimiter(t, 0, p)
	if _, _, err := lim.Finalize(context.Background()); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); testenv.CounterSum(t, reg, "petstore_ratelimit_blocks_in_force", nil) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("blocks not in force 10 s after Finalize")
		}
	}
	count := func(name string) float64 {
		return testenv.CounterSum(t, reg, name, map[string]string{"plan": "cold"})
	}
	stackTestRequest(t, h, -1) // compiles the plan (not measured)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	trips, spent := 0, 0
	for i := 0; i < 2000 && (trips < 50 || spent == 0); i++ {
		before := count("petstore_ratelimit_leased_total")
		moved := stackTestRequest(t, h, i)
		fromBlock := count("petstore_ratelimit_leased_total") == before+1
		if fromBlock {
			spent++
		} else {
			trips++
		}
		if moved {
			t.Fatalf("request %d (from a block: %v): a request of a key that may take a block outgrew the %d-byte stack a keep-alive connection settles at", i, fromBlock, 8<<10)
		}
	}
	if trips < 50 || spent == 0 {
		t.Fatalf("%d requests made a round trip asking for a block and %d were spent from one: want 50 and some", trips, spent)
	}
}

// busyPlan is a plan of a minute and a day whose limits the tests never
// come near.
var busyPlan = ratelimit.Policy{Name: "busy", Windows: []ratelimit.Window{{Limit: 100_000, Period: time.Minute}, {Limit: 10_000_000, Period: 24 * time.Hour}}}

// stackTestServer returns the real router with a limiter on miniredis
// (maxLease as Options.MaxLease: 0 the default, 1 no leases) and the
// limiter's registry; every request's key is on plan p.
func stackTestServer(t *testing.T, maxLease int, p ratelimit.Policy) (http.Handler, *prometheus.Registry) {
	t.Helper()
	h, reg, _ := stackTestLimiter(t, maxLease, p)
	return h, reg
}

// stackTestLimiter is stackTestServer, with the limiter.
func stackTestLimiter(t *testing.T, maxLease int, p ratelimit.Policy) (http.Handler, *prometheus.Registry, *ratelimit.Limiter) {
	t.Helper()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	reg := prometheus.NewRegistry()
	lim, err := ratelimit.New(client, ratelimit.Options{Timeout: time.Second, MaxLease: maxLease, Registerer: reg, Prefix: "stack-test:" + randomHex(t) + ":"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	ts := newTestServer(t, func(c *Config) {
		c.Auth = policyAuth{policy: p}
		c.Limiter = lim
	})
	return ts.handler, reg, lim
}

// stackTestRequest serves GET /v1/pets through h on a connection's stack
// (onConnectionStack), fails unless it is answered 200, and says whether
// the stack moved.
func stackTestRequest(t *testing.T, h http.Handler, i int) (moved bool) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/v1/pets", nil)
	req.Header.Set("Authorization", "Bearer "+keyFree)
	rec := httptest.NewRecorder()
	moved = onConnectionStack(func() { h.ServeHTTP(rec, req) })
	if rec.Code != http.StatusOK {
		t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
	}
	return moved
}

// onConnectionStack runs f on a new goroutine whose stack is 8 KB, below
// connFrames bytes of frames, and says whether f made the stack move (grow).
func onConnectionStack(f func()) (moved bool) {
	done := make(chan bool)
	go func() {
		growStack(6 << 10) // 6 KB deep: the 2 KB starting stack doubles twice, to 8 KB
		var marker byte
		at := uintptr(unsafe.Pointer(&marker))
		belowConnFrames(f)
		done <- uintptr(unsafe.Pointer(&marker)) != at
	}()
	return <-done
}

//go:noinline
func growStack(n int) byte {
	var b [512]byte
	b[n%512] = byte(n)
	if n <= 512 {
		return b[0]
	}
	return growStack(n-512) + b[1]
}

//go:noinline
func belowConnFrames(f func()) byte {
	var pad [connFrames]byte
	pad[len(pad)-1] = 1
	f()
	return pad[0] + pad[len(pad)-1]
}
