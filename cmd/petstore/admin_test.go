package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/animal-store/petstore/ratelimit"
)

// TestKeysCreateGenerates covers `keys create --count --format` without a
// database: a pure generator whose output a keys file and the load-test
// kit read as they are.
func TestKeysCreateGenerates(t *testing.T) {
	t.Parallel()
	noEnv := map[string]string{}
	out := runOK(t, noEnv, "keys", "create", "--plan", "LoadTest", "--count", "3", "--format", "yaml", "--label", "lt: 1")
	keys, err := apikey.ParseKeys([]byte(out), plan.Defaults())
	if err != nil {
		t.Fatalf("generated YAML is not a keys file: %v\n%s", err, out)
	}
	recs := keys.Records()
	if len(recs) != 3 {
		t.Fatalf("%d keys in the file, want 3:\n%s", len(recs), out)
	}
	for _, r := range recs {
		if r.Plan != plan.LoadTest || r.Label != "lt: 1" {
			t.Errorf("record %+v, want plan loadtest, label %q", r, "lt: 1")
		}
	}

	out = runOK(t, noEnv, "keys", "create", "--plan", "enterprise", "--quota", "50/1s", "--count", "2", "--format", "csv")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) != 3 || strings.Join(rows[0], ",") != "id,key,plan,label" {
		t.Fatalf("csv %q: %v", out, err)
	}
	for _, row := range rows[1:] {
		if err := apikey.CheckFormat(row[1]); err != nil {
			t.Errorf("key %q: %v", row[1], err)
		}
		if row[0] != apikey.IDFromHash(apikey.Hash(row[1])) || row[2] != "enterprise" {
			t.Errorf("row %v: id or plan does not match the key", row)
		}
	}
	if rows[1][1] == rows[2][1] {
		t.Error("the same key generated twice")
	}

	out = runOK(t, noEnv, "keys", "create", "--plan", "enterprise", "--quota", "50/1s", "--format", "yaml")
	if _, err := apikey.ParseKeys([]byte(out), plan.Defaults()); err != nil || !strings.Contains(out, "period: 1s") {
		t.Fatalf("per-key quotas in the YAML: %v\n%s", err, out)
	}

	// A candidate of the key's own goes into its keys-file entry, which
	// reads back as it was given.
	out = runOK(t, noEnv, "keys", "create", "--plan", "pro", "--candidate-quota", "5000/1d", "--candidate-quota", "200/1m", "--format", "yaml")
	if !strings.Contains(out, "candidate:\n      quotas: [{limit: 5000, period: 24h}, {limit: 200, period: 1m}]") {
		t.Errorf("no candidate in the keys-file entry:\n%s", out)
	}
	keys, err = apikey.ParseKeys([]byte(out), plan.Defaults())
	if err != nil {
		t.Fatalf("generated YAML with a candidate is not a keys file: %v\n%s", err, out)
	}
	want := []ratelimit.Window{{Limit: 5000, Period: 24 * time.Hour}, {Limit: 200, Period: time.Minute}}
	if recs := keys.Records(); len(recs) != 1 || !slices.Equal(recs[0].Candidate, want) || recs[0].Overrides != nil {
		t.Errorf("records %+v, want one with candidate %v and no quotas of its own", recs, want)
	}

	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--plan", "free"}, "needs PostgreSQL"},
		{[]string{"--plan", "free", "--format", "yaml", "--candidate-quota", "10/1m", "--candidate-quota", "20/60s"}, `plan "free": candidate: two overrides for period 1m`},
		{[]string{"--plan", "free", "--format", "yaml", "--candidate-quota", "0/1m"}, "limit must be a whole number from 1 to 1000000000"},
		{[]string{"--plan", "free", "--format", "yaml", "--candidate-quota", "10/367d"}, "must be at most 366d"},
		{[]string{"--plan", "enterprise", "--format", "yaml", "--candidate-quota", "10/1m"}, "quotas are agreed per key"},
		{[]string{"--plan", "free", "--format", "xml"}, "--format must be"},
		{[]string{"--plan", "free", "--format", "csv", "--count", "0"}, "--count must be"},
		{[]string{"--plan", "free", "--format", "csv", "--count", "100001"}, "--count must be"},
		{[]string{"--plan", "gold", "--format", "csv"}, "unknown plan"},
		{[]string{"--plan", "enterprise", "--format", "csv"}, "quotas are agreed per key"},
		{[]string{"--format", "csv"}, "--plan is required"},
	} {
		var o, e bytes.Buffer
		err := run(context.Background(), append([]string{"keys", "create"}, tt.args...), func(string) string { return "" }, &o, &e)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("keys create %v: error %v, want one containing %q", tt.args, err, tt.wantErr)
		}
		if o.Len() != 0 {
			t.Errorf("keys create %v printed keys although it failed: %q", tt.args, o.String())
		}
	}
}

