package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
)

// runPlansCmd runs `petstore plans args...` in this process.
func runPlansCmd(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"plans"}, args...), func(k string) string { return env[k] }, &out, &errOut)
	return out.String(), err
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const checkedPlans = `plans:
  gold:
    quotas:
      - {limit: 100, period: 1m}
  pro: {ban: off}
`

// TestPlansCheckBadFiles gives `plans check` every kind of bad file; each
// error must name the file, the line and the field, and be the very error
// a replica's reload reports for the same files.
func TestPlansCheckBadFiles(t *testing.T) {
	t.Parallel()
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		plans string
		keys  string   // a keys file to check too, if not empty
		want  []string // in the error besides the file's path: the field and its line
	}{
		{"YAML syntax error", "plans:\n  gold:\n    quotas: [{limit: 1, period: 1m}]\n  pro: ban: off\n", "",
			[]string{"plans.pro (line 4, column 11): not YAML: mapping values are not allowed"}},
		{"unknown field", "plans:\n  gold:\n    quotas: [{limit: 1, period: 1m}]\n    burst: 5\n", "",
			[]string{"plans.gold.burst (line 4): unknown field"}},
		{"unknown plan referenced by a key", checkedPlans, "keys:\n  - key: " + key + "\n    plan: silver\n",
			[]string{`keys[0].plan (line 3): unknown plan "silver"`, "gold"}},
		{"bad candidate quotas on keys", checkedPlans, "keys:\n  - key: " + key + "\n    plan: gold\n    candidate:\n      quotas:\n        - {limit: 0, period: 1m}\n" +
			"  - sha256: " + strings.Repeat("ab", 32) + "\n    plan: pro\n    candidate: {quotas: [{limit: 5, period: 24h}, {limit: 6, period: 1d}]}\n",
			[]string{"keys[0].candidate.quotas[0].limit (line 6): must be from 1 to 1000000000, got 0", "keys[1].candidate.quotas[1].period (line 9): 24h is also the period of candidate.quotas[0]"}},
		{"bad period", "plans:\n  gold:\n    quotas:\n      - {limit: 1, period: 1mo}\n", "",
			[]string{`plans.gold.quotas[0].period (line 4): period "1mo": want a duration`}},
		{"limit 0", "plans:\n  gold:\n    quotas:\n      - limit: 0\n        period: 1m\n", "",
			[]string{"plans.gold.quotas[0].limit (line 4): must be from 1 to 1000000000, got 0"}},
		{"limit above the maximum", "plans:\n  gold:\n    quotas:\n      - period: 1m\n        limit: 5000000000\n", "",
			[]string{"plans.gold.quotas[0].limit (line 5): must be from 1 to 1000000000, got 5000000000"}},
		{"duplicate plan", "plans:\n  gold: {quotas: [{limit: 1, period: 1m}]}\n  silver: {quotas: [{limit: 1, period: 1m}]}\n  gold: {quotas: [{limit: 2, period: 1m}]}\n", "",
			[]string{"plans.gold (line 4): defined twice (first at line 2)"}},
		{"duplicate plan in another case", "plans:\n  gold: {quotas: [{limit: 1, period: 1m}]}\n  GOLD: {quotas: [{limit: 2, period: 1m}]}\n", "",
			[]string{`plans.gold (line 2): plan "gold" is already defined as "GOLD"`}},
		{"duplicate window period", "plans:\n  gold:\n    quotas:\n      - {limit: 1, period: 1h}\n      - {limit: 2, period: 60m}\n", "",
			[]string{"plans.gold.quotas[1].period (line 5): 1h is also the period of plans.gold.quotas[0]"}},
		{"bad ban policy", "plans:\n  gold:\n    quotas: [{limit: 1, period: 1m}]\n    ban:\n      threshold: 10\n      within: 1m\n      duration: 1h\n      max: 10m\n", "",
			[]string{"plans.gold.ban.max (line 8): 10m is shorter than duration 1h"}},
		{"ban without threshold", "plans:\n  gold:\n    quotas: [{limit: 1, period: 1m}]\n    ban: {within: 1m, duration: 1m}\n", "",
			[]string{"plans.gold.ban.threshold (line 4): required (or write ban: off)"}},
		{"empty file", "", "",
			[]string{`plans (line 1): required, and the file is empty; write "plans: {}"`}},
		{"a second YAML document", checkedPlans + "---\nplans: {}\n", "",
			[]string{"plans (line 7): in a second YAML document, which starts on line 6: a plans file holds a single YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A replica that started on good files, and sees them change.
			dir := t.TempDir()
			plansFile, keysFile := filepath.Join(dir, "plans.yaml"), ""
			write := func(path, content string) {
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write(plansFile, checkedPlans)
			args := []string{"check", plansFile}
			named := plansFile
			if tt.keys != "" {
				keysFile = filepath.Join(dir, "keys.yaml")
				write(keysFile, "keys: []\n")
				args = append(args, "--keys", keysFile)
				named = keysFile
			}
			w, err := apikey.NewWatcher(apikey.WatcherOptions{PlansFile: plansFile, KeysFile: keysFile,
				Apply: func(*plan.Set, *apikey.StaticKeys) error { return nil }})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			write(plansFile, tt.plans)
			if keysFile != "" {
				write(keysFile, tt.keys)
			}
			_, reloadErr := w.Check()

			out, err := runPlansCmd(t, nil, args...)
			if err == nil {
				t.Fatalf("plans check succeeded: %q", out)
			}
			if out != "" {
				t.Errorf("printed %q on error", out)
			}
			for _, want := range append([]string{named + ": "}, tt.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error = %q\nwant it to contain %q", err, want)
				}
			}
			if strings.Contains(err.Error(), key) {
				t.Errorf("the error quotes a key: %v", err)
			}
			if reloadErr == nil || reloadErr.Error() != err.Error() {
				t.Errorf("plans check reports %v\na reload reports   %v", err, reloadErr)
			}
		})
	}
}

