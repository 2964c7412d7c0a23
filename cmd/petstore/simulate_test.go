package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/accesslog"
	"github.com/animal-store/petstore/internal/apikey"
)

// logged is one request as the access log records it.
type logged struct {
	at      time.Time     // when it reached the limiter
	dur     time.Duration // until its line was written
	key     string
	plan    string
	outcome string // "": the limiter was not asked
	shadow  bool
}

var simT0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// accessLog writes reqs as a replica does: one slog JSON line each, in
// the order the requests ended.
func accessLog(t testing.TB, reqs []logged) []byte {
	t.Helper()
	reqs = slices.Clone(reqs)
	slices.SortStableFunc(reqs, func(a, b logged) int { return a.at.Add(a.dur).Compare(b.at.Add(b.dur)) })
	var buf bytes.Buffer
	h := slog.NewJSONHandler(&buf, nil)
	for i, r := range reqs {
		rec := slog.NewRecord(r.at.Add(r.dur), slog.LevelInfo, "request", 0)
		rec.AddAttrs(slog.String("request_id", fmt.Sprintf("req-%d", i)), slog.String("method", "GET"), slog.String("route", "/v1/pets"),
			slog.String("path", "/v1/pets"), slog.Int("status", 200), slog.Float64("duration_ms", float64(r.dur.Microseconds())/1000),
			slog.Int("bytes", 2), slog.String("client_ip", "192.0.2.1"))
		if r.key != "" {
			rec.AddAttrs(slog.String("key_id", r.key), slog.String("plan", r.plan))
		}
		if r.outcome != "" {
			rec.AddAttrs(slog.String("ratelimit", r.outcome))
			if r.shadow {
				rec.AddAttrs(slog.Bool("ratelimit_shadow", true))
			}
		}
		if err := h.Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func writeFile(t testing.TB, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// simulateJSON runs plans simulate with --format json and decodes its
// report strictly: every field is documented in jsonSimulation.
func simulateJSON(t *testing.T, args ...string) jsonSimulation {
	t.Helper()
	out, err := runPlansCmd(t, nil, append([]string{"simulate", "--format", "json"}, args...)...)
	if err != nil {
		t.Fatalf("plans simulate %v: %v", args, err)
	}
	var rep jsonSimulation
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return rep
}

func planOf(t *testing.T, rep jsonSimulation, name string) jsonSimPlan {
	t.Helper()
	for _, p := range rep.Plans {
		if p.Plan == name {
			return p
		}
	}
	t.Fatalf("no plan %s in the report: %+v", name, rep.Plans)
	return jsonSimPlan{}
}

func keyOf(t *testing.T, p jsonSimPlan, key string) jsonSimKey {
	t.Helper()
	for _, k := range p.TopKeys {
		if k.KeyID == key {
			return k
		}
	}
	t.Fatalf("no key %s among plan %s's most affected: %+v", key, p.Plan, p.TopKeys)
	return jsonSimKey{}
}

// tinyPlans: 5 per 10 s; more than 3 refusals within a minute ban a key
// for 30 s.
const tinyPlans = `plans:
  tiny:
    quotas: [{limit: 5, period: 10s}]
    ban: {threshold: 3, within: 1m, duration: 30s, multiplier: 2, max: 1h, memory: 1h}
`

// knownTraffic is traffic whose fate under tinyPlans is known exactly.
func knownTraffic() []logged {
	ms := time.Millisecond
	var reqs []logged
	add := func(key string, at time.Duration, outcome string) {
		reqs = append(reqs, logged{at: simT0.Add(at), dur: time.Duration(len(reqs)%7) * ms, key: key, plan: "tiny", outcome: outcome})
	}
	// burst: 8 requests within one second, L+3: exactly 3 limited, no ban
	// (3 strikes are not more than the threshold).
	for i := range 8 {
		add("key_burst", time.Duration(i)*100*ms, "allowed")
	}
	// paced: 4 per 10 s for 5 minutes, under the limit: none refused.
	for i := range 120 {
		add("key_paced", time.Duration(i)*2500*ms, "allowed")
	}
	// keeps going: 5 admitted (0-2 s), limited at 2.5, 3 and 3.5 s, the 4th
	// refusal (4 s) begins a ban until 34 s; the requests meanwhile are
	// banned; at 34 s the ban is over and the window empty again: 5
	// admitted, then limited.
	for i := range 9 {
		add("key_flood", time.Duration(i)*500*ms, "limited")
	}
	for _, at := range []time.Duration{5, 10, 15, 20, 25, 30, 33} {
		add("key_flood", at*time.Second, "banned")
	}
	add("key_flood", 34*time.Second-time.Microsecond, "banned")
	// After it, strikes start over: banned requests were none, so the
	// next refusal is a first strike again, not a second ban.
	for i := range 5 {
		add("key_flood", 34*time.Second+time.Duration(i)*500*ms, "allowed")
	}
	add("key_flood", 37*time.Second, "limited")
	return reqs
}

// TestPlansSimulateKnownAnswers replays traffic whose fate is known: L+k
// requests in one window leave exactly k limited, paced ones none, and a
// key that keeps going is banned at the threshold for exactly the ban.
func TestPlansSimulateKnownAnswers(t *testing.T) {
	t.Parallel()
	logFile := writeFile(t, "access.log", accessLog(t, knownTraffic()))
	plansFile := writeFile(t, "plans.yaml", []byte(tinyPlans))
	rep := simulateJSON(t, "--access-log", logFile, "--plans", plansFile)

	tiny := planOf(t, rep, "tiny")
	if want := (jsonProposed{Allowed: 5 + 120 + 10, Limited: 3 + 4, Banned: 9, KeysLimited: 2, KeysBanned: 1, Bans: 1}); tiny.Proposed != want {
		t.Errorf("proposed %+v\nwant     %+v", tiny.Proposed, want)
	}
	if tiny.Requests != 8+120+23 || tiny.Keys != 3 || tiny.Unmatched != (jsonUnmatched{}) {
		t.Errorf("requests %d, keys %d, unmatched %+v", tiny.Requests, tiny.Keys, tiny.Unmatched)
	}
	burst, flood := keyOf(t, tiny, "key_burst"), keyOf(t, tiny, "key_flood")
	if want := (jsonProposed{Allowed: 5, Limited: 3, KeysLimited: 1}); burst.Proposed != want || burst.Peak != 1 {
		t.Errorf("key_burst: proposed %+v, peak %v; want %+v, peak 1", burst.Proposed, burst.Peak, want)
	}
	if want := (jsonProposed{Allowed: 10, Limited: 4, Banned: 9, KeysLimited: 1, KeysBanned: 1, Bans: 1}); flood.Proposed != want {
		t.Errorf("key_flood: proposed %+v, want %+v", flood.Proposed, want)
	}
	// Most affected first; the paced key was refused neither then nor now.
	if len(tiny.TopKeys) != 2 || tiny.TopKeys[0].KeyID != "key_flood" {
		t.Errorf("top keys %+v, want key_flood then key_burst", tiny.TopKeys)
	}
	// The paced key holds at most 4 of 5 in any window: its peak is 80%,
	// the others' 100%; nearest rank over 3 keys.
	if want := (jsonPeak{Keys: 3, P50: 1, P95: 1, P99: 1}); tiny.Peak != want {
		t.Errorf("peak %+v, want %+v", tiny.Peak, want)
	}
	if rep.Lines != (rep.AccessLogs[0].Lines) || rep.Lines.Replayable != 151 || rep.Lines.Malformed != 0 {
		t.Errorf("lines %+v", rep.Lines)
	}
	if rep.From != simT0.Format(time.RFC3339Nano) || rep.To != simT0.Add(297500*time.Millisecond).Format(time.RFC3339Nano) {
		t.Errorf("from %s to %s", rep.From, rep.To)
	}

	// At 10 per 10 s nothing is refused; the peaks are the most requests
	// of a key in 10 s: paced 4, burst 8, flood 10 (from 0 to 5 s).
	loose := writeFile(t, "loose.yaml", []byte(strings.Replace(tinyPlans, "limit: 5", "limit: 10", 1)))
	tiny = planOf(t, simulateJSON(t, "--access-log", logFile, "--plans", loose), "tiny")
	if want := (jsonPeak{Keys: 3, P50: 0.8, P95: 1, P99: 1}); tiny.Peak != want || tiny.Proposed.Allowed != tiny.Requests {
		t.Errorf("10 per 10 s: peak %+v, proposed %+v; want %+v, all allowed", tiny.Peak, tiny.Proposed, want)
	}
}

// TestPlansSimulateLoosened: a proposal that loosens a limit admits what
// was limited then, and says so against what the log recorded.
func TestPlansSimulateLoosened(t *testing.T) {
	t.Parallel()
	var reqs []logged
	for i := range 8 {
		outcome := "allowed"
		if i >= 5 {
			outcome = "limited"
		}
		reqs = append(reqs, logged{at: simT0.Add(time.Duration(i) * time.Second), dur: time.Millisecond, key: "key_a", plan: "tiny", outcome: outcome})
	}
	logFile := writeFile(t, "access.log", accessLog(t, reqs))
	for _, tt := range []struct {
		limit    string
		proposed jsonProposed
	}{
		{"5", jsonProposed{Allowed: 5, Limited: 3, KeysLimited: 1}},
		{"8", jsonProposed{Allowed: 8}},
	} {
		plans := writeFile(t, "plans.yaml", []byte(strings.Replace(tinyPlans, "limit: 5", "limit: "+tt.limit, 1)))
		p := planOf(t, simulateJSON(t, "--access-log", logFile, "--plans", plans), "tiny")
		if want := (jsonThen{Allowed: 5, Limited: 3, KeysLimited: 1}); p.Then != want {
			t.Errorf("limit %s: then %+v, want %+v", tt.limit, p.Then, want)
		}
		if p.Proposed != tt.proposed {
			t.Errorf("limit %s: proposed %+v, want %+v", tt.limit, p.Proposed, tt.proposed)
		}
	}
}

// TestPlansSimulateReplicaLogs: the logs of several replicas, each in the
// order its requests ended, plain and gzip, give the same report as one
// log of all the requests.
func TestPlansSimulateReplicaLogs(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var reqs []logged
	for i := range 3000 {
		// Durations up to 2 s: lines far out of the order of arrival.
		reqs = append(reqs, logged{at: simT0.Add(time.Duration(i) * 13 * time.Millisecond), dur: time.Duration(rng.IntN(2000)) * time.Millisecond,
			key: fmt.Sprint("key_", rng.IntN(4)), plan: "tiny", outcome: "allowed"})
	}
	plans := writeFile(t, "plans.yaml", []byte(tinyPlans))
	whole := simulateJSON(t, "--access-log", writeFile(t, "all.log", accessLog(t, reqs)), "--plans", plans)

	var parts [3][]logged
	for _, r := range reqs {
		i := rng.IntN(3)
		parts[i] = append(parts[i], r)
	}
	files := []string{
		writeFile(t, "a.log", accessLog(t, parts[0])),
		writeFile(t, "b.log", gzipBytes(t, accessLog(t, parts[1]))), // gzip, whatever its name
		writeFile(t, "c.log.gz", accessLog(t, parts[2])),            // plain, whatever its name
	}
	split := simulateJSON(t, "--access-log", files[0], "--access-log", files[1], "--access-log", files[2], "--plans", plans)
	if len(split.AccessLogs) != 3 || split.AccessLogs[1].Name != files[1] || split.AccessLogs[1].Lines.Replayable != int64(len(parts[1])) {
		t.Errorf("access logs %+v", split.AccessLogs)
	}
	whole.AccessLogs, split.AccessLogs = nil, nil
	if !reflect.DeepEqual(whole, split) {
		t.Errorf("three replicas' logs:\n%+v\none log:\n%+v", split, whole)
	}
	if p := planOf(t, whole, "tiny"); p.Proposed.Limited == 0 || p.Proposed.Banned == 0 {
		t.Errorf("the traffic meets no limit: %+v", p.Proposed)
	}
}

// TestPlansSimulateUnmatchedAndMalformed: lines that are not access lines
// are skipped, malformed ones counted; a plan the proposal removes and
// per-key plans without the key's quotas are reported, not fatal; keys'
// own quotas come from the keys file, by key id.
func TestPlansSimulateUnmatchedAndMalformed(t *testing.T) {
	t.Parallel()
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	withQuota := apikey.IDFromHash(apikey.Hash(key))
	keysFile := writeFile(t, "keys.yaml", []byte("keys:\n  - {key: "+key+", plan: enterprise, label: bigco, quotas: [{limit: 2, period: 1m}]}\n"))
	var reqs []logged
	for i := range 4 {
		at := simT0.Add(time.Duration(i) * time.Second)
		reqs = append(reqs,
			logged{at: at, key: withQuota, plan: "enterprise", outcome: "allowed"},
			logged{at: at, key: "key_noquota", plan: "enterprise", outcome: "allowed"},
			logged{at: at, key: "key_gone", plan: "pro", outcome: "allowed", shadow: true},
			logged{at: at, key: "key_free", plan: "free", outcome: "allowed"},
			logged{at: at}, // no valid key
			logged{at: at, key: "key_free", plan: "free"}, // GET /v1/rate_limit: not asked
		)
	}
	log := accessLog(t, reqs)
	log = append(log, "{\"time\":\"2026-11-23T09:00:00Z\",\"level\":\"WARN\",\"msg\":\"ratelimit: breaker open\"}\n"+
		"not json at all\n"+
		"{\"msg\":\"request\",\"ratelimit\":\"allowed\",\"key_id\":\"key_x\"}\n\n"...)
	plans := writeFile(t, "plans.yaml", []byte("plans:\n  pro: {remove: true}\n"))
	rep := simulateJSON(t, "--access-log", writeFile(t, "access.log", log), "--plans", plans, "--keys", keysFile)

	if want := (accesslog.Counts{Lines: 27, Replayable: 16, NotAsked: 8, Other: 1, Malformed: 2}); rep.Lines != want {
		t.Errorf("lines %+v, want %+v", rep.Lines, want)
	}
	ent := planOf(t, rep, "enterprise")
	if ent.Requests != 8 || ent.Keys != 2 || ent.Unmatched.Requests != 4 || ent.Unmatched.Keys != 1 || !strings.Contains(ent.Unmatched.Reason, "per key") {
		t.Errorf("enterprise: %+v", ent)
	}
	if want := (jsonProposed{Allowed: 2, Limited: 2, KeysLimited: 1}); ent.Proposed != want {
		t.Errorf("enterprise, the key's own 2/1m: proposed %+v, want %+v", ent.Proposed, want)
	}
	if k := keyOf(t, ent, withQuota); k.Label != "bigco" || k.Requests != 4 {
		t.Errorf("enterprise key %+v, want its label from the keys file", k)
	}
	pro := planOf(t, rep, "pro")
	if pro.Proposal != nil || pro.Unmatched != (jsonUnmatched{Requests: 4, Keys: 1, Reason: "removed by the proposed plans"}) ||
		pro.Then.Shadow != 4 || pro.Proposed != (jsonProposed{}) {
		t.Errorf("pro: %+v", pro)
	}
	if free := planOf(t, rep, "free"); free.Proposal == nil || free.Proposal.Source != "built-in" || free.Proposed.Allowed != 4 {
		t.Errorf("free: %+v", free)
	}
	if rep.Total.Requests != 16 || rep.Total.Unmatched.Requests != 8 || rep.Total.Keys != 4 {
		t.Errorf("total %+v", rep.Total)
	}

	// The same in text.
	out, err := runPlansCmd(t, nil, "simulate", "--access-log", writeFile(t, "access.log", log), "--plans", plans, "--keys", keysFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"16 requests of 4 keys, 2026-11-23T09:00:00Z to 2026-11-23T09:00:03Z, replayed against " + plans + " merged over the built-in plans, keys' own quotas from " + keysFile + ".\n",
		"Read 27 lines: 16 replayed, 8 not decided by the limiter, 1 other messages, 2 malformed.\n",
		"Plan pro, proposed: removed by the proposed plans\n  4 requests of 1 key; 4 decided in shadow mode then (not enforced); 4 requests of 1 key unmatched (removed by the proposed plans)\n",
		"Plan free, proposed: 60/1m, 1000/24h; ban: more than 20 refused in 1m",
		"  no key refused, then or under the proposal\n",
		"\nAll plans\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^  most affected keys:\n  KEY +LABEL +REQUESTS +THEN LIMITED +BANNED +PROPOSED LIMITED +BANNED +PEAK\n  ` + withQuota + ` +bigco +4 +0 +0 +2 +0 +100\.0%$`).MatchString(out) {
		t.Errorf("text report lacks the enterprise key's row:\n%s", out)
	}
}

// TestPlansSimulateAtTheEpoch: a log that begins at the Unix epoch is
// replayed (its day window's oldest buckets lie before zero); a line of a
// request that began before it is malformed, not a crash.
func TestPlansSimulateAtTheEpoch(t *testing.T) {
	t.Parallel()
	var reqs []logged
	for i := range 70 {
		reqs = append(reqs, logged{at: time.Unix(0, 0).Add(time.Duration(i) * 100 * time.Millisecond), key: "key_a", plan: "free", outcome: "allowed"})
	}
	log := accessLog(t, reqs)
	log = append(log, "{\"time\":\"1970-01-01T00:00:00.010Z\",\"msg\":\"request\",\"duration_ms\":20,\"key_id\":\"key_a\",\"plan\":\"free\",\"ratelimit\":\"allowed\"}\n"...)
	rep := simulateJSON(t, "--access-log", writeFile(t, "access.log", log))
	if want := (accesslog.Counts{Lines: 71, Replayable: 70, Malformed: 1}); rep.Lines != want {
		t.Errorf("lines %+v, want %+v", rep.Lines, want)
	}
	// The built-in free plan: 60 a minute.
	if free := planOf(t, rep, "free"); free.Proposed != (jsonProposed{Allowed: 60, Limited: 10, KeysLimited: 1}) {
		t.Errorf("free, 70 requests in 7 s: proposed %+v, want 60 allowed", free.Proposed)
	}
}

func TestPlansSimulateUsage(t *testing.T) {
	t.Parallel()
	logFile := writeFile(t, "access.log", accessLog(t, knownTraffic()))
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"simulate"}, "give at least one --access-log"},
		{[]string{"simulate", logFile}, "takes no arguments"},
		{[]string{"simulate", "--access-log", logFile, "--format", "yaml"}, `--format must be text or json, got "yaml"`},
		{[]string{"simulate", "--access-log", logFile, "--top", "-1"}, "--top must not be negative"},
		{[]string{"simulate", "--access-log", "-", "--access-log", "-"}, "standard input (-) given twice"},
		{[]string{"simulate", "--access-log", logFile, "--access-log", filepath.Join(t.TempDir(), "missing.log")}, "missing.log: open"},
		{[]string{"simulate", "--access-log", logFile, "--plans", writeFile(t, "bad.yaml", []byte("plans:\n  tiny: {}\n"))}, "plans.tiny.quotas (line 2)"},
		{[]string{"simulate", "--access-log", logFile, "--keys", writeFile(t, "keys.yaml", []byte("keys:\n  - {sha256: abc, plan: free}\n"))}, "keys[0].sha256 (line 2)"},
		{[]string{"simulate", "--access-log", writeFile(t, "other.log", []byte("{\"msg\":\"listening\"}\nnot json\n{\"msg\":\"request\",\"status\":401}\n"))},
			"nothing to replay: no line of " + "%s is an access line with a rate-limit decision (3 lines: 1 malformed, 1 other messages, 1 not decided by the limiter)"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			want := tt.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, tt.args[len(tt.args)-1])
			}
			if _, err := runPlansCmd(t, nil, tt.args...); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v, want one containing %q", err, want)
			}
		})
	}
}

