package accesslog

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// reference reads a line with encoding/json, as the rules of Kind say:
// the scanner must agree with it on every line.
func reference(line []byte) (Entry, Kind) {
	if len(bytes.Trim(line, " \t\r\n")) == 0 {
		return Entry{}, Blank
	}
	if !json.Valid(line) {
		return Entry{}, Malformed
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Entry{}, Malformed
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Entry{}, Malformed
	}
	if msg, _ := m["msg"].(string); msg != "request" {
		return Entry{}, Other
	}
	rl, asked := m["ratelimit"]
	if !asked {
		return Entry{}, NotAsked
	}
	var e Entry
	switch rl {
	case "allowed":
		e.Outcome = ratelimit.Allowed
	case "limited":
		e.Outcome = ratelimit.Limited
	case "banned":
		e.Outcome = ratelimit.Banned
	default:
		return Entry{}, Malformed
	}
	key, _ := m["key_id"].(string)
	plan, _ := m["plan"].(string)
	ts, _ := m["time"].(string)
	num, isNum := m["duration_ms"].(json.Number)
	shadow, isBool := m["ratelimit_shadow"].(bool)
	if _, present := m["ratelimit_shadow"]; present && !isBool || key == "" || plan == "" || !isNum {
		return Entry{}, Malformed
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return Entry{}, Malformed
	}
	d, ok := referenceMicros(string(num))
	if !ok {
		return Entry{}, Malformed
	}
	e.At, e.KeyID, e.Plan, e.Shadow = t.UnixMicro()-d, key, plan, shadow
	if e.At < 0 {
		return Entry{}, Malformed // began before the Unix epoch
	}
	return e, Replayable
}

// referenceMicros is a JSON number of ms in µs, rounded half up, exactly.
func referenceMicros(s string) (int64, bool) {
	// Screen the magnitude first, so that big.Rat never expands a huge
	// exponent.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || f < 0 || f > maxMicros/1000 {
		return 0, false
	}
	if f < 1e-4 {
		return 0, true
	}
	r, _ := new(big.Rat).SetString(s)
	r.Mul(r, big.NewRat(1000, 1))
	r.Add(r, big.NewRat(1, 2))
	q := new(big.Int).Div(r.Num(), r.Denom()) // floor, r > 0
	if q.Int64() > maxMicros {
		return 0, false
	}
	return q.Int64(), true
}

