package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/config"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/cli with what the commands print now")

// transcript runs `petstore args...` through run and returns what a
// terminal shows, as main shows it: the command, the exit status, stdout
// and stderr.
func transcript(t *testing.T, env map[string]string, args ...string) (text, stdout, stderr string, status int) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	status = exitOK
	if err != nil {
		status = report(&errOut, err)
	}
	text = fmt.Sprintf("$ %s\nexit status %d\n-- stdout --\n%s-- stderr --\n%s", strings.Join(append([]string{"petstore"}, args...), " "), status, out.String(), errOut.String())
	return text, out.String(), errOut.String(), status
}

// golden compares got with testdata/cli/NAME.golden, or writes it there
// with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "cli", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run '%s' -update to write it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -run '%s' -update rewrites it)\ngot:\n%s\nwant:\n%s", path, t.Name(), got, want)
	}
}

// everyCommand lists the command tree depth first.
func everyCommand() []*command {
	var all []*command
	var walk func(*command)
	walk = func(c *command) {
		all = append(all, c)
		for _, s := range c.subs {
			walk(s)
		}
	}
	walk(commands())
	return all
}

// TestHelp: every command answers --help and -h on stdout with exit status
// 0, with its own usage line and exactly the flags it parses, and needs
// neither PostgreSQL nor Redis nor good settings to do it.
func TestHelp(t *testing.T) {
	t.Parallel()
	badEnv := map[string]string{
		"PETSTORE_DATABASE_URL":  "postgres://nobody@127.0.0.1:1/none",
		"PETSTORE_REDIS_ADDRS":   "127.0.0.1:1",
		"PETSTORE_REDIS_TIMEOUT": "soon",
		"PETSTORE_PLANS_FILE":    "/nonexistent/plans.yaml",
	}
	cfg := config.Default()
	all := config.Register(flag.NewFlagSet("", flag.ContinueOnError), &cfg).Settings()
	for _, cmd := range everyCommand() {
		t.Run(cmd.path(), func(t *testing.T) {
			t.Parallel()
			words := strings.Fields(cmd.name)
			text, out, errOut, status := transcript(t, badEnv, append(words, "--help")...)
			if status != exitOK || errOut != "" {
				t.Fatalf("--help: exit status %d, stderr %q", status, errOut)
			}
			golden(t, strings.Join(append([]string{"help"}, words...), "-"), text)
			for _, other := range [][]string{append(words, "-h"), append([]string{"help"}, words...)} {
				if _, o, e, s := transcript(t, badEnv, other...); o != out || e != "" || s != exitOK {
					t.Errorf("petstore %s: exit status %d, stderr %q, and stdout unlike --help's:\n%s", strings.Join(other, " "), s, e, o)
				}
			}
			usage := strings.SplitN(out, "\n", 2)[0]
			if !strings.HasPrefix(usage, "Usage: "+cmd.path()) {
				t.Errorf("usage line %q, want it to start with %q", usage, "Usage: "+cmd.path())
			}
			if len(words) > 0 && strings.Count(usage, " "+words[len(words)-1]+" ") > 1 {
				t.Errorf("usage line %q repeats the command", usage)
			}
			if cmd.setup == nil {
				for _, s := range cmd.subs {
					if !regexp.MustCompile(`(?m)^  ` + s.word() + ` +` + regexp.QuoteMeta(s.summary) + `$`).MatchString(out) {
						t.Errorf("no line for %s in:\n%s", s.word(), out)
					}
				}
				return
			}
			fs, _, _, _ := cmd.flags()
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(out, "\n  --"+f.Name+" ") && !strings.Contains(out, "\n  --"+f.Name+"\n") {
					t.Errorf("help does not list --%s", f.Name)
				}
			})
			for _, s := range all {
				if !slices.Contains(cmd.settings, s.Flag) && strings.Contains(out, "--"+s.Flag+" ") {
					t.Errorf("help lists --%s, which %s does not read", s.Flag, cmd.path())
				}
			}
		})
	}
}

