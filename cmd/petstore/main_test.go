package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/animal-store/petstore/internal/config"
	"github.com/animal-store/petstore/internal/testenv"
)

// instance is one running `petstore serve`.
type instance struct {
	api, ops string
	stdout   *testenv.Buffer
	stderr   *testenv.Buffer
	stop     func() error
}

// start runs `petstore serve` with args on free loopback ports and waits
// until /readyz answers 200.
func start(t *testing.T, env map[string]string, args ...string) *instance {
	t.Helper()
	in := launch(t, env, args...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(in.ops + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return in
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v\n%s", err, in.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// launch runs `petstore serve` with args on free loopback ports and returns
// once it listens, ready or not.
func launch(t *testing.T, env map[string]string, args ...string) *instance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}}
	all := append([]string{"serve", "--addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0", "--drain-delay", "0", "--log-level", "debug"}, args...)
	done := make(chan error, 1)
	go func() { done <- run(ctx, all, func(k string) string { return env[k] }, in.stdout, in.stderr) }()
	var once sync.Once
	var stopErr error
	in.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				stopErr = fmt.Errorf("serve did not stop within 30s")
			}
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := in.stop(); err != nil {
			t.Errorf("serve: %v\nlogs:\n%s", err, in.stderr.String())
		}
	})

	listening := regexp.MustCompile(`"msg":"listening","api":"([^"]+)","ops":"([^"]+)"`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := listening.FindStringSubmatch(in.stderr.String()); m != nil {
			in.api, in.ops = "http://"+m[1], "http://"+m[2]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited early: %v\nlogs:\n%s", err, in.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", in.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return in
}

func do(t *testing.T, method, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// quotaBody is the part of GET /v1/rate_limit's body the tests read.
type quotaBody struct {
	Plan    string
	Windows []struct{ Used, Remaining int64 }
	Ban     struct {
		Banned bool
		Until  int64
	}
}

// rateLimit asks GET /v1/rate_limit with key and decodes a 200.
func rateLimit(t *testing.T, in *instance, key string) quotaBody {
	t.Helper()
	resp, body := do(t, "GET", in.api+"/v1/rate_limit", key, "")
	var q quotaBody
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/rate_limit: %d %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &q); err != nil {
		t.Fatalf("GET /v1/rate_limit body %s: %v", body, err)
	}
	return q
}

var devKeyRE = regexp.MustCompile(`(?m)^  (pst_[0-9A-Za-z]+)$`)

// TestServeDefaults is the newcomer's path: no settings, paste the printed
// key, list and create pets.
func TestServeDefaults(t *testing.T) {
	t.Parallel()
	in := start(t, nil)
	m := devKeyRE.FindStringSubmatch(in.stdout.String())
	if m == nil {
		t.Fatalf("no development key printed:\n%s", in.stdout.String())
	}
	key := m[1]
	if !strings.Contains(in.stdout.String(), "curl -i -H 'Authorization: Bearer "+key+"' "+in.api+"/v1/pets") {
		t.Errorf("no ready curl line for %s:\n%s", in.api, in.stdout.String())
	}
	if !strings.Contains(in.stdout.String(), in.api+"/docs\n") {
		t.Errorf("no docs page address for %s:\n%s", in.api, in.stdout.String())
	}
	if strings.Contains(in.stderr.String(), key) {
		t.Error("the API key appears in the logs")
	}

	resp, body := do(t, "GET", in.api+"/v1/pets", key, "")
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-RateLimit-Limit") != "60" {
		t.Errorf("X-RateLimit-Limit = %q, want the free plan's 60", resp.Header.Get("X-RateLimit-Limit"))
	}
	resp, body = do(t, "POST", in.api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`)
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	var p struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.ID < 1 || p.Status != "available" {
		t.Fatalf("create body %s: %v", body, err)
	}
	resp, _ = do(t, "GET", in.api+"/v1/pets", "pst_wrong", "")
	if resp.StatusCode != 401 {
		t.Errorf("bad key: %d", resp.StatusCode)
	}

	resp, body = do(t, "GET", in.ops+"/metrics", "", "")
	for _, name := range []string{"petstore_http_requests_total", "petstore_build_info", "petstore_ratelimit_decisions_total", "go_goroutines", "go_gc_gomemlimit_bytes", "go_gc_gogc_percent"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if resp.StatusCode != 200 {
		t.Errorf("/metrics: %d", resp.StatusCode)
	}
	if err := in.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// TestServeDrains checks the shutdown sequence: readiness goes false first,
// the listener stays up during the drain delay, then run returns nil.
func TestServeDrains(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--drain-delay", "700ms")
	stopped := make(chan error, 1)
	go func() { stopped <- in.stop() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(in.ops + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("readiness never turned false while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Still serving during the drain delay.
	if resp, err := http.Get(in.api + "/openapi.yaml"); err != nil {
		t.Fatalf("public port closed during drain: %v", err)
	} else {
		resp.Body.Close()
	}
	if err := <-stopped; err != nil {
		t.Fatalf("run returned %v", err)
	}
}

func TestCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args    []string
		wantErr string
		wantOut string
	}{
		{[]string{"version"}, "", "petstore dev"},
		{[]string{"help"}, "", "\n  limits   inspect and clear keys' rate limits"},
		{[]string{"help", "plans", "simulate"}, "", "Usage: petstore plans simulate --access-log FILE..."},
		{nil, "no command", ""},
		{[]string{"frobnicate"}, "unknown command", ""},
		{[]string{"serve", "--store", "postgres"}, "database-url", ""},
		{[]string{"serve", "--redis-timeout", "soon"}, "redis-timeout", ""},
		{[]string{"keys", "list"}, "needs PostgreSQL", ""},
		{[]string{"limits", "show", "key_x"}, "set --redis-url", ""},
		{[]string{"keys", "rotate"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, func(string) string { return "" }, &out, &errOut)
			switch {
			case tt.wantErr == "" && tt.wantOut == "" && err == nil:
				t.Fatalf("expected an error")
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			case tt.wantOut != "" && (err != nil || !strings.Contains(out.String(), tt.wantOut)):
				t.Fatalf("err %v, output %q, want %q", err, out.String(), tt.wantOut)
			}
		})
	}
}

// TestReadmeListsEverySetting keeps the configuration reference honest.
func TestReadmeListsEverySetting(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	for _, s := range config.Register(flag.NewFlagSet("petstore", flag.ContinueOnError), &cfg).Settings() {
		if !bytes.Contains(readme, []byte("`"+s.Env+"`")) || !bytes.Contains(readme, []byte("--"+s.Flag)) {
			t.Errorf("README.md does not document --%s / %s", s.Flag, s.Env)
		}
	}
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// withSchema returns a database URL whose connections use a fresh schema,
// dropped when the test ends.
func withSchema(t *testing.T) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schema := randomName("petstore_cmd_")
	if _, err := conn.Exec(ctx, "create schema "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "drop schema "+schema+" cascade")
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "search_path=" + schema
}

func runOK(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatalf("petstore %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

// TestProductionPath runs the production shape end to end on a real
// PostgreSQL and Redis: migrate, issue a key with the CLI, serve with a
// plans file, exceed the limit, get banned, inspect and lift the ban.
func TestProductionPath(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	redisAddr := testenv.RedisAddr(t)

	plans := t.TempDir() + "/plans.yaml"
	if err := os.WriteFile(plans, []byte(`plans:
  tiny:
    quotas: [{limit: 3, period: 1m}]
    ban: {threshold: 2, within: 1m, duration: 1m, multiplier: 2, max: 10m, memory: 1h}
    candidate:
      quotas: [{limit: 2, period: 1m}]
      ban: {threshold: 1, within: 1m, duration: 2m}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PETSTORE_DATABASE_URL": dbURL,
		"PETSTORE_PLANS_FILE":   plans,
		"PETSTORE_REDIS_ADDRS":  redisAddr,
		"PETSTORE_STORE":        "postgres",
	}
	if out := runOK(t, env, "migrate"); !strings.Contains(out, "applied") {
		t.Fatalf("migrate: %q", out)
	}
	if out := runOK(t, env, "migrate"); !strings.Contains(out, "up to date") {
		t.Fatalf("second migrate: %q", out)
	}
	out := runOK(t, env, "keys", "create", "--plan", "tiny", "--label", "acme")
	key := regexp.MustCompile(`key:\s+(pst_\S+)`).FindStringSubmatch(out)
	id := regexp.MustCompile(`id:\s+(key_\S+)`).FindStringSubmatch(out)
	if key == nil || id == nil {
		t.Fatalf("keys create printed %q", out)
	}
	if list := runOK(t, env, "keys", "list"); !strings.Contains(list, id[1]) || strings.Contains(list, key[1]) {
		t.Fatalf("keys list must show the id and never the key:\n%s", list)
	}

	in := start(t, env)
	if strings.Contains(in.stdout.String(), "pst_") {
		t.Fatal("a development key was printed although keys come from the database")
	}
	resp, body := do(t, "POST", in.api+"/v1/pets", key[1], `{"name":"Rex","categoryId":7,"status":"pending"}`)
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	for i := 0; i < 2; i++ {
		if resp, body = do(t, "GET", in.api+"/v1/pets?status=pending", key[1], ""); resp.StatusCode != 200 {
			t.Fatalf("list %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if !strings.Contains(string(body), `"name":"Rex"`) {
		t.Fatalf("list body %s", body)
	}
	// Over the limit: 429 with Retry-After, then a ban after more than two
	// rejected requests.
	resp, body = do(t, "GET", in.api+"/v1/pets", key[1], "")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"rate_limited"`) {
		t.Fatalf("over limit: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	var banned bool
	for i := 0; i < 10 && !banned; i++ {
		resp, body = do(t, "GET", in.api+"/v1/pets", key[1], "")
		banned = strings.Contains(string(body), `"key_banned"`)
		if !banned {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !banned {
		t.Fatalf("never banned; last answer %d %s", resp.StatusCode, body)
	}
	show := runOK(t, env, "limits", "show", id[1])
	if !strings.Contains(show, "ban:     until") || !strings.Contains(show, "1m") {
		t.Fatalf("limits show:\n%s", show)
	}
	// The candidate measured the same requests, would have admitted 2,
	// limited the third and banned the key at the fourth.
	if !regexp.MustCompile(`2/1m \(candidate\)\s+2\s+0\s`).MatchString(show) || !strings.Contains(show, "candidate ban: until") {
		t.Fatalf("limits show without the candidate's usage and ban:\n%s", show)
	}
	// The key itself reads what limits show reads, banned as it is.
	quota := rateLimit(t, in, key[1])
	if quota.Plan != "tiny" || len(quota.Windows) != 1 || quota.Windows[0].Used != 3 || quota.Windows[0].Remaining != 0 || !quota.Ban.Banned {
		t.Fatalf("GET /v1/rate_limit while banned: %+v", quota)
	}
	until, err := time.Parse(time.RFC3339, regexp.MustCompile(`ban:     until (\S+)`).FindStringSubmatch(show)[1])
	if err != nil {
		t.Fatal(err)
	}
	if quota.Ban.Until != until.Unix() && quota.Ban.Until != until.Unix()+1 { // one rounds up, the other down
		t.Fatalf("GET /v1/rate_limit says banned until %d, limits show %s", quota.Ban.Until, until)
	}
	runOK(t, env, "limits", "unban", id[1])
	if show := runOK(t, env, "limits", "show", id[1]); !strings.Contains(show, "ban:     none") || !strings.Contains(show, "candidate ban: none") {
		t.Fatalf("after unban:\n%s", show)
	}
	if quota := rateLimit(t, in, key[1]); quota.Ban.Banned {
		t.Fatalf("GET /v1/rate_limit after unban: %+v", quota)
	}

	// Revocation reaches the server within the key cache TTL.
	runOK(t, env, "keys", "revoke", id[1])
	sc := bufio.NewScanner(strings.NewReader(runOK(t, env, "keys", "list")))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), id[1]) && strings.HasSuffix(strings.TrimSpace(sc.Text()), "-") {
			t.Fatalf("revoked key listed as active: %s", sc.Text())
		}
	}
}

// TestDashboardMetricsAreExported closes the loop between the service and
// deploy/: the offline chart checks verify the dashboard and alert rules
// against helm/chartest/testdata/metrics.txt, and this test verifies that
// file against the running binary's /metrics, so neither can drift.
func TestDashboardMetricsAreExported(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile("../../helm/chartest/testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	in := start(t, map[string]string{"PETSTORE_REDIS_ADDRS": testenv.RedisAddr(t)})
	key := devKeyRE.FindStringSubmatch(in.stdout.String())
	if key == nil {
		t.Fatal("no development key printed")
	}
	do(t, "GET", in.api+"/v1/pets", key[1], "")
	do(t, "GET", in.api+"/v1/pets", "pst_unknown", "")
	_, body := do(t, "GET", in.ops+"/metrics", "", "")
	live := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "# TYPE petstore_") {
			live[line] = true
		}
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(want), "\n") {
		if strings.HasPrefix(line, "# TYPE petstore_") {
			listed[line] = true
			if !live[line] {
				t.Errorf("metrics.txt lists %q but the service does not export it", line)
			}
		}
	}
	for line := range live {
		if !listed[line] {
			t.Errorf("the service exports %q but helm/chartest/testdata/metrics.txt does not list it", line)
		}
	}
}

// TestServePprof checks that the profiles are off by default, and when
// turned on, served on the ops port only.
func TestServePprof(t *testing.T) {
	t.Parallel()
	status := func(url string) int {
		t.Helper()
		resp, _ := do(t, "GET", url, "", "")
		return resp.StatusCode
	}
	off := start(t, nil)
	if got := status(off.ops + "/debug/pprof/"); got != http.StatusNotFound {
		t.Errorf("pprof off: ops /debug/pprof/ = %d, want 404", got)
	}
	if got := status(off.api + "/debug/pprof/"); got != http.StatusNotFound {
		t.Errorf("pprof off: public /debug/pprof/ = %d, want 404", got)
	}

	for name, on := range map[string]*instance{
		"--pprof":             start(t, nil, "--pprof"),
		"PETSTORE_PPROF=true": start(t, map[string]string{"PETSTORE_PPROF": "true"}),
	} {
		resp, body := do(t, "GET", on.ops+"/debug/pprof/", "", "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Types of profiles available") {
			t.Errorf("%s: ops /debug/pprof/ = %d %.100q, want the profile index", name, resp.StatusCode, body)
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1", "/debug/pprof/cmdline"} {
			if got := status(on.api + path); got != http.StatusNotFound {
				t.Errorf("%s: public %s = %d, want 404", name, path, got)
			}
		}
	}
	// A CPU profile longer than the server's write timeout (30 s) would
	// be let through too: net/http/pprof extends the deadline itself.
	on := start(t, nil, "--pprof")
	resp, body := do(t, "GET", on.ops+"/debug/pprof/profile?seconds=1", "", "")
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("CPU profile: %d %.200q", resp.StatusCode, body)
	}
}

// TestServeDraftFields: petstore serve sends the specification's three
// rate-limit fields alone by default, and the IETF draft's two beside
// them with --ratelimit-draft-fields or its environment variable (and
// not with either set false), to a key's request and to one without a
// valid key alike.
func TestServeDraftFields(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		args  []string
		env   map[string]string
		draft bool
	}{
		"default":                               {},
		"--ratelimit-draft-fields":              {args: []string{"--ratelimit-draft-fields"}, draft: true},
		"PETSTORE_RATELIMIT_DRAFT_FIELDS=true":  {env: map[string]string{"PETSTORE_RATELIMIT_DRAFT_FIELDS": "true"}, draft: true},
		"--ratelimit-draft-fields=false":        {args: []string{"--ratelimit-draft-fields=false"}},
		"PETSTORE_RATELIMIT_DRAFT_FIELDS=false": {env: map[string]string{"PETSTORE_RATELIMIT_DRAFT_FIELDS": "false"}},
	} {
		in := start(t, tt.env, tt.args...)
		m := devKeyRE.FindStringSubmatch(in.stdout.String())
		if m == nil {
			t.Fatalf("%s: no development key printed:\n%s", name, in.stdout.String())
		}
		for _, key := range []string{m[1], "pst_wrong"} {
			resp, _ := do(t, "GET", in.api+"/v1/pets", key, "")
			if resp.Header.Get("X-RateLimit-Limit") == "" || resp.Header.Get("X-RateLimit-Remaining") == "" || resp.Header.Get("X-RateLimit-Reset") == "" {
				t.Errorf("%s: %d without the specification's fields: %v", name, resp.StatusCode, resp.Header)
			}
			for _, field := range []string{"RateLimit", "RateLimit-Policy"} {
				if got := resp.Header.Get(field) != ""; got != tt.draft {
					t.Errorf("%s: %d carries %s: %v, want %v (%v)", name, resp.StatusCode, field, got, tt.draft, resp.Header)
				}
			}
		}
	}
}

// The flag's 0 means no hold; the limiter's Options take 0 as the default
// hold and a negative value as none.
func TestPipelineHoldFlagMeaning(t *testing.T) {
	for _, tt := range []struct{ flag, opt time.Duration }{
		{0, -1},
		{time.Microsecond, time.Microsecond},
		{200 * time.Microsecond, 200 * time.Microsecond},
		{10 * time.Millisecond, 10 * time.Millisecond},
	} {
		if got := pipelineHold(tt.flag); got != tt.opt {
			t.Errorf("pipelineHold(%s) = %s, want %s", tt.flag, got, tt.opt)
		}
	}
}
