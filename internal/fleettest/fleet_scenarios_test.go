package fleettest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// targets returns HAProxy's URL followed by every replica's API URL.
func (f *fleet) targets() []string {
	return append([]string{f.lb.url}, f.replicaURLs()...)
}

// replicaURLs returns every replica's API URL, bypassing HAProxy.
func (f *fleet) replicaURLs() []string {
	var out []string
	for _, r := range f.replicas {
		out = append(out, r.api)
	}
	return out
}

// TestExactnessAcrossReplicas sprays one key per plan over every replica,
// directly and through HAProxy, and checks each window from outside: no
// group of admissions that certainly fell into less than W exceeds L.
func TestExactnessAcrossReplicas(t *testing.T) {
	checkExactness(t, 0, false)
}

// TestExactnessFinalized is TestExactnessAcrossReplicas on a finalized
// fleet, as a plain fleet of replicas runs once it has finalized by
// itself, with no admin command: records finalized, coarse records read
// by every decision, and one more key (600 per 10 s and a day, at 70 a
// second) whose blocks are spent in process until it nears its limit,
// then decided exactly; every window judged the same.
func TestExactnessFinalized(t *testing.T) {
	testenv.Long(t)
	checkExactness(t, 0, true)
}

// checkExactness runs the exactness scenario on a fleet whose replicas
// have the given --redis-timeout (0: newFleet's default), finalized by
// itself (after 2 s with no older replica) or never.
func checkExactness(t *testing.T, redisTimeout time.Duration, finalized bool) {
	finalizeAfter := "0"
	if finalized {
		finalizeAfter = "2s"
	}
	f := newFleet(t, fleetOptions{
		redisTimeout:  redisTimeout,
		finalizeAfter: finalizeAfter,
		plans: `plans:
  five: {quotas: [{limit: 5, period: 3s}], ban: off}
  hundred: {quotas: [{limit: 100, period: 10s}], ban: off}
  thousand: {quotas: [{limit: 1000, period: 10s}], ban: off}
  two: {quotas: [{limit: 4, period: 1s}, {limit: 10, period: 5s}], ban: off}
  roomy: {quotas: [{limit: 600, period: 10s}, {limit: 100000, period: 24h}], ban: off}
`,
		keys: map[string]int{"five": 1, "hundred": 1, "thousand": 1, "two": 1, "roomy": 1},
	})
	if finalized {
		// No admin command: the replicas finalize by themselves.
		f.waitGauges(t, 15*time.Second, 1, "petstore_ratelimit_records_finalized", "petstore_ratelimit_blocks_in_force")
	}
	type window struct {
		limit  int
		period time.Duration
	}
	type exactCase struct {
		plan    string
		rate    float64
		windows []window
	}
	cases := []exactCase{
		{"five", 30, []window{{5, 3 * time.Second}}},
		// Leases: a replica leases k admissions when it expects k requests
		// for the key before the current bucket (W/200) ends, judged from
		// its last 250 ms, and only while every window has 4·k·replicas
		// left. 100 per 10 s is spent before that can happen at any rate
		// across three replicas; 1000 per 10 s at 600/s is leased for
		// most of its first 1.7 s.
		{"thousand", 600, []window{{1000, 10 * time.Second}}},
		{"hundred", 60, []window{{100, 10 * time.Second}}},
		{"two", 30, []window{{4, time.Second}, {10, 5 * time.Second}}},
	}
	if finalized {
		cases = append(cases, exactCase{"roomy", 70, []window{{600, 10 * time.Second}}})
	}
	roomy := f.leasedAdmissions(t, "roomy")
	const run = 12 * time.Second
	loads := make([]*load, len(cases))
	// The busy key first, alone: while it has most of its window left,
	// replicas must take leases for it and answer a good part of its
	// admissions from them, without a round trip.
	leased := f.leasedAdmissions(t, cases[1].plan)
	loads[1] = f.startLoad(loadSpec{rate: cases[1].rate, workers: 16, targets: f.targets(), keys: f.keys[cases[1].plan]})
	time.Sleep(1500 * time.Millisecond)
	leased = f.leasedAdmissions(t, cases[1].plan) - leased
	early := len(admissions(loads[1].snapshot(), -1, time.Time{}, time.Now()))
	t.Logf("thousand, first 1.5s alone: %d admitted, %.0f of them from leases", early, leased)
	if leased < float64(early)/4 {
		t.Errorf("thousand: %.0f of %d admissions in its first 1.5s came from leases: leases did not form", leased, early)
	}
	for i, c := range cases {
		if loads[i] == nil {
			loads[i] = f.startLoad(loadSpec{rate: c.rate, workers: 8, targets: f.targets(), keys: f.keys[c.plan]})
		}
	}
	time.Sleep(run)
	for _, line := range f.fallbacks() {
		t.Logf("left shared limiting: %s", line)
	}
	for i, c := range cases {
		adm := judgeLoad(t, c.plan, loads[i].stop(), run)
		for _, w := range c.windows {
			judgeWindow(t, c.plan, adm, w.limit, w.period, run)
		}
	}
	if finalized {
		if got := f.leasedAdmissions(t, "roomy") - roomy; got == 0 {
			t.Error("roomy: no admission was spent from a block (or a lease) on the finalized fleet")
		} else {
			t.Logf("roomy: %v admissions spent from blocks and leases", got)
		}
	}
}

