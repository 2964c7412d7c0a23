package fleettest

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// TestLoadTestKit runs the load-test kit (deploy/loadtest, its own module)
// in its short form against fleets shaped like make cluster's, so the kit
// cannot rot: every scenario, check and threshold must pass.
//
//   - strict: the replicas lease no admissions (--ratelimit-max-lease 1),
//     so answers from different replicas are ordered by Remaining and the
//     kit checks that it never rises;
//   - leased: the replicas lease, finalized (blocks in force), as make
//     cluster starts them, and the kit runs as make loadtest runs it: a
//     ramp, and the rise the README allows a leased answer (what three
//     replicas can hold, 3 x 2 x 64, and what a key sends over a lease's
//     life), no more. Answers must rise (leases formed; the allowance is
//     what passes them), and the kit must say how far.
func TestLoadTestKit(t *testing.T) {
	testenv.Long(t)
	kitBin := filepath.Join(t.TempDir(), "loadtest")
	if err := goBuild(kitBin, "../../deploy/loadtest", "."); err != nil {
		t.Fatal(err)
	}
	plans := `plans:
  tiny:
    quotas: [{limit: 5, period: 10s}]
    ban: {threshold: 10, within: 1m, duration: 30s, multiplier: 2, max: 10m, memory: 1h}
`
	for _, c := range []struct {
		name     string
		maxLease int
		flags    []string
	}{
		{"strict", 1, nil},
		{"leased", 0, []string{"-ramp", "2s", "-remaining-held", strconv.Itoa(3 * 2 * 64), "-remaining-lease-life", "10s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t, fleetOptions{plans: plans, keys: map[string]int{"loadtest": 20, "tiny": 3}, maxLease: c.maxLease})
			if c.maxLease == 0 {
				f.finalize(t)
			}
			began := time.Now()
			cmd := exec.Command(kitBin, append([]string{"-short", "-url", f.lb.url,
				"-keys", filepath.Join(f.dir, "keys-loadtest.csv"), "-tiny-keys", filepath.Join(f.dir, "keys-tiny.csv"),
				"-tiny-limit", "5", "-tiny-period", "10s", "-tiny-ban", "30s"}, c.flags...)...)
			out, err := cmd.CombinedOutput()
			t.Logf("loadtest -short %s (%s):\n%s", strings.Join(c.flags, " "), time.Since(began).Round(time.Millisecond), out)
			if err != nil {
				t.Fatalf("the load-test kit failed: %v", err)
			}
			if !strings.Contains(string(out), "all thresholds passed") {
				t.Fatal("the kit exited 0 without saying that every threshold passed")
			}
			m := regexp.MustCompile(`(\d+) of (\d+) comparisons rose, by at most (\d+) \(allowed: (\d+)\)`).FindStringSubmatch(string(out))
			if m == nil {
				t.Fatal("the kit did not say how far Remaining rose")
			}
			if c.maxLease == 1 && (m[1] != "0" || m[4] != "0") {
				t.Fatalf("without leases Remaining rose (%s) or a rise was allowed", m[0])
			}
			if m[2] == "0" {
				t.Fatalf("no answer was compared with an earlier one: %s", m[0])
			}
			if c.maxLease == 0 && m[1] == "0" {
				t.Fatalf("with leases no answer rose, so the allowance went untried: %s", m[0])
			}
		})
	}
}
