package fleettest

import (
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestRedisKilledUnderSteadyTraffic kills Redis for 10 s while 100 keys
// send at half their limits (10 of 20 per 2 s each), evenly over three
// replicas through HAProxy, in fail-open mode, then restarts it empty.
// No request may fail; no key may exceed its limit in any window (judged
// by client send and receive times: the outage is longer than the window,
// so every window holds admissions of one regime, local or shared, and
// the locals are added back when Redis returns); and keys under their
// limits are refused only where a replica's share of the headroom runs
// out: in the first window after the failure, where each replica may
// admit ⌊R/N⌋ of what the key had left (10/3 rounds down to 3 against 3.3
// arriving, so a few percent), and after it only by a replica that had
// admitted its whole share of a window (⌊20/3⌋ = 6) for the key in the
// window before, by its own access log.
func TestRedisKilledUnderSteadyTraffic(t *testing.T) {
	testenv.Long(t)
	const (
		limit  = 20
		period = 2 * time.Second
		keys   = 100
	)
	f := newFleet(t, fleetOptions{
		plans:        "plans:\n  half: {quotas: [{limit: 20, period: 2s}], ban: off}\n",
		keys:         map[string]int{"half": keys},
		redisTimeout: 50 * time.Millisecond,
		accessLog:    true,
	})
	// 10 per 2 s per key: half of each key's limit.
	l := f.startLoad(loadSpec{rate: keys * 5, workers: 64, targets: []string{f.lb.url}, keys: f.keys["half"]})
	time.Sleep(3 * time.Second)
	killed := time.Now()
	back := crashFor(10 * time.Second).do(f.redis)
	time.Sleep(3 * time.Second)
	rs := l.stop()
	t.Logf("whole run: %s", summarize(rs, time.Since(l.start)))
	for i, r := range failures(rs) {
		if i == 10 {
			break
		}
		t.Errorf("failed request (fail-open must answer): %s", describe(r))
	}

	worst, worstKey := 0, 0
	for k := range keys {
		if n, _ := windowCount(admissions(rs, k, time.Time{}, time.Now()), period); n > worst {
			worst, worstKey = n, k
		}
	}
	t.Logf("busiest key: at most %d admissions certainly within one %s window (limit %d)", worst, period, limit)
	if worst > limit {
		t.Errorf("key %d: %d admissions within one %s window, limit %d", worstKey, worst, period, limit)
	}

	var first, total int
	for _, r := range between(rs, killed, back) {
		total++
		if r.status == 429 && r.send.Before(killed.Add(period+time.Second)) {
			first++
		}
	}
	// After the first window, every refusal must come from a replica that
	// had admitted its share of the key in the window before it (counted a
	// bucket longer, for the replica's bucket rounding).
	log := f.accessLog()
	later, unexplained := 0, 0
	for _, s := range log {
		if s.status != 429 || s.end.Before(killed.Add(period+time.Second)) || !s.end.Before(back) {
			continue
		}
		later++
		admitted := 0
		for _, o := range log {
			if o.replica == s.replica && o.keyID == s.keyID && o.status == 200 && o.end.Before(s.end) && o.end.After(s.end.Add(-period-50*time.Millisecond)) {
				admitted++
			}
		}
		if admitted < limit/3 {
			unexplained++
			t.Errorf("%s refused key %s at %s having admitted %d of its share %d in the window before", s.replica, s.keyID, s.end.Format("15:04:05.000"), admitted, limit/3)
		}
	}
	t.Logf("while Redis was down: %d requests, %d refused in its first window (plus a second of slack), %d after it (each by a replica that had used its share: %d not)", total, first, later, unexplained)
	if total == 0 || first > total/10 {
		t.Errorf("%d of %d requests refused in the outage's first window: more than the rounding of the shares explains", first, total)
	}
}
