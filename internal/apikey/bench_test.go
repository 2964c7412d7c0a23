package apikey_test

import (
	"context"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/ratelimit"
)

// BenchmarkAuthenticate measures the per-request cost of authentication when
// no database round trip is needed: a static key, and a database key
// answered from the cache.
func BenchmarkAuthenticate(b *testing.B) {
	dbKey, err := apikey.Generate()
	if err != nil {
		b.Fatal(err)
	}
	candidateKey, err := apikey.Generate()
	if err != nil {
		b.Fatal(err)
	}
	withCandidate := record(candidateKey, "pro")
	withCandidate.Candidate = []ratelimit.Window{{Limit: 200, Period: time.Minute}}
	db := newFakeDB(record(dbKey, "pro"), withCandidate)
	a, err := apikey.NewAuthenticator(apikey.Options{Keys: staticKeysB(b), Lookup: db})
	if err != nil {
		b.Fatal(err)
	}
	for _, bm := range []struct{ name, key string }{
		{"static", devKey}, {"cached", dbKey}, {"cached_with_candidate", candidateKey}, {"malformed", devKey[:41] + "x"},
	} {
		b.Run(bm.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, _ = a.Authenticate(ctx, bm.key, nil)
				}
			})
		})
	}
	if n := db.lookups(); n != 2 {
		b.Fatalf("%d database lookups, want 2", n)
	}
}

func BenchmarkCheckFormat(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := apikey.CheckFormat(devKey); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGenerate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := apikey.Generate(); err != nil {
			b.Fatal(err)
		}
	}
}
