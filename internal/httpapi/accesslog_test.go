package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// slogAccessLine is the access line as slog's JSON handler writes it.
func slogAccessLine(t testing.TB, at time.Time, l *accessLine) []byte {
	t.Helper()
	var buf bytes.Buffer
	r := slog.NewRecord(at, slog.LevelInfo, accessMessage, 0)
	r.AddAttrs(l.attrs()...)
	if err := slog.NewJSONHandler(&buf, nil).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// assertSlogAccessLine fails unless appendAccessLine writes what slog
// writes, and returns what appendAccessLine wrote.
func assertSlogAccessLine(t testing.TB, at time.Time, l *accessLine) []byte {
	t.Helper()
	want := slogAccessLine(t, at, l)
	got := appendAccessLine([]byte("prefix "), at, l)
	if !bytes.HasPrefix(got, []byte("prefix ")) {
		t.Fatalf("appendAccessLine lost what it appended to: %q", got)
	}
	got = got[len("prefix "):]
	if !bytes.Equal(got, want) {
		t.Errorf("appendAccessLine(%v, %+v)\n got %s\nwant %s", at, l, got, want)
	}
	return got
}

// TestAccessLineMatchesSlog: the access line written by hand is byte for
// byte the line slog's JSON handler writes, for every kind of field value.
func TestAccessLineMatchesSlog(t *testing.T) {
	t.Parallel()
	full := accessLine{
		requestID: "0123456789abcdef0123456789abcdef", method: "GET", route: "/v1/pets", path: "/v1/pets",
		status: 200, duration: 1234567 * time.Nanosecond, bytes: 1187, clientIP: netip.MustParseAddr("192.0.2.1"),
		keyID: "key_0123456789abcdef", plan: "free", decision: "allowed", shadow: true,
	}
	lines := []accessLine{
		full,
		{},
		{requestID: "req-1", method: "BREW", route: "unmatched", path: "/coffee", status: 404, clientIP: netip.MustParseAddr("2001:db8::1")},
		{status: 499, duration: time.Microsecond, clientIP: netip.MustParseAddr("fe80::1%eth0")},
		{status: 429, keyID: "key_free", plan: "free", decision: "limited", clientIP: netip.MustParseAddr("::ffff:10.0.0.1")},
		{status: 200, keyID: "key_free", plan: "", decision: "banned", shadow: true},
		{status: 200, decision: "allowed", shadow: false},
		{status: 200, shadow: true}, // not asked: no shadow field either
		{status: -1, bytes: math.MaxInt, duration: math.MaxInt64},
	}
	for _, d := range []time.Duration{0, 999, 1000, 999999, time.Millisecond, 1500 * time.Millisecond, 3 * time.Hour, 1<<53 + 1} {
		lines = append(lines, accessLine{duration: d})
	}
	for i, s := range jsonStringCases {
		l := full
		switch i % 6 {
		case 0:
			l.requestID = s
		case 1:
			l.method = s
		case 2:
			l.route = s
		case 3:
			l.path = s
		case 4:
			l.keyID, l.plan = "key_"+s, s
		case 5:
			l.decision = s
		}
		lines = append(lines, l)
	}
	times := []time.Time{
		time.Now(),
		time.Date(2026, 11, 24, 14, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 24, 14, 0, 0, 123456789, time.UTC),
		time.Date(2026, 11, 24, 14, 0, 0, 100, time.FixedZone("", -(5*3600+30*60))),
		time.Date(2026, 1, 2, 3, 4, 5, 600000000, time.FixedZone("CET", 3600)),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
	}
	for _, at := range times {
		if !rfc3339Year(at) {
			t.Fatalf("rfc3339Year(%v) = false", at)
		}
		for _, l := range lines {
			assertSlogAccessLine(t, at, &l)
		}
	}
	for _, at := range []time.Time{time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if rfc3339Year(at) {
			t.Errorf("rfc3339Year(%v) = true", at)
		}
	}
}

// FuzzAccessLine holds the hand-written access line to slog's for any
// field values, and checks that encoding/json reads every field back.
//
//	go test -run '^$' -fuzz FuzzAccessLine -fuzztime 30s ./internal/httpapi/
func FuzzAccessLine(f *testing.F) {
	for i, s := range jsonStringCases {
		f.Add(s, "GET", "/v1/pets", "/v1/"+s, "key_free", "free", "allowed", 200, i*100, int64(i)*123456789, []byte{192, 0, 2, byte(i)}, "", i%2 == 0, int64(i)*1e15, i*30)
	}
	f.Add("", "", "", "", "", "", "", 0, 0, int64(0), []byte(nil), "", false, int64(0), 0)
	f.Add("x", "PROPFIND", "unmatched", "/", "", "", "", 405, 17, int64(-1), bytes.Repeat([]byte{0xfe}, 16), "eth\"0\x01", true, int64(-1), -720)
	f.Fuzz(func(t *testing.T, requestID, method, route, path, keyID, plan, decision string,
		status, size int, duration int64, ip []byte, zone string, shadow bool, unixNano int64, offset int,
	) {
		l := accessLine{
			requestID: requestID, method: method, route: route, path: path, status: status,
			duration: time.Duration(duration), bytes: size, keyID: keyID, plan: plan, decision: decision, shadow: shadow,
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			l.clientIP = a
			if a.Is6() {
				l.clientIP = a.WithZone(zone)
			}
		}
		// RFC 3339 writes zone offsets in whole minutes.
		at := time.Unix(0, unixNano).In(time.FixedZone("", offset%(24*60)*60))
		line := assertSlogAccessLine(t, at, &l)

		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var got map[string]any
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s does not decode: %v", line, err)
		}
		want := map[string]any{
			"level": "INFO", "msg": accessMessage,
			"request_id": decodedJSONString(requestID), "method": decodedJSONString(method),
			"route": decodedJSONString(route), "path": decodedJSONString(path),
			"status": json.Number(strconv.Itoa(status)), "bytes": json.Number(strconv.Itoa(size)),
			"client_ip": decodedJSONString(l.clientIP.String()),
		}
		if keyID != "" {
			want["key_id"], want["plan"] = decodedJSONString(keyID), decodedJSONString(plan)
		}
		if decision != "" {
			want["ratelimit"] = decodedJSONString(decision)
			if shadow {
				want["ratelimit_shadow"] = true
			}
		}
		stamp, _ := got["time"].(string)
		if when, err := time.Parse(time.RFC3339Nano, stamp); err != nil || !when.Equal(at) {
			t.Errorf("time %q, want %v (%v)", stamp, at, err)
		}
		ms, _ := got["duration_ms"].(json.Number)
		if v, err := ms.Float64(); err != nil || v != l.durationMS() {
			t.Errorf("duration_ms %q, want %v", ms, l.durationMS())
		}
		delete(got, "time")
		delete(got, "duration_ms")
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s decodes to\n%v, want\n%v", line, got, want)
		}
	})
}