func TestPlansCheckUsage(t *testing.T) {
	t.Parallel()
	good := writeTemp(t, "plans.yaml", checkedPlans)
	tests := []struct {
		args  []string
		want  string
		usage bool // a usage error (exit status 2), not a failed check
	}{
		{[]string{"check"}, "plans check needs one plans FILE, got 0 arguments", true},
		{[]string{"check", good, good}, "plans check needs one plans FILE, got 2 arguments", true},
		{[]string{"check", filepath.Join(t.TempDir(), "missing.yaml")}, "plans file: open", false},
		{[]string{"check", good, "--keys", filepath.Join(t.TempDir(), "missing.yaml")}, "keys file: open", false},
		{[]string{"check", "--frobnicate", good}, "unknown flag --frobnicate", true},
		{[]string{"check", good, "--format", "yaml"}, `--format must be text or json, got "yaml"`, true},
		{[]string{"show", "--format", "xml"}, `--format must be text, yaml or json, got "xml"`, true},
		{[]string{"show", good}, "takes no arguments", true},
		{[]string{"simulcast"}, `unknown plans command "simulcast"`, true},
		{nil, "plans needs a command: check, show or simulate", true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			_, err := runPlansCmd(t, nil, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if _, usage := errors.AsType[*usageError](err); usage != tt.usage {
				t.Errorf("usage error: %v, want %v", usage, tt.usage)
			}
		})
	}
}

