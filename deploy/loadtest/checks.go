package main

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Check names, as the summary prints them.
const (
	checkStatus       = "status is what the scenario expects"
	checkHeaders      = "rate-limit fields present and consistent"
	checkRemaining    = "Remaining never rises within a window for a key that only sends"
	checkRetryAfter   = "a 429 carries a whole-seconds Retry-After"
	checkFirstRetry   = "admitted on the first retry after waiting Retry-After"
	checkNeverBanned  = "a client honouring Retry-After is never banned"
	checkBanned       = "an abusive key that ignores 429s is banned"
	checkBanRemaining = "key_banned's Retry-After is the rest of the ban"
)

// checks counts passes and failures per check, keeping a few failure
// messages for the summary.
type checks struct {
	mu     sync.Mutex
	pass   map[string]int
	fail   map[string]int
	sample map[string][]string
}

func newChecks() *checks {
	return &checks{pass: map[string]int{}, fail: map[string]int{}, sample: map[string][]string{}}
}

// record notes one outcome of check; msg says what was wrong when !ok.
func (c *checks) record(check string, ok bool, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		c.pass[check]++
		return
	}
	c.fail[check]++
	if len(c.sample[check]) < 3 {
		c.sample[check] = append(c.sample[check], msg)
	}
}

func (c *checks) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for n := range c.pass {
		seen[n] = true
	}
	for n := range c.fail {
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// rateLimit is what a response's rate-limit fields say.
type rateLimit struct {
	limit, remaining int64
	reset            time.Time // X-RateLimit-Reset
	window           time.Duration
	retryAfter       time.Duration // 429 only
}

var (
	// RateLimit: "1m";r=12;t=30
	rateLimitRE = regexp.MustCompile(`^"([^"]+)";r=(\d+);t=(\d+)$`)
	// RateLimit-Policy: "1m";q=60;w=60, "24h";q=1000;w=86400
	policyRE = regexp.MustCompile(`^"([^"]+)";q=(\d+);w=(\d+)$`)
)

// parseRateLimit reads and cross-checks the rate-limit fields of a
// response received at now: the X-RateLimit-* fields, the IETF RateLimit
// and RateLimit-Policy fields (both, or neither from a server that does
// not send the draft's), and Retry-After on a 429. The error says what is
// missing or inconsistent.
func parseRateLimit(h http.Header, status int, now time.Time) (rateLimit, error) {
	var rl rateLimit
	num := func(name string) (int64, error) {
		v := h.Get(name)
		if v == "" {
			return 0, fmt.Errorf("no %s", name)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %q is not a non-negative integer", name, v)
		}
		return n, nil
	}
	var err error
	if rl.limit, err = num("X-RateLimit-Limit"); err != nil {
		return rl, err
	}
	if rl.remaining, err = num("X-RateLimit-Remaining"); err != nil {
		return rl, err
	}
	reset, err := num("X-RateLimit-Reset")
	if err != nil {
		return rl, err
	}
	rl.reset = time.Unix(reset, 0)
	if rl.remaining > rl.limit {
		return rl, fmt.Errorf("X-RateLimit-Remaining %d above X-RateLimit-Limit %d", rl.remaining, rl.limit)
	}
	// Reset is rounded up to whole seconds; allow for the clocks of the
	// client and the server differing by a second.
	if rl.reset.Before(now.Add(-time.Second)) {
		return rl, fmt.Errorf("X-RateLimit-Reset %d is in the past (now %d)", reset, now.Unix())
	}

	if h.Get("RateLimit") == "" && h.Get("RateLimit-Policy") == "" {
		// The specification's three alone (petstore's default, without
		// --ratelimit-draft-fields): the kit knows the key's shortest
		// window from GET /v1/rate_limit (kit.learnWindows).
		return rl, retryAfter(h, status, &rl)
	}
	m := rateLimitRE.FindStringSubmatch(h.Get("RateLimit"))
	if m == nil {
		return rl, fmt.Errorf("RateLimit %q is not \"NAME\";r=N;t=N", h.Get("RateLimit"))
	}
	if r, _ := strconv.ParseInt(m[2], 10, 64); r != rl.remaining {
		return rl, fmt.Errorf("RateLimit r=%d but X-RateLimit-Remaining %d", r, rl.remaining)
	}
	found := false
	for _, p := range strings.Split(h.Get("RateLimit-Policy"), ",") {
		pm := policyRE.FindStringSubmatch(strings.TrimSpace(p))
		if pm == nil {
			return rl, fmt.Errorf("RateLimit-Policy %q: %q is not \"NAME\";q=N;w=N", h.Get("RateLimit-Policy"), p)
		}
		w, _ := strconv.ParseInt(pm[3], 10, 64)
		if rl.window == 0 || time.Duration(w)*time.Second < rl.window {
			rl.window = time.Duration(w) * time.Second
		}
		if pm[1] == m[1] {
			found = true
			if q, _ := strconv.ParseInt(pm[2], 10, 64); q != rl.limit {
				return rl, fmt.Errorf("RateLimit-Policy q=%d for %q but X-RateLimit-Limit %d", q, m[1], rl.limit)
			}
		}
	}
	if !found {
		return rl, fmt.Errorf("RateLimit names window %q, which RateLimit-Policy %q does not list", m[1], h.Get("RateLimit-Policy"))
	}
	return rl, retryAfter(h, status, &rl)
}

// retryAfter reads a 429's Retry-After into rl: whole seconds, at least 1.
func retryAfter(h http.Header, status int, rl *rateLimit) error {
	if status != http.StatusTooManyRequests {
		return nil
	}
	ra, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	if err != nil || ra < 1 {
		return fmt.Errorf("429 with Retry-After %q", h.Get("Retry-After"))
	}
	rl.retryAfter = time.Duration(ra) * time.Second
	return nil
}

// remainingTracker checks that X-RateLimit-Remaining never rises for a key
// that only sends requests, within the shortest window of its plan from
// its first request (after which older requests slide out and Remaining
// rightly rises), by more than slack. Responses whose requests overlapped
// in time may be decided in either order, so a response is compared only
// with responses received before its request was sent. It also keeps how
// many comparisons rose at all and the largest rise, which the summary
// prints whatever the slack.
type remainingTracker struct {
	mu       sync.Mutex
	slack    int64
	keys     map[string]*keyHistory
	compared int
	rose     int
	maxRise  int64
	// worst is the comparison that rose by maxRise: the key, its answer
	// and the earlier one it rose above.
	worst struct {
		key          string
		answer, from answer
	}
}

// answer is one response as the Remaining check sees it.
type answer struct {
	send, recv time.Time
	remaining  int64
	window     time.Duration // the key's shortest
	// from is the replica that answered, when the deployment names it
	// (X-Served-By: make cluster's HAProxy does); "" otherwise.
	from string
}

type keyHistory struct {
	first   time.Time
	answers []answer // sorted by recv
	least   []int    // least[i]: the index of the least Remaining of answers[:i+1]
}

func newRemainingTracker(slack int64) *remainingTracker {
	return &remainingTracker{slack: slack, keys: map[string]*keyHistory{}}
}

// observe records one response of key and reports whether it broke the
// rule, with the answer of least Remaining received before its request was
// sent, which it may exceed by the slack alone (compared false: none to
// compare with). Responses may be observed slightly out of receive order
// (goroutines race to report); one observed after a later request was
// checked is then missing from that check, which can hide a rise but never
// invent one.
func (t *remainingTracker) observe(key string, a answer) (ok bool, bound answer, compared bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.keys[key]
	if h == nil {
		h = &keyHistory{first: a.send}
		t.keys[key] = h
	}
	if a.send.Before(h.first) {
		h.first = a.send
	}
	ok = true
	if a.recv.Sub(h.first) < a.window {
		// The responses received before this request was sent.
		i := sort.Search(len(h.answers), func(i int) bool { return !h.answers[i].recv.Before(a.send) })
		if i > 0 {
			bound, compared = h.answers[h.least[i-1]], true
			rise := a.remaining - bound.remaining
			ok = rise <= t.slack
			t.compared++
			if rise > 0 {
				t.rose++
				if rise > t.maxRise {
					t.maxRise = rise
					t.worst.key, t.worst.answer, t.worst.from = key, a, bound
				}
			}
		}
	}
	at := sort.Search(len(h.answers), func(i int) bool { return h.answers[i].recv.After(a.recv) })
	h.answers = slices.Insert(h.answers, at, a)
	h.least = append(h.least, 0)
	for i := at; i < len(h.least); i++ {
		h.least[i] = i
		if i > 0 && h.answers[h.least[i-1]].remaining < h.answers[i].remaining {
			h.least[i] = h.least[i-1]
		}
	}
	return ok, bound, compared
}

// rises returns how many answers were compared with earlier ones, how
// many of them rose, and the largest rise.
func (t *remainingTracker) rises() (compared, rose int, most int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.compared, t.rose, t.maxRise
}

// largest returns the comparison that rose the most: its key, its answer
// and the earlier answer it rose above.
func (t *remainingTracker) largest() (key string, a, from answer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.worst.key, t.worst.answer, t.worst.from
}