// TestUsageErrors: a command that cannot run as given says why and where
// its help is, in two lines on stderr, and exits 2.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"no-command", nil, nil},
		{"unknown-command", []string{"frobnicate"}, nil},
		{"keys-no-command", []string{"keys"}, nil},
		{"keys-unknown-command", []string{"keys", "rotate"}, nil},
		{"keys-flag-before-command", []string{"keys", "--plan", "free"}, nil},
		{"limits-no-command", []string{"limits"}, nil},
		{"plans-unknown-command", []string{"plans", "simulcast"}, nil},
		{"help-unknown-command", []string{"help", "keys", "rotate"}, nil},
		{"serve-unknown-flag", []string{"serve", "--frobnicate"}, nil},
		{"serve-bad-value", []string{"serve", "--redis-timeout", "soon"}, nil},
		{"serve-bad-env", []string{"serve"}, map[string]string{"PETSTORE_RATELIMIT_PIPELINES": "0"}},
		{"serve-argument", []string{"serve", "now"}, nil},
		{"serve-postgres-without-url", []string{"serve", "--store", "postgres"}, nil},
		{"migrate-without-database", []string{"migrate"}, nil},
		{"keys-create-unknown-plan", []string{"keys", "create", "--plan", "gold"}, nil},
		{"keys-create-without-database", []string{"keys", "create", "--plan", "pro"}, nil},
		{"keys-create-no-plan", []string{"keys", "create", "--format", "csv"}, nil},
		{"keys-create-bad-quota", []string{"keys", "create", "--plan", "pro", "--quota", "100", "--format", "csv"}, nil},
		{"keys-create-bad-count", []string{"keys", "create", "--plan", "pro", "--count", "many"}, nil},
		{"keys-create-bad-format", []string{"keys", "create", "--plan", "pro", "--format", "xml"}, nil},
		{"keys-create-serve-flag", []string{"keys", "create", "--plan", "pro", "--addr", ":1"}, nil},
		{"keys-create-per-key-plan", []string{"keys", "create", "--plan", "enterprise", "--format", "csv"}, nil},
		{"keys-list-without-database", []string{"keys", "list"}, nil},
		{"keys-list-bad-format", []string{"keys", "list", "--format", "yaml"}, nil},
		{"keys-revoke-no-id", []string{"keys", "revoke"}, nil},
		{"keys-revoke-two-ids", []string{"keys", "revoke", "key_a", "key_b"}, nil},
		{"limits-show-no-id", []string{"limits", "show"}, nil},
		{"limits-show-without-redis", []string{"limits", "show", "key_x"}, nil},
		{"limits-show-bad-format", []string{"limits", "show", "key_x", "--format", "csv"}, nil},
		{"limits-unban-no-id", []string{"limits", "unban"}, nil},
		{"limits-reset-nothing", []string{"limits", "reset"}, nil},
		{"limits-reset-both", []string{"limits", "reset", "key_x", "--plan", "free"}, nil},
		{"limits-finalize-bad-wait", []string{"limits", "finalize", "--wait", "later"}, nil},
		{"limits-finalize-undo-and-status", []string{"limits", "finalize", "--undo", "--status"}, nil},
		{"plans-check-no-file", []string{"plans", "check"}, nil},
		{"plans-check-bad-format", []string{"plans", "check", "testdata/cli/plans.yaml", "--format", "yaml"}, nil},
		{"plans-show-argument", []string{"plans", "show", "plans.yaml"}, nil},
		{"plans-simulate-no-log", []string{"plans", "simulate"}, nil},
		{"plans-simulate-bad-top", []string{"plans", "simulate", "--access-log", "-", "--top", "-1"}, nil},
		{"version-argument", []string{"version", "now"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text, out, errOut, status := transcript(t, tt.env, tt.args...)
			golden(t, "usage-"+tt.name, text)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			if status != exitUsage || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "petstore: ") ||
				!regexp.MustCompile(`^Run 'petstore( [a-z]+)* --help' for usage\.$`).MatchString(lines[1]) {
				t.Errorf("want exit status 2, nothing on stdout and two lines on stderr, the second naming the help; got\n%s", text)
			}
		})
	}
}

// TestRuntimeErrors: a command that ran and failed exits 1 with its error
// on stderr, and no pointer to help.
func TestRuntimeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"plans-check-missing-file", []string{"plans", "check", "testdata/cli/missing.yaml"}, nil},
		{"plans-check-bad-limit", []string{"plans", "check", "testdata/cli/bad-limit.yaml"}, nil},
		{"plans-check-not-yaml", []string{"plans", "check", "testdata/cli/not-yaml.yaml"}, nil},
		{"keys-create-bad-plans-file", []string{"keys", "create", "--plan", "pro", "--format", "csv"}, map[string]string{"PETSTORE_PLANS_FILE": "testdata/cli/bad-limit.yaml"}},
		{"limits-show-unknown-key", []string{"limits", "show", "key_nosuchkey"}, map[string]string{"PETSTORE_REDIS_ADDRS": "127.0.0.1:1", "PETSTORE_KEYS_FILE": "testdata/cli/keys.yaml", "PETSTORE_PLANS_FILE": "testdata/cli/plans.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text, out, errOut, status := transcript(t, tt.env, tt.args...)
			golden(t, "error-"+tt.name, text)
			if status != exitError || out != "" || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "--help") {
				t.Errorf("want exit status 1 and one line on stderr; got\n%s", text)
			}
		})
	}
	// Not reaching the database is a failure, not a usage error.
	_, _, errOut, status := transcript(t, map[string]string{"PETSTORE_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=5"}, "keys", "list")
	if status != exitError || !strings.Contains(errOut, "127.0.0.1:1") {
		t.Errorf("keys list without a reachable database: exit status %d, stderr %q; want 1", status, errOut)
	}
}