// TestPlansCheckExitStatus runs the binary: 0 and a summary for good
// files, 1 and the error on stderr for bad ones.
func TestPlansCheckExitStatus(t *testing.T) {
	t.Parallel()
	k1, _ := apikey.Generate()
	k2, _ := apikey.Generate()
	plansFile := writeTemp(t, "plans.yaml", checkedPlans)
	keysFile := writeTemp(t, "keys.yaml", "keys:\n  - {key: "+k1+", plan: gold}\n  - {key: "+k2+", plan: pro, label: acme}\n")

	// Flags may come after the file.
	stdout, stderr, err := runProcess(t, nil, "plans", "check", plansFile, "--keys", keysFile)
	if err != nil || stdout != "6 plans, 2 keys: ok\n" {
		t.Fatalf("good files: %v, stdout %q, stderr %q; want exit 0 and \"6 plans, 2 keys: ok\"", err, stdout, stderr)
	}
	stdout, _, err = runProcess(t, nil, "plans", "check", plansFile)
	if err != nil || stdout != "6 plans, 0 keys: ok\n" {
		t.Fatalf("plans file alone: %v, stdout %q", err, stdout)
	}

	bad := writeTemp(t, "bad.yaml", "plans:\n  gold:\n    quotas: [{limit: 0, period: 1m}]\n")
	stdout, stderr, err = runProcess(t, nil, "plans", "check", bad)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("bad file: %v, want exit status 1", err)
	}
	if want := "petstore: plans file " + bad + ": plans.gold.quotas[0].limit (line 3): must be from 1 to 1000000000, got 0\n"; stderr != want || stdout != "" {
		t.Fatalf("bad file: stdout %q, stderr %q; want stderr %q", stdout, stderr, want)
	}
}

const shownPlansFile = `plans:
  free:
    quotas: [{limit: 30, period: 1m}]
  business: {remove: true}
  gold:
    mode: shadow
    quotas: [{limit: 5, period: 10s}, {limit: 100, period: 1h}]
    candidate:
      quotas: [{limit: 80, period: 1h}, {limit: 4, period: 10s}]
      ban: {threshold: 2, within: 10s, duration: 1m, multiplier: 2, max: 10m, memory: 1h}
    ban: {threshold: 7, within: 30s, duration: 2m, multiplier: 3, max: 1h, memory: 7d}
  partner:
    per_key: true
    quotas: []
    ban: off
`

func TestPlansShowText(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "plans.yaml", shownPlansFile)
	out, err := runPlansCmd(t, nil, "show", "--plans", file)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		// Columns are two spaces apart at least.
		var cols []string
		for _, c := range strings.Split(line, "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
		rows[cols[0]] = cols[1:]
	}
	want := map[string][]string{
		"enterprise": {"built-in", "enforce", "per key", "-", "more than 500 refused in 1m: 1m, x2 per repeat up to 15m (repeats remembered 24h)"},
		"free":       {"file over built-in", "enforce", "30/1m", "-", "more than 20 refused in 1m: 1m, x2 per repeat up to 1h (repeats remembered 24h)"},
		"gold":       {"file", "shadow", "5/10s, 100/1h", "4/10s, 80/1h; ban more than 2 refused in 10s: 1m, x2 per repeat up to 10m (repeats remembered 1h)", "more than 7 refused in 30s: 2m, x3 per repeat up to 1h (repeats remembered 168h)"},
		"loadtest":   {"built-in", "enforce", "60000/1m, 10000000/24h", "-", "more than 20000 refused in 1m: 1m, x2 per repeat up to 1h (repeats remembered 24h)"},
		"partner":    {"file", "enforce", "per key", "-", "off"},
		"pro":        {"built-in", "enforce", "300/1m, 10000/24h", "-", "more than 100 refused in 1m: 1m, x2 per repeat up to 1h (repeats remembered 24h)"},
		"business":   {"removed by file", "-", "-", "-", "-"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("plans show:\n%s\ngot rows  %q\nwant rows %q", out, rows, want)
	}
	if !strings.HasPrefix(out, "PLAN ") {
		t.Errorf("no header: %q", out)
	}
}

