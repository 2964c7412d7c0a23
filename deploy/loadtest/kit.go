package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// key is one API key from a CSV file.
type key struct{ id, secret, plan string }

// readKeys reads `petstore keys create --format csv` output.
func readKeys(path string) ([]key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 || strings.Join(rows[0], ",") != "id,key,plan,label" {
		return nil, fmt.Errorf("%s: want the header id,key,plan,label and at least one key (petstore keys create --format csv)", path)
	}
	keys := make([]key, 0, len(rows)-1)
	for i, r := range rows[1:] {
		if !strings.HasPrefix(r[1], "pst_") {
			return nil, fmt.Errorf("%s: line %d: %q is not a key", path, i+2, r[1])
		}
		keys = append(keys, key{id: r[0], secret: r[1], plan: r[2]})
	}
	return keys, nil
}

// kit runs the scenarios and collects what they saw.
type kit struct {
	cfg       config
	client    *http.Client
	checks    *checks
	remaining *remainingTracker
	log       io.Writer
	logMu     sync.Mutex
	// start is when the kit was made: failure messages give times from it.
	start time.Time
	// windows is each key's shortest window, by key id, as GET
	// /v1/rate_limit named it (learnWindows).
	windows map[string]time.Duration

	mu       sync.Mutex
	latency  map[string][]time.Duration // by scenario
	statuses map[string]map[int]int     // by scenario
	dropped  int
	errors   int
}

// newKit returns a kit for cfg, whose Remaining check allows the rise
// riseAllowed gives for keys keys.
func newKit(cfg config, keys int, log io.Writer) *kit {
	return &kit{
		cfg: cfg,
		client: &http.Client{
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        cfg.workers + 16,
				MaxIdleConnsPerHost: cfg.workers + 16,
				IdleConnTimeout:     30 * time.Second,
				DisableCompression:  true,
			},
		},
		checks:    newChecks(),
		remaining: newRemainingTracker(riseAllowed(cfg, keys)),
		log:       log,
		start:     time.Now(),
		latency:   map[string][]time.Duration{},
		statuses:  map[string]map[int]int{},
	}
}

// response is one answer as the kit saw it.
type response struct {
	send, recv time.Time
	status     int
	code       string // the error body's code
	rl         rateLimit
	rlErr      error
	err        error
}

// get sends GET /v1/pets with k, records its latency and status under
// scenario, and runs the checks every response gets.
func (k *kit) get(ctx context.Context, scenario string, key key) response {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.cfg.url+"/v1/pets?limit=1", nil)
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key.secret)
	r := response{send: time.Now()}
	resp, err := k.client.Do(req)
	if err != nil {
		r.recv, r.err = time.Now(), err
		if ctx.Err() == nil {
			k.mu.Lock()
			k.errors++
			k.mu.Unlock()
			k.checks.record(checkStatus, false, fmt.Sprintf("%s: %v", scenario, err))
		}
		return r
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	r.recv, r.status = time.Now(), resp.StatusCode
	if r.status >= 400 {
		var e struct {
			Code string `json:"code"`
		}
		json.Unmarshal(body, &e)
		r.code = e.Code
	}
	k.mu.Lock()
	k.latency[scenario] = append(k.latency[scenario], r.recv.Sub(r.send))
	if k.statuses[scenario] == nil {
		k.statuses[scenario] = map[int]int{}
	}
	k.statuses[scenario][r.status]++
	k.mu.Unlock()

	r.rl, r.rlErr = parseRateLimit(resp.Header, r.status, r.recv)
	if r.rlErr != nil {
		k.checks.record(checkHeaders, false, fmt.Sprintf("%s %d: %v", scenario, r.status, r.rlErr))
		return r
	}
	k.checks.record(checkHeaders, true, "")
	if r.status == http.StatusTooManyRequests {
		k.checks.record(checkRetryAfter, r.rl.retryAfter >= time.Second, fmt.Sprintf("%s: Retry-After %s", scenario, r.rl.retryAfter))
	}
	if r.rl.window == 0 {
		// The specification's three fields alone name no window.
		r.rl.window = k.windows[key.id]
	}
	if r.rl.window == 0 {
		// Nothing to bound the check by: not checked, rather than passed.
		return r
	}
	a := answer{send: r.send, recv: r.recv, remaining: r.rl.remaining, window: r.rl.window, from: resp.Header.Get("X-Served-By")}
	ok, bound, _ := k.remaining.observe(key.id, a)
	if !ok {
		k.checks.record(checkRemaining, false, fmt.Sprintf("%s: %s answered Remaining %d %s after %d %s: a rise of %d, %d allowed",
			scenario, key.id, a.remaining, k.when(a), bound.remaining, k.when(bound), a.remaining-bound.remaining, k.remaining.slack))
	} else {
		k.checks.record(checkRemaining, true, "")
	}
	return r
}

