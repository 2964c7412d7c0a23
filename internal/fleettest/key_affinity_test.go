package fleettest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestKeyAffinity runs the fleet behind HAProxy balancing by key
// (make cluster BALANCE=key: a consistent hash of the Authorization
// header), twelve keys each sent at twice its plan's rate, and stops the
// replica serving the first key halfway. It checks what the balancing
// promises: before the stop each key is served by one replica, the keys by
// more than one; after it, the stopped replica's keys each by one of the
// others and the other keys where they were (consistent hashing moves
// only the keys of the replica that left); and what the limiter promises
// whatever the balancing: no failed request, and no interval of the
// plan's window holding more than its limit for any key, across the move.
func TestKeyAffinity(t *testing.T) {
	testenv.Long(t)
	const limit, period = 40, 4 * time.Second
	f := newFleet(t, fleetOptions{
		balance:   balanceByKey,
		accessLog: true,
		plans:     "plans:\n  affine: {quotas: [{limit: 40, period: 4s}], ban: off}\n",
		// Twelve keys: HAProxy hashes keys to the three replicas about
		// evenly (34%, 30% and 36% of 3,000 random keys), so six all
		// landed on one replica about once in 225 runs, failing the
		// spread check below (and leaving the check that the others'
		// keys stay put with nothing to check); twelve, about once in
		// 130,000.
		keys: map[string]int{"affine": 12},
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
		t.Errorf("%d keys all served by %v: not spread over the replicas", len(keys), used)
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

// TestBalanceMatchesCluster checks that the fleet tests balance as make
// cluster does: the HAProxy lines of each BALANCE, as cluster.sh prints
// them, are the tests' own.
func TestBalanceMatchesCluster(t *testing.T) {
	for balance, want := range map[string]string{
		"roundrobin":  balanceRoundRobin,
		"key":         balanceByKey,
		"key-bounded": balanceByKeyBounded,
	} {
		cmd := exec.Command("bash", "../../deploy/local/cluster.sh", "balance")
		cmd.Env = append(os.Environ(), "BALANCE="+balance)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("BALANCE=%s cluster.sh balance: %v", balance, err)
		}
		if got := strings.TrimSuffix(string(out), "\n"); got != want {
			t.Errorf("BALANCE=%s: cluster.sh balances with\n%s\nthe fleet tests with\n%s", balance, got, want)
		}
	}
}

// TestHotKeyUnderBoundedLoad runs the fleet behind HAProxy balancing by
// key with bounded loads (make cluster BALANCE=key-bounded: no replica
// holds more than 1.5 times the fleet's average of requests in flight, the
// excess going on to the next replicas on the hash ring), one key sent by
// 24 callers as fast as the fleet answers them, past its limit of 1000 a
// second, and four keys at 20 requests a second under theirs. Balanced by
// key alone, the hot key's requests would all load one replica
// (TestKeyAffinity: each key served by one). It checks that the hot key
// was spread: served by more than one replica, no replica serving more
// than three quarters of it; and what the limiter promises however
// requests are spread: no failed request, and no interval of a window
// holding more than its limit, for any key. The keys that shared the hot
// key's replica are passed on too while it is full: bounded loads move
// whatever arrives at a full replica, not the hot key alone.
func TestHotKeyUnderBoundedLoad(t *testing.T) {
	const (
		hotLimit, hotPeriod = 1000, time.Second
		limit, period       = 40, 4 * time.Second
	)
	f := newFleet(t, fleetOptions{
		balance:   balanceByKeyBounded,
		accessLog: true,
		plans: "plans:\n  hot: {quotas: [{limit: 1000, period: 1s}], ban: off}\n" +
			"  affine: {quotas: [{limit: 40, period: 4s}], ban: off}\n",
		keys: map[string]int{"hot": 1, "affine": 4},
	})
	hotKey, keys := f.keys["hot"][0], f.keys["affine"]
	leased := f.leasedAdmissions(t, "hot")
	// A rate no fleet of this size answers: the 24 callers are always busy.
	hot := f.startLoad(loadSpec{rate: 20_000, workers: 24, targets: []string{f.lb.url}, keys: []apiKey{hotKey}})
	cold := f.startLoad(loadSpec{rate: 20 * float64(len(keys)), workers: 8, targets: []string{f.lb.url}, keys: keys})
	time.Sleep(8 * time.Second)
	run := time.Since(hot.start)
	hrs, crs := hot.stop(), cold.stop()
	leased = f.leasedAdmissions(t, "hot") - leased

	log := f.accessLog()
	perReplica := map[string]int{}
	total := 0
	for _, s := range log {
		if s.keyID == hotKey.ID {
			perReplica[s.replica]++
			total++
		}
	}
	busiest := 0
	for _, n := range perReplica {
		busiest = max(busiest, n)
	}
	t.Logf("hot key: %d requests served, by replica %v; busiest %.2f of them", total, perReplica, float64(busiest)/float64(max(total, 1)))
	if len(perReplica) < 2 {
		t.Errorf("hot key served by %v alone: bounded loads passed nothing on", perReplica)
	} else if 4*busiest > 3*total {
		t.Errorf("hot key: one replica served %d of its %d requests, more than three quarters", busiest, total)
	}
	for r, cs := range servedBy(log, time.Time{}, time.Now()) {
		t.Logf("key %s served by %v", r, cs)
	}

	adm := judgeLoad(t, "hot key", hrs, run)
	// Past its limit most of the run, the key is decided near it, where
	// leases stop: logged, not judged.
	t.Logf("hot key: %.0f of %d admissions from leases", leased, len(adm))
	judgeWindow(t, "hot key", adm, hotLimit, hotPeriod, run)
	for i, a := range judgeKeys(t, crs, len(keys), run) {
		judgeWindow(t, fmt.Sprintf("key %d", i), a, limit, period, run)
	}
}