// TestPlansShowYAMLIsThePlans checks that the YAML output is a plans file
// meaning exactly the plans in force, whatever the built-in values.
func TestPlansShowYAMLIsThePlans(t *testing.T) {
	t.Parallel()
	for name, file := range map[string]string{
		"built-in plans": "",
		"every field":    writeTemp(t, "plans.yaml", shownPlansFile),
		"example":        "../../internal/plan/testdata/plans.yaml",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := runPlansCmd(t, nil, "show", "--plans", file, "--format", "yaml")
			if err != nil {
				t.Fatal(err)
			}
			want, err := plan.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := plan.Parse([]byte(out))
			if err != nil {
				t.Fatalf("the output is not a plans file: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(got.Names(), want.Names()) || !reflect.DeepEqual(got.Removed(), want.Removed()) {
				t.Fatalf("plans %v removed %v, want %v removed %v", got.Names(), got.Removed(), want.Names(), want.Removed())
			}
			for _, name := range want.Names() {
				g, _ := got.Lookup(name)
				w, _ := want.Lookup(name)
				if len(g.Windows) == 0 && len(w.Windows) == 0 {
					g.Windows, w.Windows = nil, nil // none either way
				}
				// A candidate's quotas in any order are the same candidate.
				g.Candidate, w.Candidate = byPeriod(g.Candidate), byPeriod(w.Candidate)
				if !reflect.DeepEqual(g, w) {
					t.Errorf("plan %s reads back as %+v, want %+v", name, g, w)
				}
				// Every field is stated.
				if !got.FromFile(name) {
					t.Errorf("plan %s is not stated in the output", name)
				}
			}
		})
	}
	out, err := runPlansCmd(t, nil, "show", "--plans", writeTemp(t, "plans.yaml", shownPlansFile), "--format", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  free: # file over built-in\n", "  gold: # file\n", "  pro: # built-in\n", "  business: {remove: true} # removed by file\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("YAML output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlansShowJSON(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "plans.yaml", shownPlansFile)
	// The file comes from the environment, as in a replica's container.
	out, err := runPlansCmd(t, map[string]string{"PETSTORE_PLANS_FILE": file}, "show", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got jsonPlans
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got.PlansFile != file || !reflect.DeepEqual(got.Removed, []string{"business"}) || len(got.Plans) != 6 {
		t.Fatalf("plans_file %q, removed %v, %d plans; want %q, [business], 6", got.PlansFile, got.Removed, len(got.Plans), file)
	}
	byName := map[string]jsonPlan{}
	for _, p := range got.Plans {
		byName[p.Name] = p
	}
	wantGold := jsonPlan{Name: "gold", Source: "file", FromFile: true, Mode: "shadow", Quotas: []jsonQuota{{5, "10s", 10}, {100, "1h", 3600}},
		Candidate:    []jsonQuota{{4, "10s", 10}, {80, "1h", 3600}},
		CandidateBan: &jsonBan{Threshold: 2, WithinSeconds: 10, DurationSeconds: 60, Multiplier: 2, MaxSeconds: 600, MemorySeconds: 3600},
		Ban:          &jsonBan{Threshold: 7, WithinSeconds: 30, DurationSeconds: 120, Multiplier: 3, MaxSeconds: 3600, MemorySeconds: 7 * 86400}}
	if !reflect.DeepEqual(byName["gold"], wantGold) {
		t.Errorf("gold = %+v, want %+v", byName["gold"], wantGold)
	}
	if p := byName["partner"]; p.Ban != nil || !p.PerKey || len(p.Quotas) != 0 || p.Quotas == nil {
		t.Errorf("partner = %+v, want per key, no quotas ([]), no ban (null)", p)
	}
	if p := byName["pro"]; p.FromFile || p.Source != "built-in" || p.Candidate == nil || len(p.Candidate) != 0 {
		t.Errorf("pro = %+v, want built-in, without a candidate ([])", p)
	}
	if p := byName["free"]; !p.FromFile || p.Source != "file over built-in" {
		t.Errorf("free = %+v, want from the file over the built-in plan", p)
	}

	// No file: the built-in plans, none from a file.
	out, err = runPlansCmd(t, nil, "show", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	got = jsonPlans{}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.PlansFile != "" || len(got.Plans) != len(plan.Defaults().Names()) || len(got.Removed) != 0 {
		t.Fatalf("built-in plans: %+v", got)
	}
	for _, p := range got.Plans {
		if p.FromFile {
			t.Errorf("built-in plan %s marked as from a file", p.Name)
		}
	}
}

func TestPlansShowBadFile(t *testing.T) {
	t.Parallel()
	bad := writeTemp(t, "plans.yaml", "plans:\n  gold: {}\n")
	_, err := runPlansCmd(t, nil, "show", "--plans", bad)
	if err == nil || !strings.Contains(err.Error(), "plans file "+bad+": plans.gold.quotas (line 2)") {
		t.Fatalf("error %v, want it to name the file, field and line", err)
	}
}