// when says where and when a was answered, for a failure message: its
// replica when the deployment names it, and its send and receive times
// from the start of the run.
func (k *kit) when(a answer) string {
	from := ""
	if a.from != "" {
		from = a.from + ", "
	}
	return fmt.Sprintf("(%ssent %s, received %s)", from, a.send.Sub(k.start).Round(time.Millisecond), a.recv.Sub(k.start).Round(time.Millisecond))
}

// learnWindows asks GET /v1/rate_limit, which spends none of a key's
// quota, for every key's windows, and keeps the shortest of each: the
// Remaining check needs it, and a server that sends the specification's
// three rate-limit fields alone (petstore's default) names no window in
// them. At most workers requests are in flight at once.
func (k *kit) learnWindows(ctx context.Context, keys []key) error {
	k.windows = make(map[string]time.Duration, len(keys))
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	next := make(chan key)
	for range min(k.cfg.workers, 16, len(keys)) {
		wg.Go(func() {
			for key := range next {
				w, err := k.shortestWindow(ctx, key)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				k.windows[key.id] = w
				mu.Unlock()
			}
		})
	}
	for _, key := range keys {
		next <- key
	}
	close(next)
	wg.Wait()
	return first
}

// logf writes a line of progress; the scenarios run concurrently.
func (k *kit) logf(format string, args ...any) {
	k.logMu.Lock()
	defer k.logMu.Unlock()
	fmt.Fprintf(k.log, format+"\n", args...)
}

// quotaTries is how many times the kit asks GET /v1/rate_limit for a key
// that answers 503 or 429, waiting its Retry-After (at most 5 s) between:
// a deployment that has just started may answer a first request with
// 503 (petstore does when its Redis read times out), which says to retry.
const quotaTries = 4

// shortestWindow returns the shortest window GET /v1/rate_limit lists
// for key.
func (k *kit) shortestWindow(ctx context.Context, key key) (time.Duration, error) {
	var (
		status int
		body   []byte
	)
	for try := 1; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.cfg.url+"/v1/rate_limit", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+key.secret)
		resp, err := k.client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("GET /v1/rate_limit for %s: %w", key.id, err)
		}
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		status = resp.StatusCode
		if status != http.StatusServiceUnavailable && status != http.StatusTooManyRequests || try == quotaTries {
			break
		}
		wait := time.Second
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra >= 0 {
			wait = min(time.Duration(ra)*time.Second, 5*time.Second)
		}
		k.logf("GET /v1/rate_limit for %s: %d, asking again in %s", key.id, status, wait)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("GET /v1/rate_limit for %s: %d %.200s", key.id, status, body)
	}
	var q struct {
		Windows []struct {
			Period string `json:"period"`
		} `json:"windows"`
	}
	if err := json.Unmarshal(body, &q); err != nil || len(q.Windows) == 0 {
		return 0, fmt.Errorf("GET /v1/rate_limit for %s: no windows in %.200s (%v)", key.id, body, err)
	}
	var shortest time.Duration
	for _, w := range q.Windows {
		d, err := time.ParseDuration(w.Period)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("GET /v1/rate_limit for %s: period %q: %v", key.id, w.Period, err)
		}
		if shortest == 0 || d < shortest {
			shortest = d
		}
	}
	return shortest, nil
}

// report is what a run measured.
type report struct {
	k       *kit
	elapsed time.Duration
}

func (k *kit) run(ctx context.Context, keys, tiny []key) report {
	start := time.Now()
	var wg sync.WaitGroup
	if len(tiny) >= 2 {
		wg.Go(func() { k.retryAfter(ctx, tiny[0]) })
		wg.Go(func() { k.abusive(ctx, tiny[1]) })
	}
	k.steady(ctx, keys)
	k.burst(ctx, keys)
	wg.Wait()
	return report{k: k, elapsed: time.Since(start)}
}

