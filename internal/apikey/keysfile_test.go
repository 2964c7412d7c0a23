package apikey_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

func TestLoadKeysExample(t *testing.T) {
	t.Parallel()
	k, err := apikey.LoadKeys(filepath.Join("testdata", "keys.yaml"), plan.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	recs := k.Records()
	if len(recs) != 3 || k.Len() != 3 {
		t.Fatalf("got %d records, want 3", len(recs))
	}
	dev := recs[0]
	if dev.Hash != apikey.Hash(devKey) || dev.ID != apikey.IDFromHash(dev.Hash) || dev.Plan != "free" ||
		dev.Label != "local development" || dev.Revoked() || len(dev.Overrides) != 0 {
		t.Errorf("dev record = %+v", dev)
	}
	acme, ok := k.Lookup(apikey.Hash(acmeKey))
	if !ok {
		t.Fatal("the key listed by an upper-case sha256 was not found by its hash")
	}
	wantOverrides := []ratelimit.Window{{Limit: 5000, Period: time.Minute}, {Limit: 2000000, Period: 24 * time.Hour}}
	wantCandidate := []ratelimit.Window{{Limit: 4000, Period: time.Minute}}
	if acme.Plan != "enterprise" || acme.Label != "acme" || !reflect.DeepEqual(acme.Overrides, wantOverrides) ||
		!reflect.DeepEqual(acme.Candidate, wantCandidate) {
		t.Errorf("acme record = %+v", acme)
	}
	if dev.Candidate != nil {
		t.Errorf("dev record has a candidate: %v", dev.Candidate)
	}
	if r, _ := k.Lookup(apikey.Hash(revokedKey)); !r.Revoked() {
		t.Errorf("revoked record = %+v", r)
	}
	if _, ok := k.Lookup(apikey.Hash(otherKey)); ok {
		t.Error("found a key that is not listed")
	}
	// The plaintext is not kept anywhere in the set.
	for _, r := range recs {
		if strings.Contains(strings.Join([]string{r.ID, r.Hash, r.Label, r.Plan}, " "), devKey) {
			t.Errorf("record %+v holds the plaintext key", r)
		}
	}
}

func TestLoadKeysNoFile(t *testing.T) {
	t.Parallel()
	k, err := apikey.LoadKeys("", plan.Defaults())
	if err != nil || k.Len() != 0 {
		t.Fatalf("LoadKeys(\"\") = %v, %v; want no keys", k, err)
	}
	if _, err := apikey.LoadKeys(filepath.Join(t.TempDir(), "missing.yaml"), plan.Defaults()); err == nil {
		t.Fatal("LoadKeys(missing file) succeeded")
	}
	var none *apikey.StaticKeys
	if _, ok := none.Lookup("x"); ok || none.Len() != 0 || none.Records() != nil {
		t.Fatal("a nil StaticKeys is not empty")
	}
}

func TestParseKeysErrors(t *testing.T) {
	t.Parallel()
	h := apikey.Hash(otherKey)
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"unknown plan", "keys:\n  - {key: " + devKey + ", plan: free}\n  - sha256: " + h + "\n    plan: gold\n", []string{`keys[1].plan (line 4): unknown plan "gold" (the plans are business, enterprise, free, loadtest, pro)`}},
		{"malformed key", "keys:\n  - {key: " + devKey[:41] + "x, plan: free}\n", []string{"keys[0].key (line 2): apikey: malformed API key: checksum"}},
		{"both key and sha256", "keys: [{key: " + devKey + ", sha256: " + h + ", plan: free}]", []string{"keys[0] (line 1): give either key or sha256, not both"}},
		{"neither key nor sha256", "keys:\n  - plan: free\n", []string{"keys[0] (line 2): give key or sha256"}},
		{"bad sha256", "keys:\n  - plan: free\n    sha256: abc\n", []string{"keys[0].sha256 (line 3): want the 64 hex characters"}},
		{"no plan", "keys:\n  - sha256: " + h + "\n", []string{"keys[0].plan (line 2): required"}},
		{"duplicate key", "keys:\n  - {key: " + devKey + ", plan: free}\n  - {sha256: " + strings.ToUpper(apikey.Hash(devKey)) + ", plan: pro}\n", []string{"keys[1] (line 3): the same key as keys[0]"}},
		{"per-key plan without quotas", "keys: [{sha256: " + h + ", plan: enterprise}]", []string{"keys[0].quotas (line 1): plan \"enterprise\"", "agreed per key"}},
		{"quota limit below 1", "keys:\n  - sha256: " + h + "\n    plan: free\n    quotas:\n      - {limit: 0, period: 1m}\n", []string{"keys[0].quotas[0].limit (line 5): must be from 1 to 1000000000, got 0"}},
		{"quota limit above the maximum", "keys: [{sha256: " + h + ", plan: free, quotas: [{limit: 1000000001, period: 1m}]}]", []string{"keys[0].quotas[0].limit (line 1): must be from 1 to 1000000000"}},
		{"quota bad period", "keys:\n  - sha256: " + h + "\n    plan: free\n    quotas:\n      - limit: 1\n        period: often\n", []string{"keys[0].quotas[0].period (line 6): period \"often\""}},
		{"quota periods twice", "keys: [{sha256: " + h + ", plan: free, quotas: [{limit: 1, period: 1m}, {limit: 2, period: 60s}]}]", []string{"keys[0].quotas[1].period (line 1): 1m is also the period of quotas[0]"}},
		{"quota without a period", "keys:\n  - sha256: " + h + "\n    plan: free\n    quotas:\n      - limit: 1\n", []string{"keys[0].quotas[0].period (line 5): required"}},
		{"candidate limit below 1", candidateFile(h, "{limit: 0, period: 1m}"), []string{"keys[3].candidate.quotas[0].limit (line 12): must be from 1 to 1000000000, got 0"}},
		{"candidate limit above the maximum", candidateFile(h, "{limit: 1000000001, period: 1m}"), []string{"keys[3].candidate.quotas[0].limit (line 12): must be from 1 to 1000000000, got 1000000001"}},
		{"candidate bad period", candidateFile(h, "{limit: 1, period: often}"), []string{`keys[3].candidate.quotas[0].period (line 12): period "often": want a duration`}},
		{"candidate period below 1ms", candidateFile(h, "{limit: 1, period: 500us}"), []string{`keys[3].candidate.quotas[0].period (line 12): period "500us": must be at least 1ms`}},
		{"candidate period above 366d", candidateFile(h, "{limit: 1, period: 367d}"), []string{`keys[3].candidate.quotas[0].period (line 12): period "367d": must be at most 366d`}},
		{"candidate without a period", candidateFile(h, "{limit: 1}"), []string{"keys[3].candidate.quotas[0].period (line 12): required"}},
		{"candidate periods twice", candidateFile(h, "{limit: 1, period: 24h}\n          - {limit: 2, period: 1d}"), []string{"keys[3].candidate.quotas[1].period (line 13): 24h is also the period of candidate.quotas[0]"}},
		{"candidate without quotas", "keys:\n  - sha256: " + h + "\n    plan: free\n    candidate: {}\n", []string{"keys[0].candidate.quotas (line 4): a candidate needs at least one quota"}},
		{"candidate with an empty list", "keys:\n  - sha256: " + h + "\n    plan: free\n    candidate:\n      quotas: []\n", []string{"keys[0].candidate.quotas (line 5): a candidate needs at least one quota"}},
		{"candidate with an unknown field", "keys:\n  - sha256: " + h + "\n    plan: free\n    candidate:\n      quotas: [{limit: 1, period: 1m}]\n      ban: off\n", []string{`keys[0] (line 6): unknown field "ban"`}},
		{"candidate limit as a fraction", "keys:\n  - sha256: " + h + "\n    plan: free\n    candidate: {quotas: [{limit: 2.5, period: 1m}]}\n", []string{"keys[0] (line 4): want a whole number, got float"}},
		{"candidate not a mapping", "keys:\n  - sha256: " + h + "\n    plan: free\n    candidate: [{limit: 1, period: 1m}]\n", []string{"keys[0] (line 4): want a mapping, got seq"}},
		{"unknown field", "keys:\n  - sha256: " + h + "\n    plan: free\n  - sha256: " + apikey.Hash(devKey) + "\n    plan: free\n    expires: 2030-01-01\n", []string{`keys[1] (line 6): unknown field "expires"`}},
		{"unknown top-level field", "key: []", []string{`line 1: unknown field "key"`}},
		{"wrong type", "keys:\n  - sha256: " + h + "\n    plan: free\n    revoked: " + devKey + "\n", []string{"keys[0] (line 4): want true or false, got str"}},
		{"limit as a fraction", "keys:\n  - sha256: " + h + "\n    plan: free\n    quotas: [{limit: 1.5, period: 1m}]\n", []string{"keys[0] (line 4): want a whole number, got float"}},
		{"field twice", "keys:\n  - sha256: " + h + "\n    plan: free\n    plan: pro\n", []string{`keys[0] (line 4): field "plan" given twice (first at line 3)`}},
		{"keys not a list", "keys: {a: 1}", []string{"line 1: want a list, got map"}},
		{"every problem reported", "keys:\n  - {plan: free}\n  - {sha256: x, plan: free}\n", []string{"keys[0] (line 2): give key or sha256", "keys[1].sha256 (line 3)"}},
		{"two documents", "keys: []\n---\nkeys: []\n", []string{"line 2: a second YAML document starts here: a keys file holds a single YAML document"}},
		{"not YAML", "keys:\n  - sha256: " + h + "\n    plan: free\n  - key: " + devKey + "\n    plan: [free\n", []string{"keys[1] (line 6, column 1, the end of the file): not YAML: did not find expected ',' or ']' while parsing a flow sequence (line 5, column 11)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := apikey.ParseKeys([]byte(tt.file), plan.Defaults())
			if err == nil {
				t.Fatal("ParseKeys() succeeded, want an error")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("ParseKeys() error = %q\nwant it to contain %q", err, want)
				}
			}
			for _, k := range []string{devKey, otherKey, devKey[:41]} {
				if strings.Contains(err.Error(), k) {
					t.Errorf("the error quotes a key: %v", err)
				}
			}
		})
	}
}

