package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/httpapi"
)

// asBinaryVar makes the test binary behave as the petstore binary, so that
// a test can run a command in a process of its own (see runProcess).
const asBinaryVar = "PETSTORE_TEST_RUN_AS_BINARY"

func TestMain(m *testing.M) {
	if os.Getenv(asBinaryVar) == "1" {
		main() // exits non-zero itself on failure
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runProcess runs `petstore args...` as a separate process with only env
// set, and returns its stdout, stderr and exit error.
func runProcess(t *testing.T, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = []string{asBinaryVar + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	return stdout.String(), stderr.String(), err
}

// staticKeyEnv returns a keys file holding one free key, so that requests
// reach the pet store whatever the key database's state, and the key.
func staticKeyEnv(t *testing.T, dbURL string) (map[string]string, string) {
	t.Helper()
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir() + "/keys.yaml"
	if err := os.WriteFile(keys, []byte("keys:\n  - {key: "+key+", plan: free, label: schema test}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"PETSTORE_DATABASE_URL": dbURL,
		"PETSTORE_STORE":        "postgres",
		"PETSTORE_KEYS_FILE":    keys,
	}, key
}

func readyz(t *testing.T, in *instance) (int, map[string]string) {
	t.Helper()
	resp, body := do(t, "GET", in.ops+"/readyz", "", "")
	var st map[string]string
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	return resp.StatusCode, st
}

// migrationsDir holds the migrations built into the binary.
const migrationsDir = "../../internal/postgres/migrations"

// neededVersion is the newest built-in migration's version: the schema
// version this release needs.
func neededVersion(t *testing.T) string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(migrationsDir, "[0-9][0-9][0-9][0-9]_*.sql"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations in %s: %v", migrationsDir, err)
	}
	slices.Sort(names)
	return filepath.Base(names[len(names)-1])[:4]
}

// metricLine returns the sample line of a metric without labels.
func metricLine(t *testing.T, in *instance, name string) string {
	t.Helper()
	_, body := do(t, "GET", in.ops+"/metrics", "", "")
	return regexp.MustCompile(`(?m)^` + name + ` .*$`).FindString(string(body))
}

// TestServeUnmigratedDatabase is the newcomer's mistake: serve on a
// database nobody migrated. The replica stays unready and says why, every
// request that needs the database is a 503 with Retry-After (never a 500),
// and once `petstore migrate` runs in another process the replica turns
// ready by itself within the check interval.
func TestServeUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	env, key := staticKeyEnv(t, dbURL)
	in := launch(t, env)

	code, st := readyz(t, in)
	if code != 503 || st["check"] != "database" {
		t.Fatalf("/readyz on an empty database: %d %v", code, st)
	}
	needed := neededVersion(t)
	for _, want := range []string{"version is none", "needs " + needed, "run `petstore migrate`"} {
		if !strings.Contains(st["message"], want) {
			t.Errorf("/readyz message %q lacks %q", st["message"], want)
		}
	}
	if !regexp.MustCompile(`"msg":"not ready","check":"database","reason":"database schema version is none[^"]*petstore migrate`).MatchString(in.stderr.String()) {
		t.Errorf("no start-up log line saying what to do:\n%s", in.stderr.String())
	}
	if got := metricLine(t, in, "petstore_db_schema_version"); got != "petstore_db_schema_version 0" {
		t.Errorf("schema version metric: %q", got)
	}
	if got := metricLine(t, in, "petstore_db_schema_version_needed"); got != "petstore_db_schema_version_needed "+strings.TrimLeft(needed, "0") {
		t.Errorf("needed schema version metric: %q", got)
	}
	unknownKey, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path, key, body string }{
		{"GET", "/v1/pets", key, ""},
		{"GET", "/v1/pets?status=sold", key, ""},
		{"POST", "/v1/pets", key, `{"name":"Rex","categoryId":1}`},
		{"GET", "/v1/pets/1", key, ""},
		{"GET", "/v1/pets", unknownKey, ""}, // looked up in the missing api_keys table
	} {
		resp, body := do(t, r.method, in.api+r.path, r.key, r.body)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"code":"unavailable"`) {
			t.Errorf("%s %s: %d Retry-After=%q %s, want 503 unavailable with Retry-After", r.method, r.path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if strings.Contains(in.stderr.String(), `"msg":"internal error"`) {
		t.Errorf("an internal error was logged:\n%s", in.stderr.String())
	}

	if out, errOut, err := runProcess(t, env, "migrate"); err != nil || !strings.Contains(out, "applied 0001_") {
		t.Fatalf("migrate in another process: %v\n%s%s", err, out, errOut)
	}
	migrated := time.Now()
	for {
		code, _ := readyz(t, in)
		if code == 200 {
			break
		}
		if time.Since(migrated) > httpapi.DefaultCheckInterval+5*time.Second {
			t.Fatalf("not ready %v after the migration (check interval %v):\n%s", time.Since(migrated), httpapi.DefaultCheckInterval, in.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("ready %v after the migration finished (check interval %v)", time.Since(migrated).Round(time.Millisecond), httpapi.DefaultCheckInterval)
	if !strings.Contains(in.stderr.String(), `"msg":"ready"`) {
		t.Errorf("no log line when the replica turned ready:\n%s", in.stderr.String())
	}
	if got := metricLine(t, in, "petstore_db_schema_version"); got != "petstore_db_schema_version "+strings.TrimLeft(needed, "0") {
		t.Errorf("schema version metric after migrating: %q", got)
	}
	resp, body := do(t, "POST", in.api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`)
	if resp.StatusCode != 201 {
		t.Fatalf("create after migrating: %d %s", resp.StatusCode, body)
	}
	if resp, body = do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 200 || !strings.Contains(string(body), `"name":"Rex"`) {
		t.Fatalf("list after migrating: %d %s", resp.StatusCode, body)
	}
}

// recordMigration records a migration this release does not have, as a
// newer release's `petstore migrate` would.
func recordMigration(t *testing.T, dbURL, version, name string, additive bool) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "INSERT INTO schema_migrations (version, name, additive) VALUES ($1, $2, $3)", version, name, additive); err != nil {
		t.Fatal(err)
	}
}