// fleetRate is the request rate of the rolling-restart test: 3,000/s by
// default, PETSTORE_FLEET_RATE to measure another.
func fleetRate(t *testing.T) float64 {
	if v := os.Getenv("PETSTORE_FLEET_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 {
			t.Fatalf("PETSTORE_FLEET_RATE=%q: want a positive number of requests per second", v)
		}
		return r
	}
	return 3000
}

// TestRollingRestart restarts every replica in turn (SIGTERM, wait for the
// exit, start again, wait until HAProxy has it back) under load through
// HAProxy: not one request may fail.
func TestRollingRestart(t *testing.T) {
	f := newFleet(t, fleetOptions{keys: map[string]int{"loadtest": 32}})
	rate := fleetRate(t)
	l := f.startLoad(loadSpec{rate: rate, workers: 96, targets: []string{f.lb.url}, keys: f.keys["loadtest"]})
	time.Sleep(time.Second)
	for _, r := range f.replicas {
		began := time.Now()
		r.stop()
		stopped := time.Since(began)
		r.start()
		f.waitInRotation()
		t.Logf("%s: stopped %s after SIGTERM, back in rotation %s after it", r.name, stopped.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rs := l.stop()
	elapsed := time.Since(l.start)
	s := summarize(rs, elapsed)
	t.Logf("rolling restart of %d replicas at a target of %.0f requests/s: %s; %d starts skipped (every worker busy)",
		len(f.replicas), rate, s, l.missed)
	fails := failures(rs)
	for i, r := range fails {
		if i == 10 {
			t.Errorf("... and %d more", len(fails)-10)
			break
		}
		t.Errorf("failed request: %s", describe(r))
	}
	if s.ok != s.total {
		t.Errorf("%d of %d requests were not 2xx: %v", s.total-s.ok, s.total, s.codes)
	}
}

// TestReplicaKilled SIGKILLs a replica under load: only requests in flight
// on it may fail, and HAProxy takes it out of rotation within its check
// interval.
func TestReplicaKilled(t *testing.T) {
	f := newFleet(t, fleetOptions{keys: map[string]int{"loadtest": 16}})
	l := f.startLoad(loadSpec{rate: 800, workers: 32, targets: []string{f.lb.url}, keys: f.keys["loadtest"]})
	time.Sleep(1500 * time.Millisecond)
	victim := f.replicas[1]
	killed := time.Now()
	victim.p.signal(t, syscall.SIGKILL)
	var down time.Duration
	for {
		up, err := f.lb.serversUp()
		if err == nil && !contains(up, victim.name) {
			down = time.Since(killed)
			break
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("haproxy still has %s in rotation 5s after it was killed (%v)", victim.name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	rs := l.stop()
	s := summarize(rs, time.Since(l.start))
	fails := failures(rs)
	t.Logf("SIGKILL of %s: out of rotation after %s; %s; %d failed", victim.name, down.Round(time.Millisecond), s, len(fails))
	// One check interval, plus the check's own round trip on a loaded
	// machine.
	if limit := checkInterval + 100*time.Millisecond; down > limit {
		t.Errorf("haproxy took %s to stop sending to the killed replica, want at most %s", down, limit)
	}
	for _, r := range fails {
		// In flight on the victim: sent before HAProxy knew it was gone.
		if r.send.After(killed.Add(down)) {
			t.Errorf("a request sent after the killed replica left rotation failed: %s", describe(r))
		}
	}
	if s.total-s.ok != len(fails) {
		t.Errorf("unexpected statuses: %v", s.codes)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

const tinyPlans = `plans:
  tiny:
    quotas: [{limit: 3, period: 10s}]
    ban: {threshold: 3, within: 1m, duration: 20s, multiplier: 2, max: 5m, memory: 1h}
  probe: {quotas: [{limit: 1000, period: 1m}], ban: off}
`

// TestBansAcrossFleet earns a ban through one replica and checks that
// every replica enforces it on its next request, and that `petstore limits
// unban` lifts it on all of them.
func TestBansAcrossFleet(t *testing.T) {
	f := newFleet(t, fleetOptions{plans: tinyPlans, keys: map[string]int{"tiny": 1}})
	key := f.keys["tiny"][0]
	ctx := context.Background()
	first := f.replicas[0]
	var banned result
	for i := 0; ; i++ {
		banned = f.get(ctx, first.api, key.Key)
		if banned.code == "key_banned" {
			break
		}
		if i == 30 {
			t.Fatalf("not banned after %d requests; last answer %s", i, describe(banned))
		}
	}
	t.Logf("banned through %s: Retry-After %s", first.name, banned.retryAfter)
	for _, target := range f.targets() {
		r := f.get(ctx, target, key.Key)
		ra, err := strconv.Atoi(r.retryAfter)
		if r.status != 429 || r.code != "key_banned" || err != nil || ra < 1 || ra > 20 {
			t.Errorf("%s right after the ban: %s, Retry-After %q; want 429 key_banned with Retry-After 1..20", target, describe(r), r.retryAfter)
		}
	}

	out := f.petstore("limits", "unban", key.ID)
	lifted := time.Now()
	if !strings.Contains(out, "ban lifted") {
		t.Fatalf("limits unban printed %q", out)
	}
	for _, target := range f.targets() {
		var r result
		for {
			r = f.get(ctx, target, key.Key)
			if r.code != "key_banned" || time.Since(lifted) > time.Second {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(lifted)
		t.Logf("%s after unban (%s): %s", target, took.Round(time.Millisecond), describe(r))
		// The announcement reaches every replica at once; 500 ms leaves
		// room for a loaded machine, and is far below the 2 s recheck
		// that would otherwise hide a lost announcement.
		if r.code == "key_banned" || took > 500*time.Millisecond {
			t.Errorf("%s still enforced the ban %s after limits unban", target, took)
		}
	}
}

// TestPlansFileReachesAll changes the plans file the replicas share and
// measures when each one applies it: within the reload interval.
func TestPlansFileReachesAll(t *testing.T) {
	const interval = time.Second
	f := newFleet(t, fleetOptions{plans: tinyPlans, keys: map[string]int{"probe": 1}, reloadInterval: interval, draftFields: true})
	key := f.keys["probe"][0]
	f.writeFile("plans.yaml", strings.Replace(tinyPlans, "limit: 1000,", "limit: 1001,", 1))
	changed := time.Now()
	ctx := context.Background()
	for _, r := range f.replicas {
		for {
			res, policy := f.policy(ctx, r.api, key.Key)
			if strings.Contains(policy, "q=1001") {
				took := time.Since(changed)
				t.Logf("%s applied the new plan %s after the change", r.name, took.Round(time.Millisecond))
				if took > interval+250*time.Millisecond {
					t.Errorf("%s applied the change after %s, reload interval %s", r.name, took, interval)
				}
				break
			}
			if time.Since(changed) > 3*interval {
				t.Fatalf("%s still answers with %q (%s) %s after the change", r.name, policy, describe(res), 3*interval)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// policy returns a request's RateLimit-Policy header: every window of
// the plan the replica applied, for a fleet started with draftFields.
// (GET /v1/rate_limit says the same but has a throttle of its own, one
// request a second past a burst of 10, which polling would trip.)
func (f *fleet) policy(ctx context.Context, base, key string) (result, string) {
	if !f.opts.draftFields {
		f.t.Fatal("fleet.policy reads RateLimit-Policy: start the fleet with draftFields")
	}
	req, _ := newGet(ctx, base, key)
	res := result{target: base, send: time.Now().Round(0)}
	resp, err := f.client.Do(req)
	if err != nil {
		res.err = err
		return res, ""
	}
	resp.Body.Close()
	res.status = resp.StatusCode
	return res, resp.Header.Get("RateLimit-Policy")
}
