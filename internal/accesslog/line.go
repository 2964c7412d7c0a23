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
	b     []byte
	i     int
	depth int

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
	p.b, p.i, p.depth = line, 0, 0
	p.msg.set, p.time.set, p.keyID.set, p.plan.set, p.rl.set, p.duration.set, p.shadowSet = false, false, false, false, false, false, false
	switch p.peek() {
	case 0:
		if p.i == len(p.b) {
			return Blank
		}
		return Malformed
	case '{':
	default:
		return Malformed
	}
	if !p.topObject() || p.peek() != 0 || p.i != len(p.b) {
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
	return Replayable
}

// peek skips white space and returns the byte there, or 0 at the end of
// the line (a NUL byte is never valid there either).
func (p *parser) peek() byte {
	if p.i < len(p.b) && p.b[p.i] > ' ' {
		return p.b[p.i] // compact JSON, as slog writes it
	}
	return p.skipSpace()
}

func (p *parser) skipSpace() byte {
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return c
		}
	}
	return 0
}

// topObject reads the line's object, keeping the members a replay needs.
func (p *parser) topObject() bool {
	p.i++ // {
	p.depth = 1
	if p.peek() == '}' {
		p.i++
		return true
	}
	for {
		if p.peek() != '"' || !p.str(&p.key) || p.peek() != ':' {
			return false
		}
		p.i++
		if p.peek() == 0 || !p.member() {
			return false
		}
		switch p.peek() {
		case ',':
			p.i++
		case '}':
			p.i++
			return true
		default:
			return false
		}
	}
}

// member reads the value of the member whose key was just read.
func (p *parser) member() bool {
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
		start := p.i
		p.duration.set = true
		p.durIsNum = p.b[p.i] == '-' || '0' <= p.b[p.i] && p.b[p.i] <= '9'
		if !p.value() {
			return false
		}
		p.duration.val = p.b[start:p.i]
		return true
	case fieldShadow:
		p.shadowSet = true
		p.shadowIsBool = p.b[p.i] == 't' || p.b[p.i] == 'f'
		p.shadowVal = p.b[p.i] == 't'
		return p.value()
	default:
		return p.value()
	}
	f.set = true
	if p.b[p.i] == '"' {
		f.isStr = true
		return p.str(f)
	}
	f.isStr = false
	return p.value()
}

// value skips one JSON value starting at p.i, checking it.
func (p *parser) value() bool {
	switch c := p.b[p.i]; {
	case c == '"':
		return p.skipStr()
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	}
	return false
}

func (p *parser) literal(lit string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(lit)) {
		return false
	}
	p.i += len(lit)
	return true
}

func (p *parser) object() bool {
	if p.depth++; p.depth > maxDepth {
		return false
	}
	p.i++ // {
	if p.peek() == '}' {
		p.i++
		p.depth--
		return true
	}
	for {
		if p.peek() != '"' || !p.skipStr() || p.peek() != ':' {
			return false
		}
		p.i++
		if p.peek() == 0 || !p.value() {
			return false
		}
		switch p.peek() {
		case ',':
			p.i++
		case '}':
			p.i++
			p.depth--
			return true
		default:
			return false
		}
	}
}

func (p *parser) array() bool {
	if p.depth++; p.depth > maxDepth {
		return false
	}
	p.i++ // [
	if p.peek() == ']' {
		p.i++
		p.depth--
		return true
	}
	for {
		if p.peek() == 0 || !p.value() {
			return false
		}
		switch p.peek() {
		case ',':
			p.i++
		case ']':
			p.i++
			p.depth--
			return true
		default:
			return false
		}
	}
}

// number checks a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() bool {
	b, i := p.b, p.i
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
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
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
			return false
		}
	}
	p.i = i
	return true
}

// plain marks the bytes that stand for themselves in a JSON string and
// need no further look: printable ASCII other than '"' and '\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipStr skips a string starting at p.i (its opening quote), checking
// its escapes and that it holds no control character. Bytes past ASCII
// are not checked, as encoding/json does not check them (it reads invalid
// UTF-8 as U+FFFD).
func (p *parser) skipStr() bool {
	b, i := p.b, p.i+1
	for i < len(b) {
		c := b[i]
		switch {
		case plain[c] || c >= utf8.RuneSelf:
			i++
		case c == '"':
			p.i = i + 1
			return true
		case c == '\\':
			n := escLen(b[i:])
			if n == 0 {
				return false
			}
			i += n
		default: // a control character
			return false
		}
	}
	return false
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

// str reads the string starting at p.i into f.val, decoded.
func (p *parser) str(f *strField) bool {
	b, start := p.b, p.i+1
	i := start
	for i < len(b) && plain[b[i]] {
		i++
	}
	if i < len(b) && b[i] == '"' {
		f.val = b[start:i]
		p.i = i + 1
		return true
	}
	// Escapes, bytes past ASCII or an error: find the end, then decode.
	p.i = start - 1
	if !p.skipStr() {
		return false
	}
	f.scratch = unquote(f.scratch[:0], b[start:p.i-1])
	f.val = f.scratch
	return true
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