// steady sends requests at a constant arrival rate, spread over keys in
// turn, whatever the answers' latency (an open model, as real traffic).
// Every answer must be 2xx: the keys' plan has room for the rate.
func (k *kit) steady(ctx context.Context, keys []key) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.duration)
	defer cancel()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range k.cfg.workers {
		wg.Go(func() {
			for i := range jobs {
				r := k.get(ctx, "steady", keys[i%len(keys)])
				if r.err == nil {
					k.checks.record(checkStatus, r.status/100 == 2, fmt.Sprintf("steady: %d %s", r.status, r.code))
				}
			}
		})
	}
	start := time.Now()
	for i := 0; ; i++ {
		if d := time.Until(start.Add(arrival(i+1, k.cfg.rate, k.cfg.ramp))); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case jobs <- i:
		default:
			k.mu.Lock()
			k.dropped++
			k.mu.Unlock()
		}
	}
	close(jobs)
	wg.Wait()
}

// arrival returns when the steady scenario's n-th arrival is due, from
// its start: the rate rises linearly from 0 over ramp (the n-th arrival
// at √(2·ramp·n/rate) while n ≤ rate·ramp/2), then holds (ramp/2 +
// n/rate after).
func arrival(n int, rate float64, ramp time.Duration) time.Duration {
	r := ramp.Seconds()
	var at float64
	if x := float64(n); x <= rate*r/2 {
		at = math.Sqrt(2 * r * x / rate)
	} else {
		at = r/2 + x/rate
	}
	return time.Duration(at * float64(time.Second))
}

// burst sends cfg.burst requests at once, spread over keys: all 2xx.
func (k *kit) burst(ctx context.Context, keys []key) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, k.cfg.workers)
	for i := range k.cfg.burst {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r := k.get(ctx, "burst", keys[i%len(keys)])
			if r.err == nil {
				k.checks.record(checkStatus, r.status/100 == 2, fmt.Sprintf("burst: %d %s", r.status, r.code))
			}
		})
	}
	wg.Wait()
}

// retryAfter is a well-behaved client: it sends until refused, waits
// exactly Retry-After, and must be admitted on its first retry; it is
// never banned.
func (k *kit) retryAfter(ctx context.Context, key key) {
	banned := false
	for cycle := 0; cycle < k.cfg.retries && ctx.Err() == nil; cycle++ {
		var refused response
		for i := 0; ; i++ {
			r := k.get(ctx, "retry-after", key)
			if r.err != nil {
				return
			}
			banned = banned || r.code == "key_banned"
			if r.status == http.StatusTooManyRequests {
				refused = r
				break
			}
			k.checks.record(checkStatus, r.status == http.StatusOK, fmt.Sprintf("retry-after: %d %s", r.status, r.code))
			if i > k.cfg.tinyLimit {
				k.checks.record(checkStatus, false, fmt.Sprintf("retry-after: %d requests admitted, more than the plan's %d", i+1, k.cfg.tinyLimit))
				return
			}
		}
		k.checks.record(checkStatus, refused.code == "rate_limited", fmt.Sprintf("retry-after: refused with %s, want rate_limited", refused.code))
		k.logf("retry-after: refused (%s), waiting Retry-After %s", refused.code, refused.rl.retryAfter)
		select {
		case <-ctx.Done():
			return
		case <-time.After(refused.rl.retryAfter):
		}
		r := k.get(ctx, "retry-after", key)
		if r.err != nil {
			return
		}
		banned = banned || r.code == "key_banned"
		k.checks.record(checkFirstRetry, r.status == http.StatusOK, fmt.Sprintf("retry %d after Retry-After %s: %d %s", cycle+1, refused.rl.retryAfter, r.status, r.code))
	}
	k.checks.record(checkNeverBanned, !banned, "the client that honours Retry-After was banned")
}

// abusive ignores 429s: it must be banned within the plan's limit plus
// its ban threshold (bounded here by 20 times the limit), and key_banned's
// Retry-After must count down the rest of the ban.
func (k *kit) abusive(ctx context.Context, key key) {
	var first response
	maxRequests := 20 * (k.cfg.tinyLimit + 5)
	for i := 0; ; i++ {
		r := k.get(ctx, "abusive", key)
		if r.err != nil {
			return
		}
		if r.code == "key_banned" {
			first = r
			break
		}
		if i == maxRequests {
			k.checks.record(checkBanned, false, fmt.Sprintf("not banned after %d requests ignoring 429s", i+1))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	k.checks.record(checkBanned, true, "")
	k.logf("abusive: banned, Retry-After %s", first.rl.retryAfter)
	if k.cfg.tinyBan > 0 {
		// Retry-After is whole seconds, rounded up from the rest of the ban.
		ra := first.rl.retryAfter
		k.checks.record(checkBanRemaining, ra <= k.cfg.tinyBan+time.Second && ra >= k.cfg.tinyBan-time.Second,
			fmt.Sprintf("first key_banned Retry-After %s, ban %s", ra, k.cfg.tinyBan))
	}
	// Later answers count down the same ban.
	for range 2 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(1500 * time.Millisecond):
		}
		r := k.get(ctx, "abusive", key)
		if r.err != nil {
			return
		}
		want := first.rl.retryAfter - r.recv.Sub(first.recv)
		got := r.rl.retryAfter
		k.checks.record(checkBanRemaining, r.code == "key_banned" && got >= want-time.Second && got <= want+time.Second,
			fmt.Sprintf("%s later: %d %s, Retry-After %s, want about %s", r.recv.Sub(first.recv).Round(time.Millisecond), r.status, r.code, got, want.Round(time.Second)))
	}
}

