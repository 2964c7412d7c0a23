package accesslog

import (
	"bytes"
	"errors"
	"math/big"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/animal-store/petstore/ratelimit"
)

// Kind says what a line of the log is to a replay.
type Kind uint8

// Kinds of lines.
const (
	// Replayable is an access line of a request the limiter decided.
	Replayable Kind = iota
	// NotAsked is an access line of a request the limiter was not asked
	// about (no valid key, limiting off, GET /v1/rate_limit).
	NotAsked
	// Other is any other log message: a JSON object whose msg is not
	// "request".
	Other
	// Malformed is a line that is not one JSON object, or an access line
	// with a decision whose time, duration_ms, key_id, plan, ratelimit or
	// ratelimit_shadow is missing, of the wrong JSON type or out of range.
	Malformed
	// Blank is an empty line, or one of white space only.
	Blank
)

func (k Kind) String() string {
	switch k {
	case Replayable:
		return "replayable"
	case NotAsked:
		return "not asked"
	case Other:
		return "other"
	case Malformed:
		return "malformed"
	case Blank:
		return "blank"
	}
	return "unknown"
}

// The fields a replay reads, as the HTTP layer writes them (httpapi's
// observe middleware; TestAccessLog there).
const (
	fieldMsg       = "msg"
	fieldTime      = "time"
	fieldDuration  = "duration_ms"
	fieldKeyID     = "key_id"
	fieldPlan      = "plan"
	fieldRateLimit = "ratelimit"
	fieldShadow    = "ratelimit_shadow"
	accessMsg      = "request"
)

// Entry is what a replay needs of one access line.
type Entry struct {
	// At is when the request reached the limiter, in µs since the Unix
	// epoch: the line's time (written when the request ended) less its
	// duration_ms.
	At    int64
	KeyID string
	Plan  string
	// Outcome is what the limiter decided: the ratelimit field.
	Outcome ratelimit.Outcome
	// Shadow is true when the plan was in shadow mode: the decision was
	// recorded, not enforced.
	Shadow bool
}

// ParseLine reads one line of the log (without its newline). The Entry
// is set only for a Replayable line.
func ParseLine(line []byte) (Entry, Kind) {
	var p parser
	k := p.parse(line)
	if k != Replayable {
		return Entry{}, k
	}
	return Entry{At: p.at, KeyID: string(p.keyID.val), Plan: string(p.plan.val), Outcome: p.outcome, Shadow: p.shadow}, k
}

// A field's value as last seen on the line: duplicate members are read as
// encoding/json reads them into a map, the last one wins.
type strField struct {
	set     bool   // the member is present
	isStr   bool   // its value is a JSON string
	val     []byte // the decoded string: into the line, or into scratch
	scratch []byte // decoded strings with escapes or invalid UTF-8
}

// usable reports whether the member is present and a non-empty string.
func (f *strField) usable() bool { return f.set && f.isStr && len(f.val) > 0 }

// parser reads the few fields a replay needs from a line, checking the
// whole line is one valid JSON object as encoding/json would (syntax,
// escapes, nesting depth) and decoding the strings it reads exactly as
// encoding/json does (escapes, surrogate pairs, invalid UTF-8 coerced to
// U+FFFD). It is reused from line to line, so it allocates only while its
// scratch buffers grow.
type parser struct {
	key                                  strField
	msg, time, keyID, plan, rl, duration strField // duration holds the number's text
	durIsNum                             bool
	shadowSet, shadowIsBool, shadowVal   bool

	// Results of a Replayable line.
	at      int64
	outcome ratelimit.Outcome
	shadow  bool
}

// maxDepth is encoding/json's limit on nesting.
const maxDepth = 10000

func (p *parser) parse(line []byte) Kind {
	p.msg.set, p.time.set, p.keyID.set, p.plan.set, p.rl.set, p.duration.set, p.shadowSet = false, false, false, false, false, false, false
	b := line
	i := skipSpace(b, 0)
	switch {
	case i == len(b):
		return Blank
	case b[i] != '{':
		return Malformed
	}
	i, ok := p.topObject(b, i)
	if !ok || skipSpace(b, i) != len(b) {
		return Malformed
	}
	return p.classify()
}

