package fleettest

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// previousReleaseVar names the git revision of the release to run beside
// this tree. By default it is the release before this state format: the
// parent of the commit that added ratelimit/format.go.
const previousReleaseVar = "PETSTORE_PREVIOUS_RELEASE"

// git runs git in the repository and returns its trimmed output. Outside
// a full checkout the test is skipped, except in CI, which runs on one.
func git(t *testing.T, args ...string) string {
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

// formatCommits lists, oldest first, the commits that changed
// ratelimit/format.go: the first of them added this state format.
func formatCommits(t *testing.T) []string {
	t.Helper()
	out := git(t, "log", "--reverse", "--format=%H", "--", "ratelimit/format.go")
	if out == "" {
		t.Fatal("no commit touches ratelimit/format.go")
	}
	return strings.Fields(out)
}

// buildRelease builds the petstore binary of rev (from git, as committed)
// into dir and returns its path.
func buildRelease(t *testing.T, dir, rev string) string {
	t.Helper()
	src := filepath.Join(dir, "src-"+rev[:12])
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
	bin := filepath.Join(dir, "petstore-"+rev[:12])
	if err := goBuild(bin, src, "./cmd/petstore"); err != nil {
		t.Fatalf("building %s: %v", rev, err)
	}
	return bin
}

// buildPreviousRelease builds the release before this state format (the
// parent of the commit that added ratelimit/format.go), or the one
// PETSTORE_PREVIOUS_RELEASE names.
func buildPreviousRelease(t *testing.T, dir string) (string, string) {
	t.Helper()
	rev := os.Getenv(previousReleaseVar)
	if rev == "" {
		rev = git(t, "rev-parse", formatCommits(t)[0]+"^")
	}
	return buildRelease(t, dir, rev), rev
}

// upgradeFleet starts a fleet whose three replicas all run release rev
// (built from git), serving plans with the keys asked for: the start of
// a rolling upgrade to this tree.
func upgradeFleet(t *testing.T, rev, plans string, keys map[string]int) *fleet {
	t.Helper()
	prev := buildRelease(t, t.TempDir(), rev)
	t.Logf("upgrading from %s", git(t, "log", "-1", "--format=%h %s", rev))
	return newFleet(t, fleetOptions{plans: plans, keys: keys, binaries: map[int]string{0: prev, 1: prev, 2: prev}})
}

// upgrade replaces replica r with this tree's binary as a Deployment's
// rolling update does (SIGTERM, the new binary started, back in HAProxy's
// rotation) and returns how long that took.
func (f *fleet) upgrade(r *replica) time.Duration {
	f.t.Helper()
	began := time.Now()
	r.stop()
	r.bin = petstoreBin
	r.start()
	f.waitInRotation()
	return time.Since(began)
}

// TestMixedReleasesOnOneRedis runs the previous release's binary beside
// this tree's on one Redis for a key both serve, alternating requests, as
// a rolling upgrade does. Neither may reset the other: each keeps every
// count it made, the day window included. The previous release used
// another state format under other keys, so for this one upgrade the two
// count separately (the README's "Upgrading" states it); from this format
// on, releases extend one set of records and share every count.
func TestMixedReleasesOnOneRedis(t *testing.T) {
	testenv.Long(t)
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

// inTurn sends rounds of one request for key to each replica in turn,
// one at a time, and returns the results in the order sent; a request that
// gets no answer fails the test.
func (f *fleet) inTurn(ctx context.Context, key apiKey, rounds int) []result {
	f.t.Helper()
	var out []result
	for i := range rounds * len(f.replicas) {
		r := f.replicas[i%len(f.replicas)]
		res := f.get(ctx, r.api, key.Key)
		if res.err != nil {
			f.t.Fatalf("request %d to %s: %v", i, r.name, res.err)
		}
		out = append(out, res)
	}
	return out
}

// firstFormatRelease is the first commit with this state format that
// builds on its own: the commit that added ratelimit/format.go
// (5fe8bef) and the one after it each left the tree between two halves of
// one change.
const firstFormatRelease = "bfc0d5c2834b5079ff029da4a6a67ba196a9003e"

// TestFormatReleasesShareCounts runs this tree beside two earlier releases
// of the current state format on one Redis, as a rolling upgrade from
// either does: the first release of the format (firstFormatRelease) and
// the release just before its latest extension (the parent of the last
// commit that changed ratelimit/format.go). The README
// promises that releases of one format share every count:
//
//   - strictly: requests to one key sent in turn to each release are
//     admitted exactly up to the limit, not once per release, and every
//     release's `limits show` reads the same day count;
//   - strikes made on any release count toward one ban, which every
//     release then enforces;
//   - under concurrent load, leases included: judged by client send and
//     receive times, no window holds more than its limit across the
//     releases together.
func TestFormatReleasesShareCounts(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	commits := formatCommits(t)
	// The first release must carry the format, not predate it.
	git(t, "merge-base", "--is-ancestor", commits[0], firstFormatRelease)
	revs := []string{firstFormatRelease}
	if before := git(t, "rev-parse", commits[len(commits)-1]+"^"); before != firstFormatRelease {
		revs = append(revs, before)
	}
	dir := t.TempDir()
	bins := map[int]string{}
	for i, rev := range revs {
		bins[i+1] = buildRelease(t, dir, rev)
		t.Logf("r%d runs %s", i+2, git(t, "log", "-1", "--format=%h %s", rev))
	}
	f := newFleet(t, fleetOptions{
		replicas: 1 + len(revs),
		plans: `plans:
  strict: {quotas: [{limit: 6, period: 1m}, {limit: 1000, period: 24h}], ban: off}
  small: {quotas: [{limit: 20, period: 2s}], ban: off}
  leased: {quotas: [{limit: 1000, period: 10s}], ban: off}
  strikes: {quotas: [{limit: 2, period: 1m}], ban: {threshold: 3, within: 1m, duration: 1m}}
`,
		keys:     map[string]int{"strict": 1, "small": 1, "leased": 1, "strikes": 1},
		binaries: bins,
	})

	// Strictly, one request at a time in turn.
	ctx := context.Background()
	key := f.keys["strict"][0]
	var admitted []int
	for i, res := range f.inTurn(ctx, key, 6) {
		switch res.status {
		case http.StatusOK:
			admitted = append(admitted, i)
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d to %s: %d %s", i, res.target, res.status, res.code)
		}
	}
	t.Logf("requests admitted, in turn over %d replicas (limit 6/min): %v", len(f.replicas), admitted)
	if !slices.Equal(admitted, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("admitted requests %v of one key sent in turn to each release, want exactly the first 6 (limit 6/min): releases do not share the count", admitted)
	}
	for _, r := range f.replicas {
		if used := dayUsed(t, f, r.bin, key.ID); used != len(admitted) {
			t.Errorf("%s's limits show counts %d in the day window, want the %d admitted across releases", r.name, used, len(admitted))
		}
	}

	// Strikes and bans, in turn: every rejection is a strike wherever it
	// was made, and more than 3 ban the key on every release. A replica
	// answers a key it knows to be limited from memory and carries those
	// rejections as strikes on its next round trip, made at the latest
	// when its strikes could cross the threshold, so it may learn of a
	// ban another made a few of its own rejections late (the README's
	// Cost). Counted per release, each release would admit 2 of its own
	// and reach a fourth rejection only in the last round.
	key = f.keys["strikes"][0]
	var codes []string
	for _, res := range f.inTurn(ctx, key, 6) {
		code := res.code
		if res.status == http.StatusOK {
			code = "ok"
		}
		codes = append(codes, code)
	}
	t.Logf("answers in turn (limit 2/min, banned after more than 3 rejections): %v", codes)
	for i, code := range codes {
		var want []string
		switch {
		case i < 2:
			want = []string{"ok"}
		case i < 2+3:
			// Each replica's first rejection reaches Redis: strikes 1 to
			// 3, within the threshold. The fourth may ban the key at once
			// (when its replica makes a round trip) or later.
			want = []string{"rate_limited"}
		case i >= len(codes)-len(f.replicas):
			want = []string{"key_banned"}
		default:
			want = []string{"rate_limited", "key_banned"}
		}
		if !slices.Contains(want, code) {
			t.Errorf("request %d to %s answered %q, want one of %v: releases do not share strikes and bans", i, f.replicas[i%len(f.replicas)].name, code, want)
		}
	}

	// Concurrently, over every release.
	const run = 12 * time.Second
	cases := []struct {
		plan   string
		rate   float64
		limit  int
		period time.Duration
		leases bool
	}{
		{"small", 40, 20, 2 * time.Second, false},
		// Busy enough for leases (see checkExactness).
		{"leased", 600, 1000, 10 * time.Second, true},
	}
	loads := make([]*load, len(cases))
	for i, c := range cases {
		loads[i] = f.startLoad(loadSpec{rate: c.rate, workers: 16, targets: f.replicaURLs(), keys: f.keys[c.plan]})
	}
	time.Sleep(run)
	for _, line := range f.fallbacks() {
		t.Logf("left shared limiting: %s", line)
	}
	for i, c := range cases {
		adm := judgeLoad(t, c.plan, loads[i].stop(), run)
		leased := f.leasedAdmissions(t, c.plan)
		t.Logf("%s: %.0f admissions from leases", c.plan, leased)
		if c.leases && leased < float64(len(adm))/20 {
			t.Errorf("%s: %.0f of %d admissions came from leases: leases did not form, so the test did not judge them", c.plan, leased, len(adm))
		}
		judgeWindow(t, c.plan, adm, c.limit, c.period, run)
	}
}

// TestRollingUpgradeKeepsWindows upgrades a fleet from the release before
// the state format's latest extension to this tree, one replica at a time
// as a Deployment's rolling update does (SIGTERM, the new binary started,
// back in HAProxy's rotation), under load through HAProxy on two keys.
// The busy one starts once the first replica runs this tree, so that its
// window fills, leases and all, while both releases serve it. Judged by
// client send and receive times over the whole run, old and new releases
// together: no window holds more than its limit, and no request fails.
func TestRollingUpgradeKeepsWindows(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	commits := formatCommits(t)
	rev := git(t, "rev-parse", commits[len(commits)-1]+"^")
	f := upgradeFleet(t, rev, `plans:
  small: {quotas: [{limit: 20, period: 2s}], ban: off}
  leased: {quotas: [{limit: 1000, period: 10s}], ban: off}
`, map[string]int{"small": 1, "leased": 1})
	// Busy enough for leases while the window fills (see checkExactness).
	small := &judged{plan: "small", limit: 20, period: 2 * time.Second}
	busy := &judged{plan: "leased", limit: 1000, period: 10 * time.Second}
	small.load = f.startLoad(loadSpec{rate: 40, workers: 8, targets: []string{f.lb.url}, keys: f.keys["small"]})
	time.Sleep(2 * time.Second)
	for i, r := range f.replicas {
		took := f.upgrade(r)
		t.Logf("%s upgraded, back in rotation %s after SIGTERM", r.name, took.Round(time.Millisecond))
		if i == 0 {
			busy.load = f.startLoad(loadSpec{rate: 600, workers: 16, targets: []string{f.lb.url}, keys: f.keys["leased"]})
			time.Sleep(2 * time.Second)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(2 * time.Second)
	// Leases the upgraded replicas took, counted since each started: the
	// first one's, while the window filled beside the previous release.
	leased := f.leasedAdmissions(t, busy.plan)
	small.judge(t)
	busy.judge(t)
	t.Logf("leased by this tree's replicas: %.0f admissions", leased)
	if leased == 0 {
		t.Errorf("this tree's replicas leased nothing while the busy key's window filled: the test did not judge leases across releases")
	}
}

// TestRollingUpgradeThenFinalize upgrades a fleet from the release before
// records could be finalized (the parent of the commit that added
// ratelimit/finalize.go) replica by replica behind HAProxy under load,
// as TestRollingUpgradeKeepsWindows does; 'petstore limits finalize' is
// refused while a replica of that release runs, goes through once none
// does, and every replica puts it in force within a heartbeat or two
// (its gauge); the load goes on over several periods, so over many
// epochs of finalized records. Judged by client send and receive times
// over the whole run: no window holds more than its limit, and no
// request fails. Finalizing puts blocks in force too (ratelimit/lease.go):
// the requests of a key well under its limits are then spent from blocks,
// under the same judgement.
func TestRollingUpgradeThenFinalize(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	added := strings.Fields(git(t, "log", "--diff-filter=A", "--format=%H", "--", "ratelimit/finalize.go"))
	if len(added) == 0 {
		t.Fatal("no commit adds ratelimit/finalize.go")
	}
	rev := git(t, "rev-parse", added[len(added)-1]+"^")
	f := upgradeFleet(t, rev, `plans:
  small: {quotas: [{limit: 20, period: 2s}], ban: off}
  paced: {quotas: [{limit: 30, period: 3s}, {limit: 100000, period: 24h}], ban: off}
  roomy: {quotas: [{limit: 200, period: 10s}, {limit: 100000, period: 24h}], ban: off}
`, map[string]int{"small": 1, "paced": 1, "roomy": 1})
	small := &judged{plan: "small", limit: 20, period: 2 * time.Second}
	paced := &judged{plan: "paced", limit: 30, period: 3 * time.Second}
	roomy := &judged{plan: "roomy", limit: 200, period: 10 * time.Second}
	small.load = f.startLoad(loadSpec{rate: 40, workers: 8, targets: []string{f.lb.url}, keys: f.keys["small"]})
	paced.load = f.startLoad(loadSpec{rate: 15, workers: 4, targets: []string{f.lb.url}, keys: f.keys["paced"]})
	roomy.load = f.startLoad(loadSpec{rate: 12, workers: 4, targets: []string{f.lb.url}, keys: f.keys["roomy"]})
	time.Sleep(2 * time.Second)
	for i, r := range f.replicas {
		f.upgrade(r)
		if i == 0 {
			out, errOut, err := f.tryPetstore("limits", "finalize")
			if err == nil || !strings.Contains(errOut, "2 replica(s) of an older release are live") {
				t.Fatalf("finalize beside two replicas of %s: %v %q %q", rev[:12], err, out, errOut)
			}
		}
		time.Sleep(time.Second)
	}
	// (The last replica of the release before leaves the census a
	// heartbeat TTL after it stopped: --wait rides that out.)
	f.finalize(t)
	t.Logf("finalized; every replica has it in force, blocks too")
	leased := f.leasedAdmissions(t, "roomy")
	// Three periods of the longer window: a dozen epochs of each, and
	// blocks of the roomy key's (four requests a second a replica, too
	// few to lease a 50 ms bucket, well under its limit) spent in
	// process.
	time.Sleep(9 * time.Second)
	small.judge(t)
	paced.judge(t)
	roomy.judge(t)
	if got := f.leasedAdmissions(t, "roomy") - leased; got == 0 {
		t.Fatal("no request of the roomy plan was spent from a block once blocks were in force")
	} else {
		t.Logf("%v requests of the roomy plan spent from blocks", got)
	}
}

// finalize runs 'petstore limits finalize --wait 15s' and waits until
// every replica has the marks in force: records finalized, blocks too.
func (f *fleet) finalize(t *testing.T) {
	t.Helper()
	if out := f.petstore("limits", "finalize", "--wait", "15s"); !strings.HasPrefix(out, "finalized at ") {
		t.Fatalf("finalize printed %q", out)
	}
	f.waitGauges(t, 10*time.Second, 1, "petstore_ratelimit_records_finalized", "petstore_ratelimit_blocks_in_force")
}

// waitGauges waits up to d until every replica reports value for each
// gauge.
func (f *fleet) waitGauges(t *testing.T, d time.Duration, value float64, gauges ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, r := range f.replicas {
		for _, gauge := range gauges {
			for {
				v, err := r.metric(gauge)
				if err == nil && v == value {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s is %v (%v) after %s, want %v", r.name, gauge, v, err, d, value)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// judged is a load on one plan's keys whose window is judged when it
// stops: by client send and receive times, no failed request and no
// interval of the period holding more than the limit.
type judged struct {
	plan   string
	limit  int
	period time.Duration
	load   *load
}

func (j *judged) judge(t *testing.T) {
	t.Helper()
	rs := j.load.stop()
	elapsed := time.Since(j.load.start)
	adm := judgeLoad(t, j.plan, rs, elapsed)
	judgeWindow(t, j.plan, adm, j.limit, j.period, elapsed)
}