// TestLimitsReset stores keys in bulk, exhausts them on a real server and
// clears them with `limits reset`, by id and by plan.
func TestLimitsReset(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	redisAddr := testenv.RedisAddr(t)
	plans := t.TempDir() + "/plans.yaml"
	if err := os.WriteFile(plans, []byte("plans:\n  tiny: {quotas: [{limit: 2, period: 1m}], ban: off}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PETSTORE_DATABASE_URL": dbURL,
		"PETSTORE_PLANS_FILE":   plans,
		"PETSTORE_REDIS_ADDRS":  redisAddr,
	}
	runOK(t, env, "migrate")
	out := runOK(t, env, "keys", "create", "--plan", "tiny", "--count", "2", "--format", "csv", "--label", "reset-test")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) != 3 {
		t.Fatalf("csv %q: %v", out, err)
	}
	list := runOK(t, env, "keys", "list")
	for _, row := range rows[1:] {
		if !strings.Contains(list, row[0]) {
			t.Fatalf("key %s was not stored:\n%s", row[0], list)
		}
	}
	runOK(t, env, "keys", "create", "--plan", "free", "--label", "other plan")

	in := start(t, env)
	exhaust := func(key string) {
		t.Helper()
		for i := 0; i < 2; i++ {
			if resp, body := do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
		}
		if resp, body := do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 429 {
			t.Fatalf("third request: %d %s, want 429", resp.StatusCode, body)
		}
	}
	admitted := func(key string) bool {
		resp, _ := do(t, "GET", in.api+"/v1/pets", key, "")
		return resp.StatusCode == 200
	}
	// A replica drops what it cached of a reset key when the reset's
	// announcement reaches it (pub/sub): give it a moment.
	admittedSoon := func(key string) bool {
		deadline := time.Now().Add(2 * time.Second)
		for !admitted(key) {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
		return true
	}
	a, b := rows[1], rows[2]
	exhaust(a[1])
	exhaust(b[1])

	if out := runOK(t, env, "limits", "reset", a[0]); !strings.Contains(out, a[0]) {
		t.Fatalf("limits reset printed %q", out)
	}
	if !admittedSoon(a[1]) {
		t.Fatal("a reset key is still limited")
	}
	if admitted(b[1]) {
		t.Fatal("resetting one key reset another")
	}

	out = runOK(t, env, "limits", "reset", "--plan", "TINY")
	if !strings.Contains(out, "2 key(s) of plan tiny") {
		t.Fatalf("limits reset --plan printed %q", out)
	}
	for _, k := range []string{a[1], b[1]} {
		if !admittedSoon(k) || !admitted(k) {
			t.Fatal("two requests after resetting the plan were not both admitted")
		}
	}

	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"reset"}, "needs key ids or --plan"},
		{[]string{"reset", "--plan", "tiny", a[0]}, "not both"},
		{[]string{"reset", "--plan", "gold"}, `unknown plan "gold" (one of `},
		{[]string{"show"}, "needs a KEY-ID"},
	} {
		var o, e bytes.Buffer
		err := run(context.Background(), append([]string{"limits"}, tt.args...), func(k string) string { return env[k] }, &o, &e)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("limits %v: error %v, want one containing %q", tt.args, err, tt.wantErr)
		}
	}
}