// classify decides what the valid JSON object just read is.
func (p *parser) classify() Kind {
	if !p.msg.set || !p.msg.isStr || string(p.msg.val) != accessMsg {
		return Other
	}
	if !p.rl.set {
		return NotAsked
	}
	if !p.rl.isStr || !p.time.usable() || !p.keyID.usable() || !p.plan.usable() || !p.duration.set || !p.durIsNum {
		return Malformed
	}
	switch string(p.rl.val) {
	case "allowed":
		p.outcome = ratelimit.Allowed
	case "limited":
		p.outcome = ratelimit.Limited
	case "banned":
		p.outcome = ratelimit.Banned
	default:
		return Malformed
	}
	if p.shadowSet && !p.shadowIsBool {
		return Malformed
	}
	p.shadow = p.shadowSet && p.shadowVal
	end, ok := parseTime(p.time.val)
	if !ok {
		return Malformed
	}
	d, ok := parseMillisAsMicros(p.duration.val)
	if !ok {
		return Malformed
	}
	p.at = end - d
	if p.at < 0 {
		// The request began before the Unix epoch: no limiter decided it
		// (the shared store's clock never reads such a time).
		return Malformed
	}
	return Replayable
}

// The scanning functions take the line and a position in it and return
// the position after what they read, and whether it was valid JSON.

// ws returns the position of the next byte that is not white space.
func ws(b []byte, i int) int {
	if i < len(b) && b[i] > ' ' {
		return i // compact JSON, as slog writes it
	}
	return skipSpace(b, i)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// topObject reads the line's object at b[i], keeping the members a replay
// needs.
func (p *parser) topObject(b []byte, i int) (int, bool) {
	i = ws(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		var ok bool
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		if i, ok = readStr(b, i, &p.key); !ok {
			return i, false
		}
		if i = ws(b, i); i >= len(b) || b[i] != ':' {
			return i, false
		}
		if i = ws(b, i+1); i >= len(b) {
			return i, false
		}
		if i, ok = p.member(b, i); !ok {
			return i, false
		}
		if i = ws(b, i); i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = ws(b, i+1)
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// member reads the value at b[i] of the member whose key was just read.
func (p *parser) member(b []byte, i int) (int, bool) {
	var f *strField
	switch string(p.key.val) {
	case fieldMsg:
		f = &p.msg
	case fieldTime:
		f = &p.time
	case fieldKeyID:
		f = &p.keyID
	case fieldPlan:
		f = &p.plan
	case fieldRateLimit:
		f = &p.rl
	case fieldDuration:
		p.duration.set = true
		p.durIsNum = b[i] == '-' || '0' <= b[i] && b[i] <= '9'
		end, ok := value(b, i, 1)
		p.duration.val = b[i:end]
		return end, ok
	case fieldShadow:
		p.shadowSet = true
		p.shadowIsBool = b[i] == 't' || b[i] == 'f'
		p.shadowVal = b[i] == 't'
		return value(b, i, 1)
	default:
		return value(b, i, 1)
	}
	f.set = true
	if f.isStr = b[i] == '"'; f.isStr {
		return readStr(b, i, f)
	}
	return value(b, i, 1)
}

// value skips the JSON value at b[i], inside depth levels of nesting.
func value(b []byte, i, depth int) (int, bool) {
	switch c := b[i]; {
	case c == '"':
		return skipStr(b, i)
	case c == '{':
		return object(b, i, depth+1)
	case c == '[':
		return array(b, i, depth+1)
	case c == '-' || '0' <= c && c <= '9':
		return number(b, i)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	}
	return i, false
}

func literal(b []byte, i int, lit string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return i, false
	}
	return i + len(lit), true
}

func object(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	if i = ws(b, i+1); i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		var ok bool
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		if i, ok = skipStr(b, i); !ok {
			return i, false
		}
		if i = ws(b, i); i >= len(b) || b[i] != ':' {
			return i, false
		}
		if i = ws(b, i+1); i >= len(b) {
			return i, false
		}
		if i, ok = value(b, i, depth); !ok {
			return i, false
		}
		if i = ws(b, i); i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = ws(b, i+1)
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}

func array(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	if i = ws(b, i+1); i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i >= len(b) {
			return i, false
		}
		if i, ok = value(b, i, depth); !ok {
			return i, false
		}
		if i = ws(b, i); i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = ws(b, i+1)
		case ']':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// number checks a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, false
		}
	}
	return i, true
}