// TestJSONLogHandler: every record but the access line is slog's own, and
// the access line follows the handler's level and options.
func TestJSONLogHandler(t *testing.T) {
	t.Parallel()
	line := &accessLine{requestID: "req-1", method: "GET", route: "/v1/pets", path: "/v1/pets", status: 200, clientIP: netip.MustParseAddr("192.0.2.1")}
	tests := []struct {
		name  string
		opts  *slog.HandlerOptions
		level slog.Level // the level set after the handler is made
		want  []string   // in the access line; nil: no line
	}{
		{name: "defaults", want: []string{`"msg":"request","request_id":"req-1"`}},
		{name: "info", opts: &slog.HandlerOptions{Level: slog.LevelInfo}, want: []string{`"request_id":"req-1"`}},
		{name: "debug", opts: &slog.HandlerOptions{Level: slog.LevelDebug}, want: []string{`"request_id":"req-1"`}},
		{name: "warn", opts: &slog.HandlerOptions{Level: slog.LevelWarn}},
		{name: "raised later", opts: &slog.HandlerOptions{Level: &slog.LevelVar{}}, level: slog.LevelError},
		{name: "source", opts: &slog.HandlerOptions{AddSource: true}, want: []string{`"source":{`, `"request_id":"req-1"`}},
		{name: "replace", opts: &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == "request_id" {
				a.Key = "rid"
			}
			return a
		}}, want: []string{`"rid":"req-1"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			h := NewJSONLogHandler(&out, tt.opts)
			if tt.opts != nil {
				if v, ok := tt.opts.Level.(*slog.LevelVar); ok {
					v.Set(tt.level)
				}
			}
			s := &server{log: slog.New(h)}
			if h.direct {
				s.accessLog = h
			}
			s.logRequest(context.Background(), time.Now(), line)
			got := out.String()
			if tt.want == nil {
				if got != "" {
					t.Errorf("wrote %q, want nothing", got)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %s", got, w)
				}
			}

			// Anything else is written as slog's JSON handler writes it.
			out.Reset()
			var ref bytes.Buffer
			for _, l := range []*slog.Logger{slog.New(h), slog.New(slog.NewJSONHandler(&ref, tt.opts))} {
				l.LogAttrs(context.Background(), slog.LevelWarn, "dependency unavailable", slog.String("request_id", "req-1"))
				l.With("component", "x").WithGroup("g").Error("boom", "n", 1)
			}
			if stripTimes(out.String()) != stripTimes(ref.String()) {
				t.Errorf("records\n%s\nwant\n%s", out.String(), ref.String())
			}
		})
	}
}

// stripTimes removes the time of each JSON log line.
func stripTimes(lines string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(lines, "\n") {
		if _, rest, ok := strings.Cut(line, `","level"`); ok {
			line = rest
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// TestJSONLogHandlerWholeLines: access lines and slog's records, written
// from many goroutines, reach the writer whole and one at a time (the race
// detector watches the writer, which is not safe for concurrent use).
func TestJSONLogHandlerWholeLines(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	h := NewJSONLogHandler(&out, nil)
	s := &server{log: slog.New(h), accessLog: h}
	line := &accessLine{requestID: strings.Repeat("r", 100), method: "GET", route: "/v1/pets", path: "/v1/pets", status: 200}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				s.logRequest(context.Background(), time.Now(), line)
				s.log.Info("other", "padding", strings.Repeat("p", 100))
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*200*2 {
		t.Fatalf("%d lines, want %d", len(lines), 8*200*2)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
	}
}

// TestAppendJSONFloat: floats are written as encoding/json writes them,
// including the exponent notation durations never reach.
func TestAppendJSONFloat(t *testing.T) {
	t.Parallel()
	for _, f := range []float64{0, math.Copysign(0, -1), 0.001, 1.5, 1234.567, 1e-6, 9.99e-7, 1e-7, -1e-7, 1e20, 1e21, 1.5e300, 5e-324, math.MaxFloat64, 1 << 53, 0.1 + 0.2} {
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONFloat(nil, f); !bytes.Equal(got, want) {
			t.Errorf("appendJSONFloat(%v) = %s, want %s", f, got, want)
		}
	}
}