// candidateFile is a keys file whose fourth entry, keys[3], has a
// candidate whose quotas list starts on line 12 with quotas.
func candidateFile(hash, quotas string) string {
	return `keys:
  - {key: ` + devKey + `, plan: free}
  - {sha256: ` + apikey.Hash(acmeKey) + `, plan: pro}
  - sha256: ` + apikey.Hash(revokedKey) + `
    plan: pro
    revoked: true
  - sha256: ` + hash + `
    plan: pro
    label: globex
    candidate:
      quotas:
          - ` + quotas + `
`
}

// A key's candidate is read as its own quotas are: the record keeps the
// key's list, and its policy has the plan's candidate with the key's over
// it.
func TestParseKeysCandidate(t *testing.T) {
	t.Parallel()
	plans, err := plan.Parse([]byte(`plans:
  growth:
    quotas: [{limit: 300, period: 1m}]
    candidate: {quotas: [{limit: 200, period: 1m}, {limit: 5000, period: 24h}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name            string
		entry           string
		record, policy  []ratelimit.Window
		quotas, windows []ratelimit.Window
	}{
		{name: "the plan's candidate", entry: "plan: growth",
			policy:  []ratelimit.Window{{Limit: 200, Period: time.Minute}, {Limit: 5000, Period: 24 * time.Hour}},
			windows: []ratelimit.Window{{Limit: 300, Period: time.Minute}}},
		{name: "the key's candidate of the same period wins",
			entry:   "plan: growth\n    candidate: {quotas: [{limit: 150, period: 60s}]}",
			record:  []ratelimit.Window{{Limit: 150, Period: time.Minute}},
			policy:  []ratelimit.Window{{Limit: 150, Period: time.Minute}, {Limit: 5000, Period: 24 * time.Hour}},
			windows: []ratelimit.Window{{Limit: 300, Period: time.Minute}}},
		{name: "the key's candidate adds a period",
			entry:   "plan: growth\n    candidate: {quotas: [{limit: 20000, period: 7d}, {limit: 5, period: 1s}]}",
			record:  []ratelimit.Window{{Limit: 20000, Period: 7 * 24 * time.Hour}, {Limit: 5, Period: time.Second}},
			policy:  []ratelimit.Window{{Limit: 5, Period: time.Second}, {Limit: 200, Period: time.Minute}, {Limit: 5000, Period: 24 * time.Hour}, {Limit: 20000, Period: 7 * 24 * time.Hour}},
			windows: []ratelimit.Window{{Limit: 300, Period: time.Minute}}},
		{name: "a candidate on a plan without one",
			entry:   "plan: FREE\n    candidate: {quotas: [{limit: 30, period: 1m}]}",
			record:  []ratelimit.Window{{Limit: 30, Period: time.Minute}},
			policy:  []ratelimit.Window{{Limit: 30, Period: time.Minute}},
			windows: []ratelimit.Window{{Limit: 60, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}},
		{name: "quotas and a candidate of the same period",
			entry:   "plan: free\n    quotas: [{limit: 120, period: 1m}]\n    candidate: {quotas: [{limit: 90, period: 1m}]}",
			record:  []ratelimit.Window{{Limit: 90, Period: time.Minute}},
			policy:  []ratelimit.Window{{Limit: 90, Period: time.Minute}},
			quotas:  []ratelimit.Window{{Limit: 120, Period: time.Minute}},
			windows: []ratelimit.Window{{Limit: 120, Period: time.Minute}, {Limit: 1000, Period: 24 * time.Hour}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := apikey.ParseKeys([]byte("keys:\n  - key: "+devKey+"\n    "+tt.entry+"\n"), plans)
			if err != nil {
				t.Fatal(err)
			}
			rec, ok := k.Lookup(apikey.Hash(devKey))
			if !ok {
				t.Fatal("the key is not in the set")
			}
			if !slices.Equal(rec.Candidate, tt.record) || !slices.Equal(rec.Overrides, tt.quotas) {
				t.Errorf("record candidate %v, quotas %v; want %v, %v", rec.Candidate, rec.Overrides, tt.record, tt.quotas)
			}
			pol, err := rec.Policy(plans)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pol.Candidate, tt.policy) || !slices.Equal(pol.Windows, tt.windows) {
				t.Errorf("policy candidate %v, windows %v; want %v, %v", pol.Candidate, pol.Windows, tt.policy, tt.windows)
			}
		})
	}
}

func TestParseKeysAgainstPlans(t *testing.T) {
	t.Parallel()
	file := []byte("keys: [{key: " + devKey + ", plan: tiny}]")
	if _, err := apikey.ParseKeys(file, plan.Defaults()); err == nil {
		t.Fatal("a key on a plan that does not exist was accepted")
	}
	plans, err := plan.Parse([]byte("plans: {tiny: {quotas: [{limit: 3, period: 10s}]}}"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := apikey.ParseKeys(file, plans)
	if err != nil || k.Len() != 1 {
		t.Fatalf("ParseKeys() = %v, %v", k, err)
	}
	if _, err := apikey.ParseKeys(nil, plans); err != nil {
		t.Fatalf("an empty file: %v", err)
	}
}

func TestLoadKeysNamesTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte("keys: [{plan: free}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := apikey.LoadKeys(path, plan.Defaults()); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadKeys() error = %v, want it to name %s", err, path)
	}
}
