package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// BenchmarkListPetsEndToEnd serves GET /v1/pets over real TCP with the
// rate limiter off and on (real Redis), in one run, so the ratio of the two
// req/s figures is the cost of shared limiting end to end. Run it once per
// process, several times, so that off and on rounds interleave (the README
// has the loop); -count would run every "off" round before every "on" one.
func BenchmarkListPetsEndToEnd(b *testing.B) {
	addr := testenv.RedisAddr(b)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 32})
	defer rdb.Close()

	plans, err := plan.Parse([]byte("plans:\n  bench:\n    quotas: [{limit: 100000, period: 1m}, {limit: 10000000, period: 24h}]\n    ban: off\n"))
	if err != nil {
		b.Fatal(err)
	}
	const nkeys = 16
	var yaml strings.Builder
	yaml.WriteString("keys:\n")
	keys := make([]string, nkeys)
	for i := range keys {
		if keys[i], err = apikey.Generate(); err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&yaml, "  - {key: %s, plan: bench}\n", keys[i])
	}
	static, err := apikey.ParseKeys([]byte(yaml.String()), plans)
	if err != nil {
		b.Fatal(err)
	}
	auth, err := apikey.NewAuthenticator(apikey.Options{Plans: plans, Keys: static})
	if err != nil {
		b.Fatal(err)
	}
	store := memstore.New()
	for i := 0; i < 100; i++ {
		if _, _, err := store.Create(context.Background(), pet.NewPet{Name: fmt.Sprintf("pet %d", i), CategoryID: 1, Status: pet.StatusAvailable}, nil); err != nil {
			b.Fatal(err)
		}
	}
	limiter, err := ratelimit.New(rdb, ratelimit.Options{Prefix: randomName("petstore:bench:") + ":"})
	if err != nil {
		b.Fatal(err)
	}
	defer limiter.Close()

	for _, tc := range []struct {
		name    string
		limiter httpapi.Limiter
	}{
		{"limiting=off", nil},
		{"limiting=on", limiter},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := httptest.NewServer(httpapi.NewServer(httpapi.Config{Store: store, Auth: auth, Limiter: tc.limiter}))
			defer srv.Close()
			tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			url := srv.URL + "/v1/pets?limit=20"
			var next, failed atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := "Bearer " + keys[next.Add(1)%nkeys]
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					req.Header.Set("Authorization", key)
					resp, err := client.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
					}
				}
			})
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d requests failed", n, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
