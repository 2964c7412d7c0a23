package fleettest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestKeyAffinity runs the fleet behind HAProxy balancing by key
// (make cluster BALANCE=key: a consistent hash of the Authorization
// header), six keys each sent at twice its plan's rate, and stops the
// replica serving the first key halfway. It checks what the balancing
// promises: before the stop each key is served by one replica, the keys by
// more than one; after it, the stopped replica's keys each by one of the
// others and the other keys where they were (consistent hashing moves
// only the keys of the replica that left); and what the limiter promises
// whatever the balancing: no failed request, and no interval of the
// plan's window holding more than its limit for any key, across the move.
func TestKeyAffinity(t *testing.T) {
	const limit, period = 40, 4 * time.Second
	f := newFleet(t, fleetOptions{
		byKey:     true,
		accessLog: true,
		plans:     "plans:\n  affine: {quotas: [{limit: 40, period: 4s}], ban: off}\n",
		keys:      map[string]int{"affine": 6},
	})
	keys := f.keys["affine"]
	l := f.startLoad(loadSpec{rate: 2 * float64(len(keys)) * limit / period.Seconds(), workers: 16, targets: []string{f.lb.url}, keys: keys})
	time.Sleep(4 * time.Second)

	// The replica serving the first key, by the access logs so far.
	before := servedBy(f.accessLog(), time.Time{}, time.Now())
	owner := before[keys[0].ID]
	if len(owner) != 1 {
		t.Fatalf("key 0 served by %v before any replica left, want one replica", owner)
	}
	var victim *replica
	for _, r := range f.replicas {
		if r.name+"-1" == owner[0] {
			victim = r
		}
	}
	if victim == nil {
		t.Fatalf("no replica named by %q", owner[0])
	}
	stopped := time.Now()
	victim.stop()
	// Out of rotation within a check, and whatever it answered drained.
	settled := time.Now().Add(checkInterval)
	time.Sleep(5 * time.Second)
	run := time.Since(l.start)
	rs := l.stop()

	log := f.accessLog()
	before = servedBy(log, time.Time{}, stopped)
	after := servedBy(log, settled, time.Now())
	used := map[string]bool{}
	for i, k := range keys {
		b, a := before[k.ID], after[k.ID]
		t.Logf("key %d: served by %v, then by %v", i, b, a)
		if len(b) != 1 || len(a) != 1 {
			t.Errorf("key %d: served by %v before %s stopped and by %v after, want one replica each time", i, b, victim.name, a)
			continue
		}
		used[b[0]] = true
		switch {
		case b[0] == owner[0] && a[0] == owner[0]:
			t.Errorf("key %d: still served by %s after it stopped", i, owner[0])
		case b[0] != owner[0] && a[0] != b[0]:
			t.Errorf("key %d: moved from %s to %s though its replica stayed", i, b[0], a[0])
		}
	}
	if len(used) < 2 {
		t.Errorf("six keys all served by %v: not spread over the replicas", used)
	}
	for i, adm := range judgeKeys(t, rs, len(keys), run) {
		judgeWindow(t, fmt.Sprintf("key %d", i), adm, limit, period, run)
	}
}

// servedBy returns, for each key ID, the replica runs (r1-1, ...) whose
// access logs record a request of it finished between from and to.
func servedBy(log []served, from, to time.Time) map[string][]string {
	out := map[string][]string{}
	for _, s := range log {
		if s.keyID == "" || s.end.Before(from) || s.end.After(to) {
			continue
		}
		if !slices.Contains(out[s.keyID], s.replica) {
			out[s.keyID] = append(out[s.keyID], s.replica)
		}
	}
	return out
}