// plain marks the bytes that stand for themselves in a JSON string and
// need no further look: printable ASCII other than '"' and '\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipStr skips the string at b[i] (its opening quote), checking its
// escapes and that it holds no control character. Bytes past ASCII are
// not checked: encoding/json reads invalid UTF-8 as U+FFFD.
func skipStr(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		c := b[i]
		switch {
		case plain[c] || c >= utf8.RuneSelf:
			i++
		case c == '"':
			return i + 1, true
		case c == '\\':
			n := escLen(b[i:])
			if n == 0 {
				return i, false
			}
			i += n
		default: // a control character
			return i, false
		}
	}
	return i, false
}

// escLen returns the length of the valid escape sequence at the start of
// b (which starts with '\'), or 0.
func escLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b) < 6 {
			return 0
		}
		for _, c := range b[2:6] {
			if hexVal(c) < 0 {
				return 0
			}
		}
		return 6
	}
	return 0
}

func hexVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// readStr reads the string at b[i] into f.val, decoded.
func readStr(b []byte, i int, f *strField) (int, bool) {
	start := i + 1
	j := start
	for j < len(b) && plain[b[j]] {
		j++
	}
	if j < len(b) && b[j] == '"' {
		f.val = b[start:j]
		return j + 1, true
	}
	// Escapes, bytes past ASCII or an error: find the end, then decode.
	end, ok := skipStr(b, i)
	if !ok {
		return end, false
	}
	f.scratch = unquote(f.scratch[:0], b[start:end-1])
	f.val = f.scratch
	return end, true
}

// unquote appends to dst the contents of a JSON string (without its
// quotes) already checked by skipStr, decoded exactly as encoding/json
// does: a surrogate pair is one rune, a lone surrogate and each byte of
// invalid UTF-8 become U+FFFD.
func unquote(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			switch s[r+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := u4(s[r:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if rr1 := u4(s[r:]); rr1 >= 0 {
						if dec := utf16.DecodeRune(rr, rr1); dec != unicode.ReplacementChar {
							dst = utf8.AppendRune(dst, dec)
							r += 6
							continue
						}
					}
					rr = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // " \ /
				dst = append(dst, s[r+1])
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			dst = utf8.AppendRune(dst, rr)
			r += size
		}
	}
	return dst
}

// u4 reads the \uXXXX at the start of s, or returns -1.
func u4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		v := hexVal(c)
		if v < 0 {
			return -1
		}
		r = r<<4 | v
	}
	return r
}

// parseMillisAsMicros reads a JSON number of milliseconds (checked by
// number) as whole µs, rounded to the nearest (halves up), exactly: a
// plain decimal of up to 15 significant digits (what the log writes) in
// integers, anything else through math/big. Negative durations and ones
// over 1000 years are refused.
func parseMillisAsMicros(b []byte) (int64, bool) {
	num := b
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	var mant int64
	digits, frac, dot := 0, 0, false
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			if digits == 15 {
				return exactMillis(num)
			}
			mant = mant*10 + int64(c-'0')
			if mant > 0 {
				digits++
			}
			if dot {
				frac++
			}
		case c == '.':
			dot = true
		default: // an exponent
			return exactMillis(num)
		}
	}
	if neg && mant != 0 {
		return 0, false
	}
	// mant × 10^-frac ms is mant × 10^(3-frac) µs.
	for ; frac < 3; frac++ {
		mant *= 10
	}
	if frac > 3 {
		if frac-3 > 18 {
			return 0, true // under 10^15 × 10^-19 µs
		}
		pow := int64(1)
		for range frac - 3 {
			pow *= 10
		}
		q, r := mant/pow, mant%pow
		if 2*r >= pow {
			q++
		}
		mant = q
	}
	if mant > maxMicros {
		return 0, false
	}
	return mant, true
}

// maxMicros bounds a duration: 1000 years.
const maxMicros = 1000 * 366 * 24 * 3600 * 1_000_000

// exactMillis is parseMillisAsMicros for numbers with an exponent or many
// digits.
func exactMillis(num []byte) (int64, bool) {
	f, err := strconv.ParseFloat(string(num), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), f < 0 && f != 0, f > maxMicros/1000:
		return 0, false
	case f < 1e-4 && f > -1e-4:
		// Under a tenth of a µs (or an underflow): 0, without asking
		// math/big to expand a huge negative exponent.
		return 0, true
	}
	r, ok := new(big.Rat).SetString(string(num))
	if !ok {
		return 0, false
	}
	r.Mul(r, big.NewRat(1000, 1))
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Lsh(m, 1).Cmp(r.Denom()) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > maxMicros {
		return 0, false
	}
	return q.Int64(), true
}