// TestExitStatus runs the binary: main exits with run's status, 0 for
// help, 1 for a failure and 2 for a usage error.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"limits", "--help"}, exitOK},
		{[]string{"keys", "create", "-h"}, exitOK},
		{[]string{"plans", "check", "testdata/cli/missing.yaml"}, exitError},
		{[]string{"keys", "create", "--plan", "gold", "--format", "csv"}, exitUsage},
		{[]string{"limits"}, exitUsage},
	} {
		stdout, stderr, err := runProcess(t, nil, tt.args...)
		got := 0
		if exit, ok := err.(*exec.ExitError); ok {
			got = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		_, wantOut, wantErr, _ := transcript(t, nil, tt.args...)
		if got != tt.want || stdout != wantOut || stderr != wantErr {
			t.Errorf("petstore %s: exit status %d, want %d; stdout %q, stderr %q; run printed %q, %q", strings.Join(tt.args, " "), got, tt.want, stdout, stderr, wantOut, wantErr)
		}
	}
}

// The varying parts of an output: times, key ids.
var (
	timeRE  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	keyIDRE = regexp.MustCompile(`key_[0-9A-Za-z]{8,}`)
)

// aTime stands for every time in a golden file, as long as most.
const aTime = "2006-01-02T15:04:05Z"

// TestPlansCheckFormats: `plans check` in text and JSON, on good files
// and bad.
func TestPlansCheckFormats(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		args   []string
		status int
	}{
		{"plans-check-text", []string{"plans", "check", "testdata/cli/plans.yaml", "--keys", "testdata/cli/keys.yaml"}, exitOK},
		{"plans-check-json", []string{"plans", "check", "testdata/cli/plans.yaml", "--keys", "testdata/cli/keys.yaml", "--format", "json"}, exitOK},
		{"plans-check-json-plans-only", []string{"plans", "check", "--format", "json", "testdata/cli/plans.yaml"}, exitOK},
		{"plans-check-json-bad-limit", []string{"plans", "check", "testdata/cli/bad-limit.yaml", "--format", "json"}, exitError},
		{"plans-check-json-not-yaml", []string{"plans", "check", "testdata/cli/not-yaml.yaml", "--format", "json"}, exitError},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text, _, _, status := transcript(t, nil, tt.args...)
			golden(t, tt.name, text)
			if status != tt.status {
				t.Errorf("exit status %d, want %d", status, tt.status)
			}
		})
	}
}

// TestLimitsShowFormats: `limits show` of a key from the keys file, on a
// Redis of its own, in text and JSON.
func TestLimitsShowFormats(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	env := map[string]string{
		"PETSTORE_REDIS_ADDRS": m.Addr(),
		"PETSTORE_PLANS_FILE":  "testdata/cli/plans.yaml",
		"PETSTORE_KEYS_FILE":   "testdata/cli/keys.yaml",
	}
	tiny := apikey.IDFromHash(strings.Repeat("ab", 32))
	own := apikey.IDFromHash(strings.Repeat("cd", 32))
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"limits-show-text", []string{"limits", "show", tiny}},
		{"limits-show-json", []string{"limits", "show", tiny, "--format", "json"}},
		{"limits-show-json-own-quotas", []string{"limits", "show", "--format", "json", own}},
	} {
		text, _, errOut, status := transcript(t, env, tt.args...)
		if status != exitOK {
			t.Fatalf("%s: exit status %d: %s", tt.name, status, errOut)
		}
		golden(t, tt.name, timeRE.ReplaceAllString(text, aTime))
	}
}

// TestKeysListFormats: `keys list` in text and JSON, on a database of its
// own.
func TestKeysListFormats(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PETSTORE_DATABASE_URL": withSchema(t)}
	runOK(t, env, "migrate")
	runOK(t, env, "keys", "create", "--plan", "pro", "--label", "acme", "--quota", "5000/1m", "--candidate-quota", "200/1m")
	out := runOK(t, env, "keys", "create", "--plan", "free", "--label", "revoked", "--format", "csv")
	runOK(t, env, "keys", "revoke", strings.Split(strings.Split(out, "\n")[1], ",")[0])
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"keys-list-text", []string{"keys", "list"}},
		{"keys-list-json", []string{"keys", "list", "--format", "json"}},
	} {
		text, _, errOut, status := transcript(t, env, tt.args...)
		if status != exitOK {
			t.Fatalf("%s: exit status %d: %s", tt.name, status, errOut)
		}
		// Keys are listed oldest first, each created by a command of its own.
		text = keyIDRE.ReplaceAllStringFunc(timeRE.ReplaceAllString(text, aTime), func(id string) string { return "key_" + strings.Repeat("X", len(id)-4) })
		golden(t, tt.name, text)
	}
}