// TestServeNewerSchema is a rollback: the database carries a migration of a
// newer release. An additive one is served, with one warning; one that is
// not additive keeps the replica out, saying so.
func TestServeNewerSchema(t *testing.T) {
	t.Parallel()
	t.Run("additive", func(t *testing.T) {
		t.Parallel()
		dbURL := withSchema(t)
		env, key := staticKeyEnv(t, dbURL)
		runOK(t, env, "migrate")
		recordMigration(t, dbURL, "9001", "9001_add_pet_tags.sql", true)

		in := start(t, env)
		warning := regexp.MustCompile(`"level":"WARN","msg":"database schema is newer than this release[^\n]*"found":"9001","needed":"` + neededVersion(t) + `"[^\n]*9001_add_pet_tags.sql`)
		if !warning.MatchString(in.stderr.String()) {
			t.Fatalf("no warning naming the newer migration:\n%s", in.stderr.String())
		}
		if resp, body := do(t, "POST", in.api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`); resp.StatusCode != 201 {
			t.Fatalf("create on the newer schema: %d %s", resp.StatusCode, body)
		}
		if got := metricLine(t, in, "petstore_db_schema_version"); got != "petstore_db_schema_version 9001" {
			t.Errorf("schema version metric: %q", got)
		}
		// Once, not on every check.
		time.Sleep(httpapi.DefaultCheckInterval + time.Second)
		if n := len(warning.FindAllString(in.stderr.String(), -1)); n != 1 {
			t.Errorf("warned %d times, want once", n)
		}

		out, errOut, err := runProcess(t, env, "migrate", "--status")
		if err != nil || !regexp.MustCompile(`applied\s+9001_add_pet_tags.sql\s+\S+\s+newer than this release; additive`).MatchString(out) ||
			!strings.Contains(out, "this release can serve it") {
			t.Errorf("migrate --status on a newer additive schema: %v\n%s%s", err, out, errOut)
		}
	})
	t.Run("not additive", func(t *testing.T) {
		t.Parallel()
		dbURL := withSchema(t)
		env, _ := staticKeyEnv(t, dbURL)
		runOK(t, env, "migrate")
		recordMigration(t, dbURL, "9002", "9002_drop_pet_status.sql", false)

		in := launch(t, env)
		code, st := readyz(t, in)
		if code != 503 || !strings.Contains(st["message"], "9002_drop_pet_status.sql is not additive") {
			t.Fatalf("/readyz on a newer, non-additive schema: %d %v", code, st)
		}
		out, _, err := runProcess(t, env, "migrate", "--status")
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(out, "NOT additive") {
			t.Errorf("migrate --status: %v\n%s", err, out)
		}
	})
}

// TestMigrateStatus is the pipeline's check before a rollout: non-zero while
// migrations are pending, zero once applied.
func TestMigrateStatus(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PETSTORE_DATABASE_URL": withSchema(t)}
	out, errOut, err := runProcess(t, env, "migrate", "--status")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("migrate --status with pending migrations: %v, want a non-zero exit", err)
	}
	if !regexp.MustCompile(`(?m)^pending\s+0001_create_pets_idempotency_api_keys.sql`).MatchString(out) ||
		!strings.Contains(errOut, "run `petstore migrate`") {
		t.Errorf("pending: stdout\n%s\nstderr\n%s", out, errOut)
	}
	runOK(t, env, "migrate")
	out = runOK(t, env, "migrate", "--status")
	if !regexp.MustCompile(`(?m)^applied\s+0001_create_pets_idempotency_api_keys.sql\s+\d{4}-\d\d-\d\dT`).MatchString(out) ||
		!strings.Contains(out, "version "+neededVersion(t)+": up to date") || strings.Contains(out, "pending") {
		t.Errorf("applied:\n%s", out)
	}
}

// TestServeMigrate is the single-instance install: serve --migrate applies
// the schema before it listens, so it is ready at once; a restart finds
// nothing to do.
func TestServeMigrate(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	env, key := staticKeyEnv(t, dbURL)
	first := start(t, env, "--migrate")
	if !strings.Contains(first.stderr.String(), `"msg":"applied migrations","migrations":["0001_`) {
		t.Errorf("serve --migrate did not log the migrations it applied:\n%s", first.stderr.String())
	}
	if resp, body := do(t, "POST", first.api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`); resp.StatusCode != 201 {
		t.Errorf("create: %d %s", resp.StatusCode, body)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	again := start(t, env, "--migrate")
	if !strings.Contains(again.stderr.String(), `"msg":"database schema is up to date"`) {
		t.Errorf("second serve --migrate:\n%s", again.stderr.String())
	}
	if resp, body := do(t, "GET", again.api+"/v1/pets", key, ""); resp.StatusCode != 200 || !strings.Contains(string(body), "Rex") {
		t.Errorf("list: %d %s", resp.StatusCode, body)
	}
	if out := runOK(t, env, "migrate", "--status"); !strings.Contains(out, "up to date") {
		t.Errorf("migrate --status after serve --migrate:\n%s", out)
	}
}

// TestServeSchemaBeforeKeyCandidates is a rollout whose migration has not
// run yet: the database is as the release before 0002 left it, with a key
// that release stored. This release needs the candidate column to read
// keys, so it stays unready, naming the pending migration, and answers
// that key 503 with Retry-After (never 401, never 500). Once `petstore
// migrate` runs, it turns ready by itself and serves the key, which the
// migration gave no candidate of its own.
func TestServeSchemaBeforeKeyCandidates(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	const first, second = "0001_create_pets_idempotency_api_keys.sql", "0002_add_api_keys_candidate.sql"
	sql, err := os.ReadFile(filepath.Join(migrationsDir, first))
	if err != nil {
		t.Fatal(err)
	}
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	h := apikey.Hash(key)
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// What `petstore migrate` of the release before 0002 leaves, and a key
	// that release's `keys create` stored.
	for _, stmt := range []string{
		`CREATE TABLE schema_migrations (version text PRIMARY KEY, name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(), additive boolean NOT NULL DEFAULT true)`,
		string(sql),
		`INSERT INTO schema_migrations (version, name) VALUES ('0001', '` + first + `')`,
		`INSERT INTO api_keys (id, hash, label, plan, overrides) VALUES ('` + apikey.IDFromHash(h) + `', '` + h + `', 'old', 'free', '[]')`,
	} {
		if _, err := conn.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}

	env := map[string]string{"PETSTORE_DATABASE_URL": dbURL}
	in := launch(t, env)
	code, st := readyz(t, in)
	if code != 503 || st["check"] != "database" {
		t.Fatalf("/readyz on schema 0001: %d %v", code, st)
	}
	for _, want := range []string{"version is 0001", "needs " + neededVersion(t), second, "run `petstore migrate`"} {
		if !strings.Contains(st["message"], want) {
			t.Errorf("/readyz message %q lacks %q", st["message"], want)
		}
	}
	resp, body := do(t, "GET", in.api+"/v1/pets", key, "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Fatalf("a stored key before the migration: %d %s, want 503 unavailable with Retry-After", resp.StatusCode, body)
	}
	if strings.Contains(in.stderr.String(), `"msg":"internal error"`) {
		t.Errorf("an internal error was logged:\n%s", in.stderr.String())
	}

	out, errOut, err := runProcess(t, env, "migrate")
	if err != nil || !strings.Contains(out, "applied "+second) || strings.Contains(out, "applied "+first) {
		t.Fatalf("migrate in another process: %v\n%s%s", err, out, errOut)
	}
	migrated := time.Now()
	for {
		if code, _ := readyz(t, in); code == 200 {
			break
		}
		if time.Since(migrated) > httpapi.DefaultCheckInterval+5*time.Second {
			t.Fatalf("not ready %v after the migration:\n%s", time.Since(migrated), in.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, body := do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 200 {
		t.Fatalf("the stored key after the migration: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, "GET", in.api+"/v1/rate_limit", key, ""); resp.StatusCode != 200 || strings.Contains(string(body), "candidate") {
		t.Fatalf("GET /v1/rate_limit of a key stored before 0002: %d %s, want no candidate", resp.StatusCode, body)
	}
}
