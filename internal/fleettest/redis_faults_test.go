package fleettest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// fault is one injected Redis fault and when Redis answered again.
type fault struct {
	name        string
	crash       bool
	began, back time.Time
}

// redisFault is what a test does to Redis.
type redisFault struct {
	name  string
	crash bool                           // Redis restarts empty, its connections gone
	do    func(r *redisServer) time.Time // returns when Redis answers again
}

func pauseFor(d time.Duration) redisFault {
	return redisFault{name: fmt.Sprintf("paused %s", d), do: func(r *redisServer) time.Time { return r.pause(d) }}
}

// fullFor makes Redis refuse every write for d, as a Redis full to its
// maxmemory under noeviction does: its answers stay quick (OOM).
func fullFor(d time.Duration) redisFault {
	return redisFault{name: fmt.Sprintf("full for %s", d), do: func(r *redisServer) time.Time { return r.fill(d) }}
}

func crashFor(d time.Duration) redisFault {
	return redisFault{name: fmt.Sprintf("killed, restarted after %s", d), crash: true, do: func(r *redisServer) time.Time { return r.crash(d) }}
}

// breakerTrips returns each replica's petstore_ratelimit_breaker_trips_total.
func (f *fleet) breakerTrips(t *testing.T) []float64 {
	t.Helper()
	trips := make([]float64, len(f.replicas))
	for i, r := range f.replicas {
		v, err := r.metric("petstore_ratelimit_breaker_trips_total")
		if err != nil {
			t.Fatal(err)
		}
		trips[i] = v
	}
	return trips
}

