package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/testenv"
)

// candidateBody is the part of GET /v1/rate_limit's body that says where a
// key stands in its enforced and candidate windows.
type candidateBody struct {
	Windows, Candidate []struct {
		Period                 string
		Limit, Used, Remaining int64
	}
}

// standing asks GET /v1/rate_limit with key and returns its windows and
// candidate windows as "PERIOD LIMIT USED REMAINING" lines.
func standing(t *testing.T, in *instance, key string) (windows, candidate []string) {
	t.Helper()
	resp, body := do(t, "GET", in.api+"/v1/rate_limit", key, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/rate_limit: %d %s", resp.StatusCode, body)
	}
	var b candidateBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("GET /v1/rate_limit body %s: %v", body, err)
	}
	for _, w := range b.Windows {
		windows = append(windows, fmt.Sprintf("%s %d %d %d", w.Period, w.Limit, w.Used, w.Remaining))
	}
	for _, w := range b.Candidate {
		candidate = append(candidate, fmt.Sprintf("%s %d %d %d", w.Period, w.Limit, w.Used, w.Remaining))
	}
	return windows, candidate
}

func sameLines(got []string, want ...string) bool {
	return strings.Join(got, "; ") == strings.Join(want, "; ")
}

// TestKeyCandidate is an SRE measuring a proposed limit for one customer
// before enforcing it, on the production path (keys in PostgreSQL, counts
// in Redis): the customer's key is issued with a candidate quota of its
// own over its plan's candidate, and sends more requests than that quota
// allows. Every request is served; `petstore limits show`, the key's own
// GET /v1/rate_limit and the candidate metric all report what the
// candidate would have done, and another key of the plan keeps the
// plan's candidate.
func TestKeyCandidate(t *testing.T) {
	t.Parallel()
	dbURL := withSchema(t)
	redisAddr := testenv.RedisAddr(t)
	plans := writeTemp(t, "plans.yaml", `plans:
  growth:
    quotas: [{limit: 100, period: 1m}]
    ban: off
    candidate: {quotas: [{limit: 50, period: 1m}, {limit: 1000, period: 24h}]}
`)
	env := map[string]string{
		"PETSTORE_DATABASE_URL": dbURL,
		"PETSTORE_PLANS_FILE":   plans,
		"PETSTORE_REDIS_ADDRS":  redisAddr,
	}
	runOK(t, env, "migrate")
	created := func(args ...string) (key, id string) {
		t.Helper()
		out := runOK(t, env, append([]string{"keys", "create", "--plan", "growth"}, args...)...)
		k := regexp.MustCompile(`key:\s+(pst_\S+)`).FindStringSubmatch(out)
		i := regexp.MustCompile(`id:\s+(key_\S+)`).FindStringSubmatch(out)
		if k == nil || i == nil {
			t.Fatalf("keys create printed %q", out)
		}
		return k[1], i[1]
	}
	key, id := created("--label", "acme", "--candidate-quota", "3/1m")
	otherKey, otherID := created("--label", "globex")

	list := runOK(t, env, "keys", "list")
	if !regexp.MustCompile(`(?m)^`+id+`\s+growth\s+plan\s+3/1m\s+acme\s`).MatchString(list) ||
		!regexp.MustCompile(`(?m)^`+otherID+`\s+growth\s+plan\s+plan\s+globex\s`).MatchString(list) ||
		!strings.Contains(list, "CANDIDATE") {
		t.Fatalf("keys list does not show each key's own candidate:\n%s", list)
	}

	in := start(t, env)
	for i := range 5 {
		if resp, body := do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s; a candidate never refuses", i, resp.StatusCode, body)
		}
	}
	if resp, body := do(t, "GET", in.api+"/v1/pets", otherKey, ""); resp.StatusCode != 200 {
		t.Fatalf("the other key: %d %s", resp.StatusCode, body)
	}

	// The key's 3/1m replaced the plan's 50/1m and kept its 1000/24h; as if
	// enforced alone, the candidate admitted three of the five requests.
	show := runOK(t, env, "limits", "show", id)
	for _, want := range []string{
		`(?m)^100/1m\s+5\s+95\s`,
		`(?m)^3/1m \(candidate\)\s+3\s+0\s`,
		`(?m)^1000/24h \(candidate\)\s+3\s+997\s`,
	} {
		if !regexp.MustCompile(want).MatchString(show) {
			t.Errorf("limits show lacks %s:\n%s", want, show)
		}
	}
	if strings.Contains(show, "50/1m") {
		t.Errorf("limits show lists the plan's candidate window the key replaced:\n%s", show)
	}
	windows, candidate := standing(t, in, key)
	if !sameLines(windows, "1m 100 5 95") || !sameLines(candidate, "1m 3 3 0", "24h 1000 3 997") {
		t.Errorf("GET /v1/rate_limit: windows %q, candidate %q", windows, candidate)
	}
	windows, candidate = standing(t, in, otherKey)
	if !sameLines(windows, "1m 100 1 99") || !sameLines(candidate, "1m 50 1 49", "24h 1000 1 999") {
		t.Errorf("GET /v1/rate_limit of a key without a candidate of its own: windows %q, candidate %q", windows, candidate)
	}
	if show := runOK(t, env, "limits", "show", otherID); !regexp.MustCompile(`(?m)^50/1m \(candidate\)\s+1\s+49\s`).MatchString(show) {
		t.Errorf("limits show of a key without a candidate of its own:\n%s", show)
	}

	metrics := func() string { _, body := do(t, "GET", in.ops+"/metrics", "", ""); return string(body) }()
	for _, want := range []string{
		`petstore_ratelimit_candidate_decisions_total{outcome="allowed",plan="growth"} 4`,
		`petstore_ratelimit_candidate_decisions_total{outcome="limited",plan="growth"} 2`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestKeysFileCandidate measures a candidate on a keys-file entry with the
// counts kept in the process (no Redis), and drops it by editing the file:
// the key's own candidate applies even though its plan has none, and once
// the entry loses it the key reports no candidate, without a restart.
func TestKeysFileCandidate(t *testing.T) {
	t.Parallel()
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	entry := "keys:\n  - key: " + key + "\n    plan: free\n"
	keys := writeTemp(t, "keys.yaml", entry+"    candidate: {quotas: [{limit: 2, period: 1m}]}\n")
	in := start(t, map[string]string{"PETSTORE_KEYS_FILE": keys}, "--reload-interval", "100ms")
	for i := range 3 {
		if resp, body := do(t, "GET", in.api+"/v1/pets", key, ""); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s; a candidate never refuses", i, resp.StatusCode, body)
		}
	}
	windows, candidate := standing(t, in, key)
	if !sameLines(windows, "1m 60 3 57", "24h 1000 3 997") || !sameLines(candidate, "1m 2 2 0") {
		t.Fatalf("GET /v1/rate_limit: windows %q, candidate %q", windows, candidate)
	}

	if err := os.WriteFile(keys, []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		windows, candidate = standing(t, in, key)
		if candidate == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the candidate is still reported after it left the keys file: %q", candidate)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !sameLines(windows, "1m 60 3 57", "24h 1000 3 997") {
		t.Errorf("dropping the candidate changed the enforced windows: %q", windows)
	}
}
