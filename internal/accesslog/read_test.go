package accesslog

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

func bytesInput(name string, b []byte) Input {
	return Input{Name: name, Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }}
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var t0 = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)

// small sizes make a test log of a few thousand lines many chunks.
var small = sizes{chunk: 16 << 10, maxLine: 64 << 10}

func accessLine(at time.Time, dur time.Duration, key, plan, outcome string) string {
	return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"request","request_id":"r","method":"GET","route":"/v1/pets","path":"/v1/pets","status":200,"duration_ms":%v,"bytes":2,"client_ip":"192.0.2.1","key_id":%q,"plan":%q,"ratelimit":%q}`,
		at.Add(dur).Format(time.RFC3339Nano), float64(dur.Microseconds())/1000, key, plan, outcome)
}

// genLog returns n lines of requests of a few keys, with other lines
// among them, in the order they were written (by end time, nearly
// ordered).
func genLog(rng *rand.Rand, n int) []string {
	var lines []string
	at := t0
	for range n {
		at = at.Add(time.Duration(rng.IntN(3000)) * time.Microsecond)
		switch rng.IntN(20) {
		case 0:
			lines = append(lines, `{"time":"2026-11-24T00:00:00Z","level":"WARN","msg":"something else","err":"x"}`)
		case 1:
			lines = append(lines, `{"msg":"request","status":401,"duration_ms":0.2}`)
		case 2:
			lines = append(lines, `{"msg":"request","ratelimit":`)
		default:
			outcome := []string{"allowed", "limited", "banned"}[rng.IntN(3)]
			lines = append(lines, accessLine(at, time.Duration(rng.IntN(5000))*time.Microsecond, fmt.Sprint("key_", rng.IntN(7)), []string{"free", "pro"}[rng.IntN(2)], outcome))
		}
	}
	return lines
}

// expected reads lines one at a time and groups them by key, sorted.
func expected(lines []string) map[string][]Entry {
	out := map[string][]Entry{}
	for _, l := range lines {
		if e, k := ParseLine([]byte(l)); k == Replayable {
			out[e.KeyID] = append(out[e.KeyID], e)
		}
	}
	for _, es := range out {
		slices.SortStableFunc(es, func(a, b Entry) int { return int(a.At - b.At) })
	}
	return out
}

// entries turns a Log back into entries by key.
func entries(l *Log) map[string][]Entry {
	out := map[string][]Entry{}
	for i, k := range l.Keys {
		for _, r := range l.KeyRequests(i) {
			out[k] = append(out[k], Entry{At: r.At, KeyID: k, Plan: l.Plans[r.Plan], Outcome: ratelimit.Outcome(r.Outcome), Shadow: r.Shadow})
		}
	}
	return out
}

func sameEntries(t *testing.T, got, want map[string][]Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		// Ties in time may come in another order.
		cmp := func(a, b Entry) int {
			if a.At != b.At {
				return int(a.At - b.At)
			}
			return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
		}
		if !slices.IsSortedFunc(g, func(a, b Entry) int { return int(a.At - b.At) }) {
			t.Fatalf("key %s: requests out of time order", k)
		}
		g, w = slices.Clone(g), slices.Clone(w)
		slices.SortFunc(g, cmp)
		slices.SortFunc(w, cmp)
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("key %s: %d requests, want %d", k, len(g), len(w))
		}
	}
}

// TestReadAcrossChunksAndInputs reads logs larger than a chunk, split
// over inputs in any order, plain and gzip, with and without a final
// newline: every replayable line is read once, by key in time order, and
// the others are counted.
func TestReadAcrossChunksAndInputs(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	lines := genLog(rng, 3000) // about 900 KB: many small chunks
	want := expected(lines)

	// Three "replicas": the lines dealt at random, one gzip-compressed,
	// one without a final newline, one with CRLF line ends.
	parts := make([][]string, 3)
	for _, l := range lines {
		i := rng.IntN(3)
		parts[i] = append(parts[i], l)
	}
	inputs := []Input{
		bytesInput("a.log", gzipped(t, []byte(strings.Join(parts[0], "\n")+"\n"))),
		bytesInput("b.log.gz", []byte(strings.Join(parts[1], "\n"))),
		bytesInput("c", []byte(strings.Join(parts[2], "\r\n")+"\r\n\n\n")),
	}
	for _, workers := range []int{1, 3} {
		l, err := read(context.Background(), inputs, workers, small)
		if err != nil {
			t.Fatal(err)
		}
		sameEntries(t, entries(l), want)
		var total Counts
		for i, p := range parts {
			var c Counts
			for _, line := range p {
				_, k := ParseLine([]byte(line))
				c.count(k)
			}
			if l.Inputs[i] != c {
				t.Errorf("input %d: counts %+v, want %+v", i, l.Inputs[i], c)
			}
			total.add(c)
		}
		if l.Total != total || total.Lines != int64(len(lines)) || total.Malformed == 0 || total.Other == 0 || total.NotAsked == 0 {
			t.Errorf("total %+v, want %+v over %d lines", l.Total, total, len(lines))
		}
	}
}

// TestReadIsDeterministic: however the workers share the lines, the same
// requests come out in the same order, simultaneous ones included.
func TestReadIsDeterministic(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 5000 {
		// Many requests of one key at the same instant, in mixed outcomes.
		lines = append(lines, accessLine(t0, 0, "key_same", []string{"free", "pro"}[i%2], []string{"allowed", "limited", "banned"}[i%3]))
	}
	log := []byte(strings.Join(lines, "\n"))
	first, err := read(context.Background(), []Input{bytesInput("x", log)}, 1, small)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		l, err := read(context.Background(), []Input{bytesInput("x", log)}, 4, small)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(l, first) {
			t.Fatal("two reads of one log differ")
		}
	}
}

func TestReadLongLines(t *testing.T) {
	t.Parallel()
	sz := sizes{chunk: 4096, maxLine: 64 << 10}
	long := strings.Replace(accessLine(t0, time.Millisecond, "key_long", "free", "allowed"), `"path":"/v1/pets"`,
		`"path":"/`+strings.Repeat("p", 3*sz.chunk)+`"`, 1)
	overlong := `{"msg":"` + strings.Repeat("x", sz.maxLine) + `"}`
	log := strings.Join([]string{accessLine(t0, 0, "key_a", "free", "allowed"), long, overlong, accessLine(t0, 0, "key_b", "free", "limited")}, "\n")
	l, err := read(context.Background(), []Input{bytesInput("x", []byte(log))}, 2, sz)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Lines: 4, Replayable: 3, Malformed: 1}); l.Total != want {
		t.Fatalf("counts %+v, want %+v", l.Total, want)
	}
	if !reflect.DeepEqual(l.Keys, []string{"key_a", "key_b", "key_long"}) {
		t.Fatalf("keys %v", l.Keys)
	}
}

func TestReadErrorsNameTheInput(t *testing.T) {
	t.Parallel()
	good := bytesInput("good.log", []byte(accessLine(t0, 0, "k", "free", "allowed")))
	gz := gzipped(t, []byte(strings.Repeat(accessLine(t0, 0, "k", "free", "allowed")+"\n", 1000)))
	missing := filepath.Join(t.TempDir(), "missing.log")
	for name, in := range map[string]Input{
		"truncated.log.gz": bytesInput("truncated.log.gz", gz[:len(gz)/2]),
		missing:            {Name: missing, Open: func() (io.ReadCloser, error) { return os.Open(missing) }},
	} {
		_, err := Read(context.Background(), []Input{good, in}, 2)
		if err == nil || !strings.Contains(err.Error(), "access log "+name+": ") {
			t.Errorf("%s: error %v, want one naming it", name, err)
		}
	}
	_, err := Read(context.Background(), []Input{bytesInput("empty", nil)}, 1)
	if err != nil {
		t.Fatalf("an empty log: %v", err)
	}
	if _, err := Read(context.Background(), []Input{{Name: "x", Open: func() (io.ReadCloser, error) { return nil, errors.New("boom") }}}, 1); err == nil {
		t.Fatal("an input that cannot be opened was read")
	}
}