// waitShared waits until no replica limits locally any more and returns
// how long after back that was.
func (f *fleet) waitShared(t *testing.T, back time.Time) time.Duration {
	t.Helper()
	for {
		local := 0
		for _, r := range f.replicas {
			v, err := r.metric("petstore_ratelimit_fallback_active")
			if err != nil {
				t.Fatal(err)
			}
			if v != 0 {
				local++
			}
		}
		if local == 0 {
			return time.Since(back)
		}
		if time.Since(back) > 5*time.Second {
			t.Fatalf("%d replicas still limit locally 5s after Redis answered", local)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisFaults are the faults every Redis test injects, in this order.
func redisFaults() []redisFault {
	return []redisFault{pauseFor(100 * time.Millisecond), pauseFor(500 * time.Millisecond), pauseFor(3 * time.Second), crashFor(2 * time.Second)}
}

// TestRedisFaultsFailOpen stalls Redis (SIGSTOP for 100 ms, 500 ms and
// 3 s) and crashes it (SIGKILL, restarted 2 s later) under load through
// HAProxy, in the default fail-open mode: no request fails, and after each
// pause every replica is back on shared limiting within 1 s of Redis
// answering. After a crash the limiter has taken up to 1.4 s, so that is
// not asserted here. The windows are TestRedisFaultsKeepWindows'.
func TestRedisFaultsFailOpen(t *testing.T) {
	const timeout = 50 * time.Millisecond
	f := newFleet(t, fleetOptions{keys: map[string]int{"loadtest": 16}, redisTimeout: timeout})
	l := f.startLoad(loadSpec{rate: 300, workers: 32, targets: []string{f.lb.url}, keys: f.keys["loadtest"]})
	time.Sleep(time.Second)
	for _, fl := range redisFaults() {
		began := time.Now()
		back := fl.do(f.redis)
		resumed := f.waitShared(t, back)
		t.Logf("Redis %s: every replica back on shared limiting %s after Redis answered", fl.name, resumed.Round(time.Millisecond))
		if resumed > time.Second && !fl.crash {
			t.Errorf("Redis %s: shared limiting resumed %s after Redis answered, want within 1s", fl.name, resumed)
		}
		time.Sleep(time.Second)
		during := summarize(between(l.snapshot(), began, back.Add(time.Second)), back.Sub(began)+time.Second)
		t.Logf("Redis %s: requests sent from the fault until 1s after: %s", fl.name, during)
	}
	rs := l.stop()
	s := summarize(rs, time.Since(l.start))
	t.Logf("whole run: %s", s)
	for i, r := range failures(rs) {
		if i == 10 {
			break
		}
		t.Errorf("failed request (fail-open must answer): %s", describe(r))
	}
	if s.ok != s.total {
		t.Errorf("%d of %d requests were not 2xx: %v", s.total-s.ok, s.total, s.codes)
	}
}

// TestRedisFaultsFailClosed runs the fleet fail-closed: while Redis is
// stalled for 3 s or down, requests that need it get 503 unavailable with
// Retry-After: 1 (leases granted before the fault are still spent, for at
// most 1 s), nothing else fails, and after the stall no 503 is sent once
// Redis has been answering for 1 s, until 100 ms before the crash that
// follows (after a crash the limiter has taken up to 1.7 s, so that is
// not asserted here).
func TestRedisFaultsFailClosed(t *testing.T) {
	const timeout = 50 * time.Millisecond
	f := newFleet(t, fleetOptions{keys: map[string]int{"loadtest": 8}, redisTimeout: timeout, failureMode: "closed"})
	l := f.startLoad(loadSpec{rate: 200, workers: 32, targets: []string{f.lb.url}, keys: f.keys["loadtest"]})
	time.Sleep(time.Second)
	var faults []fault
	for _, fl := range []redisFault{pauseFor(3 * time.Second), crashFor(2 * time.Second)} {
		began := time.Now()
		back := fl.do(f.redis)
		faults = append(faults, fault{fl.name, fl.crash, began, back})
		time.Sleep(2 * time.Second)
	}
	rs := l.stop()
	t.Logf("whole run: %s", summarize(rs, time.Since(l.start)))
	for i, fl := range faults {
		// Judged until the next fault, less the round trip a request
		// sent just before it still needs (its call may reach Redis
		// after the next fault began, and fail on that one).
		end := fl.back.Add(2 * time.Second)
		if i+1 < len(faults) {
			end = faults[i+1].began.Add(-100 * time.Millisecond)
		}
		var unavailable, lateUnavailable int
		var last time.Time
		for _, r := range rs {
			if r.status != 503 {
				continue
			}
			if r.send.Before(end) && r.send.After(last) {
				last = r.send
			}
			if r.code != "unavailable" || r.retryAfter != "1" {
				t.Errorf("503 without the unavailable body and Retry-After: 1: %s, Retry-After %q", describe(r), r.retryAfter)
			}
			if !r.send.Before(fl.began) && r.recv.Before(fl.back.Add(time.Second)) {
				unavailable++
			}
			if r.send.After(fl.back.Add(time.Second)) && r.send.Before(end) {
				lateUnavailable++
			}
		}
		t.Logf("Redis %s: %d answered 503 during the fault, %d sent from 1s to %s after Redis answered; the last 503 before then was sent %s after Redis answered",
			fl.name, unavailable, lateUnavailable, end.Sub(fl.back).Round(time.Millisecond), last.Sub(fl.back).Round(time.Millisecond))
		if unavailable == 0 {
			t.Errorf("Redis %s: no 503 while Redis was unavailable in fail-closed mode", fl.name)
		}
		if lateUnavailable > 0 && !fl.crash {
			t.Errorf("Redis %s: %d requests still got 503 more than 1s after Redis answered", fl.name, lateUnavailable)
		}
	}
	for _, r := range rs {
		if r.err != nil || (r.status != 200 && r.status != 503) {
			t.Errorf("unexpected answer in fail-closed mode: %s", describe(r))
		}
	}
}

// snapshot returns the results collected so far.
func (l *load) snapshot() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results)
}

// between returns the results sent in [from, to).
func between(rs []result, from, to time.Time) []result {
	var out []result
	for _, r := range rs {
		if !r.send.Before(from) && r.send.Before(to) {
			out = append(out, r)
		}
	}
	return out
}
