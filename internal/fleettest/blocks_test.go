package fleettest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestBlocksOnTheFleet runs keys too slow to lease, under a plan of a
// minute and a long window (2000 s), through HAProxy's round robin over
// three replicas that finalized by themselves (so blocks are in force),
// until the long window's limit is reached, and stops one replica
// halfway, as a rollout does. Blocks are taken, spent and let go on real
// processes: the test fails unless a fifth of the admissions or more were
// spent from blocks. What it checks is the promise whatever blocks do: no
// failed request, no interval of the long window (the whole run) holding
// more than its limit for any key, by the clients' send and receive times;
// and, since what blocks leave unspent is given back (the stopped
// replica's at its shutdown, the others' when they end), each key admitted
// exactly its long limit by the end: an admission counted and never given
// back would leave it short for the rest of the 2000 s.
func TestBlocksOnTheFleet(t *testing.T) {
	testenv.Long(t)
	const (
		minute, long = 1000, 240
		period       = 2000 * time.Second
		keysN        = 4
		perKey       = 8.0 // requests a second: about 2.7 a replica, too few to lease
	)
	f := newFleet(t, fleetOptions{
		accessLog:     true,
		finalizeAfter: "2s",
		plans:         fmt.Sprintf("plans:\n  slow: {quotas: [{limit: %d, period: 1m}, {limit: %d, period: %s}], ban: off}\n", minute, long, period),
		keys:          map[string]int{"slow": keysN},
	})
	// No admin command: the replicas finalize by themselves.
	f.waitGauges(t, 15*time.Second, 1, "petstore_ratelimit_records_finalized", "petstore_ratelimit_blocks_in_force")
	keys := f.keys["slow"]
	l := f.startLoad(loadSpec{rate: perKey * keysN, workers: 16, targets: []string{f.lb.url}, keys: keys})

	// Halfway to the long limit, stop a replica: the blocks it holds are
	// let go with it.
	time.Sleep(time.Duration(float64(long) / perKey / 2 * float64(time.Second)))
	victim := f.replicas[0]
	victimSpent := spentOn(t, victim)
	victim.stop()
	if !strings.Contains(victim.p.logs(), "leases and blocks let go") {
		t.Logf("%s held no lease or block when it stopped", victim.name)
	} else {
		t.Logf("%s stopped holding blocks: its log says %q", victim.name, lastLine(victim.p.logs(), "let go"))
	}
	// Run until every key has met its long limit, and past it by a
	// block's life (10 s) and a few seconds, so that every block has
	// ended and been given back.
	time.Sleep(time.Duration(float64(long)/perKey/2*float64(time.Second)) + 15*time.Second)
	run := time.Since(l.start)
	rs := l.stop()

	spent := victimSpent
	for _, r := range f.replicas[1:] {
		spent += spentOn(t, r)
	}
	admitted := 0
	for i, adm := range judgeKeys(t, rs, len(keys), run) {
		admitted += len(adm)
		// (The minute's limit is never near: the long window's is a
		// quarter of it.)
		judgeWindow(t, fmt.Sprintf("key %d", i), adm, long, period, run)
		if len(adm) != long {
			t.Errorf("key %d: %d admitted by the end, want its long limit of %d: admissions were counted and never given back", i, len(adm), long)
		}
	}
	t.Logf("%d admissions, %.0f of them spent in process (%.2f)", admitted, spent, spent/float64(admitted))
	if spent < 0.2*float64(admitted) {
		t.Errorf("%.0f of %d admissions spent in process, want 20%% or more: blocks did not form on the fleet", spent, admitted)
	}
}

// spentOn reads a replica's count of admissions spent in process on the
// plan "slow": from blocks, the keys being too slow to lease.
func spentOn(t *testing.T, r *replica) float64 {
	t.Helper()
	v, err := r.metric(`petstore_ratelimit_leased_total{plan="slow"}`)
	if err != nil && !errors.Is(err, errNoSample) {
		t.Fatal(err)
	}
	return v
}

// lastLine returns the last line of logs that contains s.
func lastLine(logs, s string) string {
	lines := strings.Split(logs, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}
