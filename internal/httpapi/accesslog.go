package httpapi

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// accessLine is what the access log says about one request.
type accessLine struct {
	requestID string
	method    string
	route     string
	path      string
	status    int
	duration  time.Duration
	bytes     int
	clientIP  netip.Addr
	// keyID and plan are empty when no key was accepted; decision when
	// the limiter was not asked.
	keyID    string
	plan     string
	decision string
	shadow   bool
}

// durationMS is the duration in milliseconds, to the microsecond.
func (l *accessLine) durationMS() float64 { return float64(l.duration.Microseconds()) / 1000 }

// attrs are the line's fields for slog, in the order they are written:
// request_id, method, route, path, status, duration_ms, bytes, client_ip,
// then key_id and plan when a key was accepted, ratelimit when the limiter
// was asked and ratelimit_shadow when its plan is in shadow mode.
// appendAccessLine writes the same fields by hand.
func (l *accessLine) attrs() []slog.Attr {
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs,
		slog.String("request_id", l.requestID),
		slog.String("method", l.method),
		slog.String("route", l.route),
		slog.String("path", l.path),
		slog.Int("status", l.status),
		slog.Float64("duration_ms", l.durationMS()),
		slog.Int("bytes", l.bytes),
		slog.String("client_ip", l.clientIP.String()),
	)
	if l.keyID != "" {
		attrs = append(attrs, slog.String("key_id", l.keyID), slog.String("plan", l.plan))
	}
	if l.decision != "" {
		attrs = append(attrs, slog.String("ratelimit", l.decision))
		if l.shadow {
			attrs = append(attrs, slog.Bool("ratelimit_shadow", true))
		}
	}
	return attrs
}

// accessMessage is the message of every access log line.
const accessMessage = "request"

// logRequest writes the access log line at INFO, stamped now. A
// JSONLogHandler that takes records as slog's JSON handler writes them by
// default is given the line directly (appendAccessLine); any other
// handler, and a JSONLogHandler with options that rewrite records, gets it
// through slog.
func (s *server) logRequest(ctx context.Context, now time.Time, l *accessLine) {
	if h := s.accessLog; h != nil && rfc3339Year(now) {
		if h.Enabled(ctx, slog.LevelInfo) {
			h.writeAccessLine(now, l)
		}
		return
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, accessMessage, l.attrs()...)
}

// JSONLogHandler writes records exactly as slog.NewJSONHandler does, one
// Write per record, and gives the access log a cheaper way to write the
// same line: appended by hand instead of through slog's Record, its
// reflection-free but general attribute encoding and its buffer pool. It
// is the handler to use with the JSON log format; the access log works
// with any slog.Handler, only more slowly.
type JSONLogHandler struct {
	slog.Handler // slog's JSON handler, writing to out
	out          *lockedWriter
	// direct is set when the options leave records as the JSON handler
	// writes them by default (no ReplaceAttr, no source), so that a line
	// written by hand is the line slog would have written.
	direct bool
}

// NewJSONLogHandler returns a handler writing to w as
// slog.NewJSONHandler(w, opts) does. Handlers derived from it (WithAttrs,
// WithGroup) are slog's own and share its writer.
func NewJSONLogHandler(w io.Writer, opts *slog.HandlerOptions) *JSONLogHandler {
	out := &lockedWriter{w: w}
	return &JSONLogHandler{
		Handler: slog.NewJSONHandler(out, opts),
		out:     out,
		direct:  opts == nil || (opts.ReplaceAttr == nil && !opts.AddSource),
	}
}

// writeAccessLine writes l as one record at INFO, stamped t.
func (h *JSONLogHandler) writeAccessLine(t time.Time, l *accessLine) {
	buf := lineBuffers.Get().(*[]byte)
	b := appendAccessLine((*buf)[:0], t, l)
	_, _ = h.out.Write(b) // as slog.Logger, which drops a handler's error
	if cap(b) <= maxPooledLine {
		*buf = b[:0]
		lineBuffers.Put(buf)
	}
}

var lineBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledLine = 16 << 10

// lockedWriter writes whole records one at a time, so that lines written by
// slog's handler and by writeAccessLine never interleave, whatever w is.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// appendAccessLine appends the access log line, with its newline, as
// slog's JSON handler writes a record at INFO stamped t with message
// accessMessage and l.attrs(): the time in RFC 3339 with nanoseconds and
// the record's zone, strings escaped as slog escapes them (logEscapes),
// duration_ms as encoding/json writes a float64. TestAccessLineMatchesSlog
// and FuzzAccessLine hold it to slog's bytes. t's year must be within
// 0..9999 (rfc3339Year), as RFC 3339 requires.
func appendAccessLine(b []byte, t time.Time, l *accessLine) []byte {
	b = append(b, `{"time":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"`+accessMessage+`","request_id":`...)
	b = appendJSONString(b, l.requestID, logEscapes)
	b = append(b, `,"method":`...)
	b = appendJSONString(b, l.method, logEscapes)
	b = append(b, `,"route":`...)
	b = appendJSONString(b, l.route, logEscapes)
	b = append(b, `,"path":`...)
	b = appendJSONString(b, l.path, logEscapes)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(l.status), 10)
	b = append(b, `,"duration_ms":`...)
	b = appendJSONFloat(b, l.durationMS())
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, int64(l.bytes), 10)
	b = append(b, `,"client_ip":`...)
	if l.clientIP.IsValid() {
		var ip [64]byte
		b = appendJSONString(b, l.clientIP.AppendTo(ip[:0]), logEscapes)
	} else {
		b = appendJSONString(b, l.clientIP.String(), logEscapes) // "invalid IP"
	}
	if l.keyID != "" {
		b = append(b, `,"key_id":`...)
		b = appendJSONString(b, l.keyID, logEscapes)
		b = append(b, `,"plan":`...)
		b = appendJSONString(b, l.plan, logEscapes)
	}
	if l.decision != "" {
		b = append(b, `,"ratelimit":`...)
		b = appendJSONString(b, l.decision, logEscapes)
		if l.shadow {
			b = append(b, `,"ratelimit_shadow":true`...)
		}
	}
	return append(b, "}\n"...)
}

// rfc3339Year reports whether t can be written in RFC 3339, whose years
// have four digits; slog writes an error in place of other times.
func rfc3339Year(t time.Time) bool {
	y := t.Year()
	return 0 <= y && y <= 9999
}

// appendJSONFloat appends a finite f as encoding/json writes a float64
// (which is how slog writes one): like %g, but in decimal notation from
// 1e-6 up to 1e21, and exponents without leading zeros.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-07 becomes e-7
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