// TestPlansSimulateHelp: the help says what is replayed and how peak
// window use is defined.
func TestPlansSimulateHelp(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"plans", "simulate", "--help"}, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"Usage: petstore plans simulate --access-log FILE...", "--top N", "its time less its duration_ms",
		"the highest share of its limit (used/limit) that any of\nits windows reached just after one of its admissions"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}

// runWithStdin runs the binary with stdin as its standard input.
func runWithStdin(t *testing.T, stdin []byte, args ...string) (string, string, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), exe, args...)
	cmd.Env = []string{asBinaryVar + "=1", "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestPlansSimulateStdinAndExitStatus runs the binary: a gzip log on
// standard input beside a plain file, a note of malformed lines on
// stderr; exit status 1 and the reason when there is nothing to replay.
func TestPlansSimulateStdinAndExitStatus(t *testing.T) {
	t.Parallel()
	reqs := knownTraffic()
	plans := writeFile(t, "plans.yaml", []byte(tinyPlans))
	want := simulateJSON(t, "--access-log", writeFile(t, "all.log", accessLog(t, reqs)), "--plans", plans)

	half := writeFile(t, "half.log", append(accessLog(t, reqs[:len(reqs)/2]), "garbage\n"...))
	stdout, stderr, err := runWithStdin(t, gzipBytes(t, accessLog(t, reqs[len(reqs)/2:])),
		"plans", "simulate", "--access-log", half, "--access-log", "-", "--plans", plans, "--format", "json")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if stderr != "petstore: plans simulate: 1 malformed lines skipped\n" {
		t.Errorf("stderr %q", stderr)
	}
	var got jsonSimulation
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.AccessLogs[1].Name != "-" || got.Lines.Malformed != 1 {
		t.Errorf("access logs %+v, lines %+v", got.AccessLogs, got.Lines)
	}
	got.AccessLogs, got.Lines, want.AccessLogs, want.Lines = nil, accesslog.Counts{}, nil, accesslog.Counts{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("a file and standard input:\n%+v\none file:\n%+v", got, want)
	}

	_, stderr, err = runWithStdin(t, []byte("{\"msg\":\"listening\"}\n"), "plans", "simulate", "--access-log", "-")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.HasPrefix(stderr, "petstore: nothing to replay: no line of - is an access line") {
		t.Fatalf("no access line: %v, stderr %q; want exit status 1 and the reason", err, stderr)
	}
}

// TestPlansSimulateReplaysTheServiceLog replays the access log of a real
// `petstore serve` (limits in the process: the limiter's own algorithm,
// deciding every request as the shared store would) against the plans it
// ran with: the replay must decide every request as the service did. A
// looser plan then admits what was refused.
func TestPlansSimulateReplaysTheServiceLog(t *testing.T) {
	t.Parallel()
	k1, _ := apikey.Generate()
	k2, _ := apikey.Generate()
	keysFile := writeFile(t, "keys.yaml", []byte("keys:\n  - {key: "+k1+", plan: tiny}\n  - {key: "+k2+", plan: free}\n"))
	plansFile := writeFile(t, "plans.yaml", []byte(tinyPlans))
	in := start(t, nil, "--plans-file", plansFile, "--keys-file", keysFile)
	statuses := map[int]int{}
	for range 15 {
		resp, _ := do(t, "GET", in.api+"/v1/pets", k1, "")
		statuses[resp.StatusCode]++
	}
	do(t, "GET", in.api+"/v1/rate_limit", k1, "") // not decided by the limiter
	do(t, "GET", in.api+"/v1/pets", "", "")       // no key
	for range 3 {
		do(t, "GET", in.api+"/v1/pets", k2, "")
	}
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if statuses[200] != 5 || statuses[429] != 10 {
		t.Fatalf("statuses %v, want 5 200s and 10 429s", statuses)
	}
	logFile := writeFile(t, "access.log", []byte(in.stderr.String()))

	rep := simulateJSON(t, "--access-log", logFile, "--plans", plansFile, "--keys", keysFile)
	if rep.Lines.Replayable != 18 || rep.Lines.NotAsked != 2 || rep.Lines.Malformed != 0 || rep.Lines.Other == 0 {
		t.Errorf("lines %+v, want 18 replayed, 2 not decided by the limiter, the start-up lines as others", rep.Lines)
	}
	tiny := planOf(t, rep, "tiny")
	// 5 admitted, 3 limited, the 4th refusal bans: 7 banned.
	if want := (jsonThen{Allowed: 5, Limited: 3, Banned: 7, KeysLimited: 1, KeysBanned: 1}); tiny.Then != want {
		t.Errorf("then %+v, want %+v", tiny.Then, want)
	}
	for _, p := range rep.Plans {
		o := p.Then
		if want := (jsonProposed{Allowed: o.Allowed, Limited: o.Limited, Banned: o.Banned, KeysLimited: o.KeysLimited, KeysBanned: o.KeysBanned, Bans: min(o.KeysBanned, 1)}); p.Proposed != want {
			t.Errorf("plan %s: the replay decided %+v, the service %+v", p.Plan, p.Proposed, o)
		}
	}

	loose := writeFile(t, "loose.yaml", []byte(strings.Replace(tinyPlans, "limit: 5", "limit: 20", 1)))
	tiny = planOf(t, simulateJSON(t, "--access-log", logFile, "--plans", loose, "--keys", keysFile), "tiny")
	if want := (jsonProposed{Allowed: 15}); tiny.Proposed != want {
		t.Errorf("20 per 10 s: proposed %+v, want %+v", tiny.Proposed, want)
	}
}

// benchTraffic is a replica fleet's access log: n requests of keys on the
// built-in plans over an hour, a few keys far over their quotas (limited,
// then banned), and a line in twenty that the limiter did not decide.
func benchTraffic(n, replicas int) [][]logged {
	rng := rand.New(rand.NewPCG(7, 8))
	const keys = 5000
	plans := []string{"free", "free", "free", "pro", "business"}
	out := make([][]logged, replicas)
	step := time.Hour / time.Duration(n)
	for i := range n {
		var k int
		if rng.IntN(4) == 0 {
			k = rng.IntN(20) // the busy few: a quarter of the traffic
		} else {
			k = rng.IntN(keys)
		}
		r := logged{at: simT0.Add(time.Duration(i) * step), dur: time.Duration(rng.IntN(5000)) * time.Microsecond,
			key: fmt.Sprintf("key_%016x", k*7919), plan: plans[k%len(plans)], outcome: "allowed"}
		switch rng.IntN(20) {
		case 0:
			r.outcome = ""
		case 1:
			r.outcome = "limited"
		}
		j := rng.IntN(replicas)
		out[j] = append(out[j], r)
	}
	return out
}

// BenchmarkSimulate runs `petstore plans simulate` end to end (read,
// parse, group and sort, replay, report) on the access logs of three
// replicas, plain and gzip, against a plans file that tightens free, and
// reports log lines per second.
func BenchmarkSimulate(b *testing.B) {
	const lines = 600_000
	parts := benchTraffic(lines, 3)
	dir := b.TempDir()
	plans := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(plans, []byte("plans:\n  free: {quotas: [{limit: 30, period: 1m}, {limit: 500, period: 24h}]}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	for _, compressed := range []bool{false, true} {
		args := []string{"plans", "simulate", "--plans", plans}
		var size int64
		for i, p := range parts {
			data := accessLog(b, p)
			if compressed {
				data = gzipBytes(b, data)
			}
			name := filepath.Join(dir, fmt.Sprintf("replica-%d-%v.log", i, compressed))
			if err := os.WriteFile(name, data, 0o600); err != nil {
				b.Fatal(err)
			}
			size += int64(len(data))
			args = append(args, "--access-log", name)
		}
		b.Run(map[bool]string{false: "plain", true: "gzip"}[compressed], func(b *testing.B) {
			b.SetBytes(size)
			cpu0 := processCPU(b)
			for b.Loop() {
				if err := run(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
			// Wall time depends on what else the machine runs; the CPU
			// time the process spent (all goroutines) much less so.
			b.ReportMetric(float64(lines)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(lines)/float64(b.N), "cpu-ns/line")
		})
	}
}