// TestLimitsFinalize finalizes a running replica's records with the CLI:
// refused while a replica of an older release is live, in force on the
// replica within a heartbeat once set (its metric), out of force again
// once undone.
func TestLimitsFinalize(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	env := map[string]string{"PETSTORE_REDIS_ADDRS": m.Addr()}
	in := start(t, env)
	finalized := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, body := do(t, "GET", in.ops+"/metrics", "", "")
			got := strings.Contains(string(body), "\npetstore_ratelimit_records_finalized 1\n")
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("petstore_ratelimit_records_finalized never %v", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if out := runOK(t, env, "limits", "finalize", "--status"); !strings.HasPrefix(out, "not finalized; ") {
		t.Fatalf("status before: %q", out)
	}

	// A replica of an older release announces itself in the census every
	// release writes, and not in this release's.
	census := "petstore:rl:{replicas}"
	m.ZAdd(census, float64(time.Now().UnixMilli()), "older")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"limits", "finalize"}, func(k string) string { return env[k] }, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "1 replica(s) of an older release are live") {
		t.Fatalf("finalize beside an older replica: %v %q", err, out.String())
	}
	if m.Exists("petstore:rl:{replicas}:finalized4") {
		t.Fatal("a refused finalize left the mark")
	}
	// --wait gives up when the older replica stays...
	out.Reset()
	errOut.Reset()
	err = run(context.Background(), []string{"limits", "finalize", "--wait", "1200ms"}, func(k string) string { return env[k] }, &out, &errOut)
	if err == nil || err.Error() != "not finalized after 1.2s: 1 replica(s) of an older release live" || out.Len() != 0 {
		t.Fatalf("finalize --wait beside an older replica that stays: %v %q", err, out.String())
	}
	if got := errOut.String(); got != "waiting: 1 replica(s) of an older release live\n" {
		t.Fatalf("finalize --wait said %q on stderr", got)
	}
	if m.Exists("petstore:rl:{replicas}:finalized4") {
		t.Fatal("a finalize that waited in vain left the mark")
	}
	// --optional says why it did not and exits 0, with --wait or not,
	// leaving no mark.
	for _, args := range [][]string{{"--optional"}, {"--wait", "700ms", "--optional"}} {
		out := runOK(t, env, append([]string{"limits", "finalize"}, args...)...)
		if !strings.HasPrefix(out, "not finalized") || !strings.Contains(out, "1 replica(s) of an older release") || !strings.Contains(out, "the records stay as they are") {
			t.Fatalf("finalize %v beside an older replica printed %q", args, out)
		}
		if m.Exists("petstore:rl:{replicas}:finalized4") {
			t.Fatalf("finalize %v left the mark beside an older replica", args)
		}
	}
	// ... and finalizes once it leaves the census.
	out.Reset()
	errOut.Reset()
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"limits", "finalize", "--wait", "1m"}, func(k string) string { return env[k] }, &out, &errOut)
	}()
	time.Sleep(800 * time.Millisecond)
	if m.Exists("petstore:rl:{replicas}:finalized4") {
		t.Fatal("finalize --wait finalized beside an older replica")
	}
	// The command is no replica: the census holds the server and the
	// older replica alone.
	if members, err := m.ZMembers(census); err != nil || len(members) != 2 {
		t.Fatalf("census while finalize --wait runs: %v %v", members, err)
	}
	if _, err := m.ZRem(census, "older"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !strings.HasPrefix(out.String(), "finalized at ") || !strings.HasPrefix(errOut.String(), "waiting: 1 replica(s)") {
		t.Fatalf("finalize --wait once the older replica left: %v %q %q", err, out.String(), errOut.String())
	}
	if out := runOK(t, env, "limits", "finalize", "--undo"); !strings.HasPrefix(out, "finalize mark removed and finalizing held") {
		t.Fatalf("undo printed %q", out)
	}
	// --undo holds finalizing; --status says so, --release lifts the hold
	// and --hold sets it again.
	const hold = "petstore:rl:{replicas}:hold"
	if out := runOK(t, env, "limits", "finalize", "--status"); !m.Exists(hold) || !strings.HasPrefix(out, "finalizing held since ") {
		t.Fatalf("after --undo, status printed %q (hold set: %v)", out, m.Exists(hold))
	}
	if out := runOK(t, env, "limits", "finalize", "--release"); m.Exists(hold) || !strings.HasPrefix(out, "hold lifted") {
		t.Fatalf("--release printed %q (hold still set: %v)", out, m.Exists(hold))
	}
	if out := runOK(t, env, "limits", "finalize", "--hold"); !m.Exists(hold) || !strings.HasPrefix(out, "finalizing held") {
		t.Fatalf("--hold printed %q (hold set: %v)", out, m.Exists(hold))
	}
	if out := runOK(t, env, "limits", "finalize", "--release"); m.Exists(hold) || m.Exists("petstore:rl:{replicas}:finalized4") {
		t.Fatalf("--release finalized or kept the hold: %q", out)
	}
	// --wait also waits for a Redis that does not answer yet (a hook Job
	// started before it), saying so.
	late := miniredis.NewMiniRedis()
	lateAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	lateEnv := map[string]string{"PETSTORE_REDIS_ADDRS": lateAddr}
	out.Reset()
	errOut.Reset()
	go func() {
		done <- run(context.Background(), []string{"limits", "finalize", "--wait", "1m"}, func(k string) string { return lateEnv[k] }, &out, &errOut)
	}()
	time.Sleep(1500 * time.Millisecond)
	if err := late.StartAddr(lateAddr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(late.Close)
	if err := <-done; err != nil || !strings.HasPrefix(out.String(), "finalized at ") || !strings.HasPrefix(errOut.String(), "waiting: ") || strings.Count(errOut.String(), "\n") != 1 {
		t.Fatalf("finalize --wait for a Redis that answered late: %v %q %q", err, out.String(), errOut.String())
	}
	if !late.Exists("petstore:rl:{replicas}:finalized4") {
		t.Fatal("no mark on the Redis that answered late")
	}
	// Without --wait, such a Redis is an error at once.
	noRedis := map[string]string{"PETSTORE_REDIS_ADDRS": "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))}
	start := time.Now()
	err = run(context.Background(), []string{"limits", "finalize"}, func(k string) string { return noRedis[k] }, io.Discard, io.Discard)
	if err == nil || time.Since(start) > 20*time.Second {
		t.Fatalf("finalize without --wait, no Redis: %v after %v", err, time.Since(start))
	}
	// --optional: a Redis that does not answer is no failure either.
	if out := runOK(t, noRedis, "limits", "finalize", "--optional"); !strings.HasPrefix(out, "not finalized") || !strings.Contains(out, "the records stay as they are") {
		t.Fatalf("finalize --optional, no Redis, printed %q", out)
	}
	for _, args := range [][]string{{"--wait", "1m", "--undo"}, {"--wait", "1m", "--status"}, {"--wait", "-1s"}, {"--optional", "--undo"}, {"--optional", "--status"},
		{"--hold", "--release"}, {"--hold", "--undo"}, {"--wait", "1m", "--hold"}, {"--optional", "--release"}} {
		err := run(context.Background(), append([]string{"limits", "finalize"}, args...), func(k string) string { return env[k] }, io.Discard, io.Discard)
		if ue, ok := errors.AsType[*usageError](err); !ok || ue.cmd != "limits finalize" {
			t.Fatalf("limits finalize %v: %v, want a usage error", args, err)
		}
	}

	if out := runOK(t, env, "limits", "finalize"); !strings.HasPrefix(out, "finalized at ") {
		t.Fatalf("finalize printed %q", out)
	}
	finalized(true)
	status := runOK(t, env, "limits", "finalize", "--status")
	if !strings.HasPrefix(status, "finalized at ") || !strings.HasSuffix(status, "; 1 replica(s) live, 0 of an older release\n") {
		t.Fatalf("status: %q", status)
	}
	// Finalizing again (a hook after every upgrade) keeps the mark.
	mark, _ := m.Get("petstore:rl:{replicas}:finalized4")
	if out := runOK(t, env, "limits", "finalize"); !strings.HasPrefix(out, "already finalized at "+strings.TrimRight(strings.Fields(status)[2], ";,")+" ") {
		t.Fatalf("finalize again printed %q (status %q)", out, status)
	}
	if again, _ := m.Get("petstore:rl:{replicas}:finalized4"); again != mark {
		t.Fatalf("finalize again moved the mark from %s to %s", mark, again)
	}
	if out := runOK(t, env, "limits", "finalize", "--undo"); !strings.HasPrefix(out, "finalize mark removed") {
		t.Fatalf("undo printed %q", out)
	}
	finalized(false)
}
