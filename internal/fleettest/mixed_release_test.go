package fleettest

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/testenv"
)

// previousReleaseVar names the git revision of the release to run beside
// this tree. By default it is the release before this state format: the
// parent of the commit that added ratelimit/format.go.
const previousReleaseVar = "PETSTORE_PREVIOUS_RELEASE"

// buildPreviousRelease builds the petstore binary of rev (from git, as
// committed) into dir.
func buildPreviousRelease(t *testing.T, dir string) (string, string) {
	t.Helper()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			msg := "git " + strings.Join(args, " ") + ": " + err.Error()
			if testenv.InCI() {
				t.Fatal(msg + " (CI runs on a full clone)")
			}
			t.Skip(msg + ": not a full git checkout")
		}
		return strings.TrimSpace(string(out))
	}
	rev := os.Getenv(previousReleaseVar)
	if rev == "" {
		added := git("log", "--diff-filter=A", "--format=%H", "-1", "--", "ratelimit/format.go")
		if added == "" {
			t.Fatal("no commit adds ratelimit/format.go: set " + previousReleaseVar)
		}
		rev = git("rev-parse", added+"^")
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("git", "archive", "--format=tar", rev)
	archive.Dir = "../.."
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v", rev, err)
	}
	if err := untar.Wait(); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "petstore-previous")
	if err := goBuild(bin, src, "./cmd/petstore"); err != nil {
		t.Fatal(err)
	}
	return bin, rev
}

// TestMixedReleasesOnOneRedis runs the previous release's binary beside
// this tree's on one Redis for a key both serve, alternating requests, as
// a rolling upgrade does. Neither may reset the other: each keeps every
// count it made, the day window included. The previous release used
// another state format under other keys, so for this one upgrade the two
// count separately (the README's "Upgrading" states it); from this format
// on, releases extend one set of records and share every count.
func TestMixedReleasesOnOneRedis(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prev, rev := buildPreviousRelease(t, dir)
	t.Logf("previous release: %s", rev)
	f := newFleet(t, fleetOptions{
		replicas: 2,
		plans:    "plans:\n  mixed:\n    quotas:\n      - {limit: 4, period: 1m}\n      - {limit: 1000, period: 24h}\n",
		keys:     map[string]int{"mixed": 1},
		binaries: map[int]string{1: prev},
	})
	cur, old := f.replicas[0], f.replicas[1]
	key := f.keys["mixed"][0]
	ctx := context.Background()
	admitted := map[string]int{}
	for i := range 12 {
		r := []*replica{cur, old}[i%2]
		res := f.get(ctx, r.api, key.Key)
		switch {
		case res.err != nil:
			t.Fatalf("request %d to %s: %v", i, r.name, res.err)
		case res.status == http.StatusOK:
			admitted[r.name]++
		case res.status != http.StatusTooManyRequests:
			t.Fatalf("request %d to %s: %d %s", i, r.name, res.status, res.code)
		}
	}
	t.Logf("admitted: this release %d, previous release %d (of 6 each, limit 4/min)", admitted[cur.name], admitted[old.name])
	// Each release counted exactly what it admitted: nothing was reset by
	// the other's writes, and nothing it wrote was lost.
	for _, c := range []struct {
		name, bin string
		want      int
	}{{"this release", petstoreBin, admitted[cur.name]}, {"previous release", prev, admitted[old.name]}} {
		if c.want != 4 {
			t.Errorf("%s admitted %d of 6 alternating requests, want its limit 4", c.name, c.want)
		}
		used := dayUsed(t, f, c.bin, key.ID)
		if used != c.want {
			t.Errorf("%s's day window counts %d, want the %d it admitted: counts were reset or lost", c.name, used, c.want)
		}
	}
}

// dayUsed reads the 24h window's count of keyID with `petstore limits
// show` of binary bin.
func dayUsed(t *testing.T, f *fleet, bin, keyID string) int {
	t.Helper()
	cmd := exec.Command(bin, "limits", "show", keyID)
	cmd.Env = append(os.Environ(),
		"PETSTORE_PLANS_FILE="+filepath.Join(f.dir, "plans.yaml"),
		"PETSTORE_KEYS_FILE="+filepath.Join(f.dir, "keys.yaml"),
		"PETSTORE_REDIS_ADDRS="+f.redis.addr(),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s limits show: %v\n%s", bin, err, stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		fs := strings.Fields(line)
		if len(fs) >= 2 && strings.HasSuffix(fs[0], "/24h") {
			n, err := strconv.Atoi(fs[1])
			if err != nil {
				t.Fatalf("limits show line %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no 24h window in limits show:\n%s", stdout.String())
	return 0
}