// trickyLines are lines the scanner must read exactly as encoding/json.
var trickyLines = []string{
	`{"time":"2026-11-24T14:38:22.123456789Z","level":"INFO","msg":"request","request_id":"r1","method":"GET","route":"/v1/pets","path":"/v1/pets","status":200,"duration_ms":0.412,"bytes":2,"client_ip":"192.0.2.1","key_id":"key_0123456789abcdef","plan":"free","ratelimit":"allowed"}`,
	`{"time":"2026-11-24T14:38:22Z","msg":"request","duration_ms":12,"key_id":"key_a","plan":"pro","ratelimit":"limited","ratelimit_shadow":true}`,
	`{"time":"2026-11-24T14:38:22+01:30","msg":"request","duration_ms":1.5e3,"key_id":"key_a","plan":"pro","ratelimit":"banned","ratelimit_shadow":false}`,
	// Escapes in the fields read, and in their names.
	`{"ti\u006de":"2026-11-24T14:38:22.5Z","msg":"re\u0071uest","duration_ms":0,"key_id":"key_\"q\\\/\b\f\n\r\t","plan":"fr\u00e9e\ud83d\ude00","ratelimit":"allowed"}`,
	`{"time":"2026-11-24T14:38:22.5Z","msg":"request","duration_ms":0,"key_id":"lone \ud800 high \udc00 low \ud800\u0041","plan":"p","ratelimit":"allowed"}`,
	"{\"time\":\"2026-11-24T14:38:22.5Z\",\"msg\":\"request\",\"duration_ms\":0,\"key_id\":\"bad utf8 \xff\xfe \xe2\x82\",\"plan\":\"\xc3\xa9\",\"ratelimit\":\"allowed\"}",
	// Other members of every kind, with look-alike contents.
	`{"path":"/v1/pets\",\"ratelimit\":\"banned","msg":"request","n":[1,-0.5e+3,{"ratelimit":"x"},[],{}],"z":null,"t":true,"f":false,"time":"2026-11-24T14:38:22Z","duration_ms":3,"key_id":"k","plan":"p","ratelimit":"limited"}`,
	// Duplicate members: the last one counts.
	`{"msg":"request","ratelimit":"allowed","ratelimit":"banned","time":"2026-11-24T14:38:22Z","duration_ms":3,"key_id":"k","plan":"p","plan":"q"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":3,"duration_ms":"3","key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":7,"ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":3,"key_id":"k","plan":"p"}`,
	// White space everywhere it may be, and a CRLF ending.
	" \t{ \"msg\" : \"request\" , \"ratelimit\" :\"allowed\",\"time\":\"2026-11-24T14:38:22Z\" ,\"duration_ms\": 3 ,\"key_id\":\"k\",\"plan\":\"p\" } \r",
	// Not access lines, and access lines without a decision.
	`{"time":"2026-11-24T14:38:22Z","level":"WARN","msg":"ratelimit: cannot load the decision script yet","err":"dial tcp"}`,
	`{"msg":"Request","ratelimit":"allowed"}`,
	`{"msg":["request"],"ratelimit":"allowed"}`,
	`{"time":"2026-11-24T14:38:22Z","msg":"request","status":401,"duration_ms":0.1,"client_ip":"192.0.2.1"}`,
	`{"msg":"request","key_id":"k","plan":"p"}`,
	`{}`,
	``,
	" \t\r",
	// At the Unix epoch: a request may begin there, not before.
	`{"time":"1970-01-01T00:00:00.012Z","msg":"request","duration_ms":12,"key_id":"k","plan":"p","ratelimit":"allowed"}`,
	`{"time":"1970-01-01T01:00:00+01:00","msg":"request","duration_ms":0,"key_id":"k","plan":"p","ratelimit":"allowed"}`,
	// Malformed.
	`{"time":"1970-01-01T00:00:00.012Z","msg":"request","duration_ms":12.001,"key_id":"k","plan":"p","ratelimit":"allowed"}`,
	`{"time":"1969-12-31T23:59:59.999999Z","msg":"request","duration_ms":0,"key_id":"k","plan":"p","ratelimit":"allowed"}`,
	`{"time":"0001-01-01T00:00:00Z","msg":"request","duration_ms":0,"key_id":"k","plan":"p","ratelimit":"allowed"}`,
	`not json`,
	`time=2026-11-24T14:38:22Z level=INFO msg=request ratelimit=allowed`,
	`[{"msg":"request"}]`,
	`"request"`,
	`{"msg":"request","ratelimit":"allowed"} {}`,
	`{"msg":"request","ratelimit":"allowed",}`,
	`{"msg":"request","ratelimit":"allowed"`,
	`{"msg":"request","ratelimit":"allowed","x":"\'"}`,
	`{"msg":"request","ratelimit":"allowed","x":"\u12"}`,
	"{\"msg\":\"request\",\"ratelimit\":\"allowed\",\"x\":\"tab\there\"}",
	`{"msg":"request","ratelimit":"allowed","x":01}`,
	`{"msg":"request","ratelimit":"allowed","x":1.}`,
	`{"msg":"request","ratelimit":"allowed","x":-}`,
	`{"msg":"request","ratelimit":"allowed","x":1e}`,
	`{"msg":"request","ratelimit":"allowed","x":tru}`,
	`{"msg":"request","ratelimit":"allowed","x":[1,]}`,
	`{"msg":"request","ratelimit":"allowed","x":{"a"}}`,
	`{"msg":"request","ratelimit":"allowed","x":{1:2}}`,
	`{'msg':'request'}`,
	// Access lines with a decision and something wrong.
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":3,"plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":3,"key_id":"","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":3,"key_id":"k"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":"3","key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":-1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":-0.0,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1e400,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1e-400,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":0.0004999,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":0.0005,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1234567890.1234567890123,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":0.000000000000000000000000000001,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":99999999999999999999,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1,"key_id":"k","plan":"p","ratelimit_shadow":"true"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1,"key_id":"k","plan":"p","ratelimit_shadow":null}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22Z","duration_ms":1,"key_id":7,"plan":"p"}`,
	`{"msg":"request","ratelimit":"maybe","time":"2026-11-24T14:38:22Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":null,"time":"2026-11-24T14:38:22Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24 14:38:22Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-02-30T14:38:22Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"2026-11-24T14:38:22.1234567891Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":"1969-12-31T23:59:59.9999995Z","duration_ms":1,"key_id":"k","plan":"p"}`,
	`{"msg":"request","ratelimit":"allowed","time":1764000000,"duration_ms":1,"key_id":"k","plan":"p"}`,
}

func TestParseLineMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	kinds := map[Kind]int{}
	for _, line := range trickyLines {
		got, gotKind := ParseLine([]byte(line))
		want, wantKind := reference([]byte(line))
		if gotKind != wantKind || got != want {
			t.Errorf("%s\nscanner:       %v %+v\nencoding/json: %v %+v", line, gotKind, got, wantKind, want)
		}
		kinds[gotKind]++
	}
	for k := Replayable; k <= Blank; k++ {
		if kinds[k] == 0 {
			t.Errorf("no line of kind %v", k)
		}
	}
}

// TestParseLineOfTheService reads lines written as the service writes
// them (slog's JSON handler, the access log's attributes) with values that
// need escaping.
func TestParseLineOfTheService(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.LogAttrs(t.Context(), slog.LevelInfo, "request",
		slog.String("request_id", "r-1"), slog.String("method", "GET"), slog.String("route", "/v1/pets/{petId}"),
		slog.String("path", "/v1/pets/\"x\"\n\u2028\xff"), slog.Int("status", 429),
		slog.Float64("duration_ms", float64(int64(1_234_567))/1000), slog.Int("bytes", 57), slog.String("client_ip", "2001:db8::1"),
		slog.String("key_id", "key_0123456789abcdef"), slog.String("plan", "free"),
		slog.String("ratelimit", "limited"), slog.Bool("ratelimit_shadow", true))
	line := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	var rec struct{ Time time.Time }
	if err := json.Unmarshal(line, &rec); err != nil {
		t.Fatal(err)
	}
	e, k := ParseLine(line)
	want := Entry{At: rec.Time.UnixMicro() - 1_234_567, KeyID: "key_0123456789abcdef", Plan: "free", Outcome: ratelimit.Limited, Shadow: true}
	if k != Replayable || e != want {
		t.Fatalf("%s\nread %v %+v, want %+v", line, k, e, want)
	}
}

func TestParseLineDepth(t *testing.T) {
	t.Parallel()
	nested := func(depth int) []byte {
		// The line's object is depth 1.
		return []byte(`{"msg":"x","a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`)
	}
	for _, depth := range []int{maxDepth, maxDepth + 1} {
		line := nested(depth)
		_, got := ParseLine(line)
		_, want := reference(line)
		if got != want {
			t.Errorf("depth %d: %v, encoding/json %v", depth, got, want)
		}
	}
}

func FuzzParseLine(f *testing.F) {
	for _, l := range trickyLines {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.IndexByte(line, '\n') >= 0 {
			// A line never holds one, except as white space at its end.
			return
		}
		got, gotKind := ParseLine(line)
		want, wantKind := reference(line)
		if gotKind != wantKind || got != want {
			t.Fatalf("%q\nscanner:       %v %+v\nencoding/json: %v %+v", line, gotKind, got, wantKind, want)
		}
	})
}

var trickyTimes = []string{
	"2026-11-24T14:38:22Z", "2026-11-24T14:38:22.1Z", "2026-11-24T14:38:22.123456789Z", "2026-11-24T14:38:22.1234567891Z",
	"2026-11-24T14:38:22.999999999+23:59", "2026-11-24T14:38:22-07:00", "2024-02-29T00:00:00Z", "2023-02-29T00:00:00Z",
	"0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "1969-12-31T23:59:59.9999995Z", "1900-03-01T00:00:00Z",
	"2026-11-24T24:00:00Z", "2026-11-24T14:60:00Z", "2026-11-24T14:38:60Z", "2026-11-24T14:38:22", "2026-11-24T14:38:22z",
	"2026-11-24t14:38:22Z", "2026-11-24T14:38:22.Z", "2026-11-24T14:38:22,5Z", "2026-11-24T14:38:22+24:00", "2026-11-24T14:38:22+0100",
	"2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "+026-11-24T14:38:22Z", "2026-11-24T14:38:22.5+01:00 ",
}

func FuzzParseTime(f *testing.F) {
	for _, s := range trickyTimes {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseTime([]byte(s))
		want, err := time.Parse(time.RFC3339Nano, s)
		if ok != (err == nil) || ok && got != want.UnixMicro() {
			t.Fatalf("%q: read %d %v; time.Parse %v (%d) %v", s, got, ok, want, want.UnixMicro(), err)
		}
	})
}

func TestFastTimeReadsTheCommonShape(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"2026-11-24T14:38:22Z", "2026-11-24T14:38:22.123456789Z", "2026-11-24T14:38:22.5-07:00"} {
		if _, ok := fastTime([]byte(s)); !ok {
			t.Errorf("%s goes the slow way", s)
		}
	}
}
