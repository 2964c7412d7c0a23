package fleettest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestSoak runs make soak's five-minute form (deploy/soak, its own
// module) on this tree's binary: make cluster's fleet at half its
// measured capacity over 10,000 keys, the replicas rolled and Redis
// restarted empty once, halfway. It fails when the soak does: a series
// grew more than 5% from the first steady interval to the last, a
// request got a 5xx or no answer outside the fault's window, or the
// fleet did not recover.
func TestSoak(t *testing.T) {
	testenv.Long(t)
	bin := filepath.Join(t.TempDir(), "soak")
	if err := goBuild(bin, "../../deploy/soak", "."); err != nil {
		t.Fatal(err)
	}
	// Interrupted rather than killed when the test runs out of time, so
	// that the soak stops the fleet it started (cluster.sh's processes
	// outlive a soak killed outright).
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Minute))
		defer cancel()
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, "-duration", "5m", "-petstore", petstoreBin,
		"-cluster-script", "../../deploy/local/cluster.sh", "-dir", dir)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 2 * time.Minute
	began := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("soak -duration 5m (%s):\n%s", time.Since(began).Round(time.Second), out)
	if err != nil {
		// The run's directory goes with the test's: its samples go to the
		// log, for a failure in CI to be read.
		if csvs, _ := filepath.Glob(filepath.Join(dir, "*", "soak.csv")); len(csvs) == 1 {
			if b, err := os.ReadFile(csvs[0]); err == nil {
				t.Logf("soak.csv:\n%s", b)
			}
		}
		t.Fatalf("the soak failed: %v", err)
	}
	if !strings.Contains(string(out), "PASS: ") {
		t.Fatal("the soak exited 0 without saying that it passed")
	}
}
