package fleettest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoadTestKit runs the load-test kit (deploy/loadtest, its own module)
// in its short form against a fleet shaped like make cluster's, so the kit
// cannot rot: every scenario, check and threshold must pass. The replicas
// lease no admissions (--ratelimit-max-lease 1): with leases, answers from
// different replicas are not ordered by Remaining (a replica spending a
// lease counts down from what Redis said when it took it), which the
// kit's "Remaining never rises" check would rightly report.
func TestLoadTestKit(t *testing.T) {
	kitBin := filepath.Join(t.TempDir(), "loadtest")
	if err := goBuild(kitBin, "../../deploy/loadtest", "."); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, fleetOptions{
		plans: `plans:
  tiny:
    quotas: [{limit: 5, period: 10s}]
    ban: {threshold: 10, within: 1m, duration: 30s, multiplier: 2, max: 10m, memory: 1h}
`,
		keys:     map[string]int{"loadtest": 20, "tiny": 3},
		maxLease: 1,
	})
	began := time.Now()
	cmd := exec.Command(kitBin, "-short", "-url", f.lb.url,
		"-keys", filepath.Join(f.dir, "keys-loadtest.csv"), "-tiny-keys", filepath.Join(f.dir, "keys-tiny.csv"),
		"-tiny-limit", "5", "-tiny-period", "10s", "-tiny-ban", "30s")
	out, err := cmd.CombinedOutput()
	t.Logf("loadtest -short (%s):\n%s", time.Since(began).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("the load-test kit failed: %v", err)
	}
	if !strings.Contains(string(out), "all thresholds passed") {
		t.Fatal("the kit exited 0 without saying that every threshold passed")
	}
}