// print writes the summary and returns how many thresholds failed.
func (rep report) print(w io.Writer, cfg config) int {
	k := rep.k
	k.mu.Lock()
	defer k.mu.Unlock()
	fmt.Fprintf(w, "\npetstore load test against %s (%s)\n\n", cfg.url, rep.elapsed.Round(time.Millisecond))
	sorted := map[string][]time.Duration{}
	for _, sc := range []string{"steady", "burst", "retry-after", "abusive"} {
		lat := slices.Clone(k.latency[sc])
		if len(lat) == 0 {
			continue
		}
		slices.Sort(lat)
		sorted[sc] = lat
		extra := ""
		if sc == "steady" {
			// Over the plateau the ramp's arrivals would have taken.
			extra = fmt.Sprintf(", %.0f requests/s (target %.0f)", float64(len(lat))/(cfg.duration-cfg.ramp/2).Seconds(), cfg.rate)
			if cfg.ramp > 0 {
				extra += fmt.Sprintf(", ramped up over %s", cfg.ramp)
			}
		}
		fmt.Fprintf(w, "  %-12s %7d requests%s, statuses %v\n", sc, len(lat), extra, k.statuses[sc])
		fmt.Fprintf(w, "  %-12s latency p50 %s  p90 %s  p95 %s  p99 %s  max %s\n", "", pct(lat, 50), pct(lat, 90), pct(lat, 95), pct(lat, 99), lat[len(lat)-1].Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, "  dropped arrivals (every worker busy): %d; connection errors: %d\n\nchecks\n", k.dropped, k.errors)
	failed := 0
	scenarioCheck := map[string]bool{checkFirstRetry: true, checkNeverBanned: true, checkBanned: true, checkBanRemaining: true}
	for _, name := range k.checks.names() {
		pass, fail := k.checks.pass[name], k.checks.fail[name]
		rate := float64(pass) / float64(pass+fail)
		want := cfg.checkRate
		if scenarioCheck[name] {
			want = 1
		}
		mark := "ok  "
		if rate < want {
			mark = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "  %s %-66s %6.2f%% (%d/%d, threshold %.1f%%)\n", mark, name, 100*rate, pass, pass+fail, 100*want)
		if name == checkRemaining {
			compared, rose, most := k.remaining.rises()
			fmt.Fprintf(w, "         %d of %d comparisons rose, by at most %d (allowed: %d)\n", rose, compared, most, k.remaining.slack)
			if most > 0 {
				key, a, from := k.remaining.largest()
				fmt.Fprintf(w, "         the most: %s answered %d %s after %d %s\n", key, a.remaining, k.when(a), from.remaining, k.when(from))
			}
		}
		for _, s := range k.checks.sample[name] {
			fmt.Fprintf(w, "         e.g. %s\n", s)
		}
	}
	fmt.Fprintln(w, "\nthresholds")
	for _, th := range []struct {
		scenario string
		p        int
		max      time.Duration
	}{{"steady", 95, cfg.p95}, {"steady", 99, cfg.p99}, {"burst", 99, cfg.burstP99}} {
		lat := sorted[th.scenario]
		if th.scenario == "burst" && cfg.burst == 0 {
			continue
		}
		got := pct(lat, th.p)
		mark := "ok  "
		if len(lat) == 0 || got > th.max {
			mark = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "  %s %s latency p%d %s < %s\n", mark, th.scenario, th.p, got, th.max)
	}
	if len(k.checks.names()) == 0 {
		fmt.Fprintln(w, "  FAIL no checks ran")
		failed++
	}
	if failed > 0 {
		fmt.Fprintf(w, "\n%d threshold(s) failed\n", failed)
	} else {
		fmt.Fprintln(w, "\nall thresholds passed")
	}
	return failed
}

// pct returns the p-th percentile of sorted latencies.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)].Round(10 * time.Microsecond)
}
