package accesslog

import (
	"testing"
)

// BenchmarkParseLine reads a typical access line.
func BenchmarkParseLine(b *testing.B) {
	line := []byte(`{"time":"2026-11-24T14:38:22.123456789Z","level":"INFO","msg":"request","request_id":"9b7c1d1e5f0c4a2b8d3e6f7a1b2c3d4e","method":"GET","route":"/v1/pets","path":"/v1/pets","status":200,"duration_ms":0.412,"bytes":1234,"client_ip":"192.0.2.1","key_id":"key_0123456789abcdef","plan":"free","ratelimit":"allowed"}`)
	var p parser
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if p.parse(line) != Replayable {
			b.Fatal("not replayable")
		}
	}
}
