package plan_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

func TestLoadExample(t *testing.T) {
	t.Parallel()
	s, err := plan.Load(filepath.Join("testdata", "plans.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Names(), []string{"enterprise", "free", "loadtest", "partner", "pro", "tiny-test"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v (business removed, partner and tiny-test added)", got, want)
	}
	free, _ := s.Lookup("free")
	if want := (ratelimit.BanPolicy{Threshold: 20, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Max: time.Hour, Memory: day}); free.Ban != want {
		t.Errorf("free ban = %+v, want %+v", free.Ban, want)
	}
	pro, _ := s.Lookup("pro")
	if pro.Ban.Enabled() || !reflect.DeepEqual(pro.Windows, []ratelimit.Window{w(300, time.Minute), w(10000, day)}) {
		t.Errorf("pro = %+v, want built-in quotas and no ban", pro)
	}
	tiny, _ := s.Lookup("tiny-test")
	if !reflect.DeepEqual(tiny.Windows, []ratelimit.Window{w(3, 10*time.Second)}) || tiny.Ban != plan.StandardBan(tiny.Windows) {
		t.Errorf("tiny-test = %+v, want 3/10s with the standard ban", tiny)
	}
	partner, _ := s.Lookup("PARTNER")
	if !partner.PerKey || !reflect.DeepEqual(partner.Windows, []ratelimit.Window{w(100, time.Second), w(100000, 7*day)}) {
		t.Errorf("partner = %+v, want per-key with 100/1s and 100000/7d", partner)
	}
	for name, want := range map[string]bool{"free": true, "pro": true, "business": true, "tiny-test": true, "partner": true, "enterprise": false, "loadtest": false} {
		if got := s.FromFile(name); got != want {
			t.Errorf("FromFile(%q) = %v, want %v", name, got, want)
		}
	}
	if got := s.Removed(); !reflect.DeepEqual(got, []string{"business"}) {
		t.Errorf("Removed() = %v, want [business]", got)
	}
	if d := plan.Defaults(); d.FromFile("free") || d.Removed() != nil {
		t.Error("the built-in set claims plans from a file")
	}
	if _, err := s.Policy("partner", plan.Overrides{}); err == nil {
		t.Error("a key on a per-key plan without quotas was accepted")
	}
	pol, err := s.Policy("partner", plan.Overrides{Quotas: []ratelimit.Window{w(50, time.Second)}})
	if err != nil || !reflect.DeepEqual(pol.Windows, []ratelimit.Window{w(50, time.Second), w(100000, 7*day)}) {
		t.Errorf("partner policy = %+v, %v", pol, err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	s, err := plan.Load("")
	if err != nil || !reflect.DeepEqual(s.Names(), plan.Defaults().Names()) {
		t.Fatalf("Load(\"\") = %v, %v; want the built-in plans", s, err)
	}
	missing := filepath.Join(t.TempDir(), "plans.yaml")
	if _, err := plan.Load(missing); err == nil || !strings.Contains(err.Error(), "plans file") {
		t.Fatalf("Load(missing) error = %v", err)
	}
	bad := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(bad, []byte("plans: {free: {quotas: [{limit: 0, period: 1m}]}}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Load(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "plans.free.quotas[0].limit") {
		t.Fatalf("Load(bad) error = %v, want it to name the file and the field", err)
	}
}

func TestParseMerges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		check func(t *testing.T, s *plan.Set)
	}{
		{"no plans keeps the defaults", "plans: {}", func(t *testing.T, s *plan.Set) {
			if !reflect.DeepEqual(s.Names(), plan.Defaults().Names()) {
				t.Errorf("names = %v", s.Names())
			}
		}},
		{"null plans keeps the defaults", "plans:\n", func(t *testing.T, s *plan.Set) {
			if !reflect.DeepEqual(s.Names(), plan.Defaults().Names()) {
				t.Errorf("names = %v", s.Names())
			}
		}},
		{"empty entry keeps a built-in plan", "plans: {free: {}}", func(t *testing.T, s *plan.Set) {
			p, _ := s.Lookup("free")
			d, _ := plan.Defaults().Lookup("free")
			if !reflect.DeepEqual(p, d) {
				t.Errorf("free = %+v, want %+v", p, d)
			}
		}},
		{"quotas replace the whole list and keep the ban", "plans: {free: {quotas: [{limit: 10, period: 1s}]}}", func(t *testing.T, s *plan.Set) {
			p, _ := s.Lookup("free")
			d, _ := plan.Defaults().Lookup("free")
			if !reflect.DeepEqual(p.Windows, []ratelimit.Window{w(10, time.Second)}) || p.Ban != d.Ban {
				t.Errorf("free = %+v", p)
			}
		}},
		{"ban false disables", "plans: {free: {ban: false}}", func(t *testing.T, s *plan.Set) {
			if p, _ := s.Lookup("free"); p.Ban.Enabled() {
				t.Errorf("free ban = %+v", p.Ban)
			}
		}},
		{"ban defaults", "plans: {free: {ban: {threshold: 5, within: 10s, duration: 2h}}}", func(t *testing.T, s *plan.Set) {
			p, _ := s.Lookup("free")
			want := ratelimit.BanPolicy{Threshold: 5, StrikeWindow: 10 * time.Second, Base: 2 * time.Hour, Multiplier: 2, Max: 2 * time.Hour, Memory: day}
			if p.Ban != want {
				t.Errorf("ban = %+v, want %+v", p.Ban, want)
			}
		}},
		{"enterprise can get default quotas", "plans: {enterprise: {quotas: [{limit: 1000, period: 1m}]}}", func(t *testing.T, s *plan.Set) {
			p, _ := s.Lookup("enterprise")
			if !p.PerKey || len(p.Windows) != 1 {
				t.Errorf("enterprise = %+v", p)
			}
		}},
		{"a plan can stop being per key", "plans: {enterprise: {per_key: false, quotas: [{limit: 1, period: 1s}]}}", func(t *testing.T, s *plan.Set) {
			if _, err := s.Policy("enterprise", plan.Overrides{}); err != nil {
				t.Errorf("Policy(enterprise) = %v", err)
			}
		}},
		{"a plan in shadow mode", "plans: {pro: {mode: shadow}, gold: {mode: shadow, quotas: [{limit: 1, period: 1s}]}, free: {mode: enforce}}", func(t *testing.T, s *plan.Set) {
			for name, want := range map[string]bool{"pro": true, "gold": true, "free": false, "business": false} {
				pol, err := s.Policy(name, plan.Overrides{})
				if err != nil || pol.Shadow != want {
					t.Errorf("Policy(%s) = %+v, %v; want Shadow %v", name, pol, err, want)
				}
			}
			if p, _ := s.Lookup("pro"); len(p.Windows) != 2 || p.Ban.Threshold == 0 {
				t.Errorf("pro in shadow mode keeps its quotas and ban: %+v", p)
			}
		}},
		{"a candidate beside the enforced quotas", "plans: {pro: {candidate: {quotas: [{limit: 500, period: 24h}, {limit: 200, period: 1m}]}}}", func(t *testing.T, s *plan.Set) {
			pol, err := s.Policy("pro", plan.Overrides{})
			want := []ratelimit.Window{{Limit: 200, Period: time.Minute}, {Limit: 500, Period: day}}
			if err != nil || !reflect.DeepEqual(pol.Candidate, want) || len(pol.Windows) != 2 || pol.Windows[0].Limit != 300 {
				t.Errorf("Policy(pro) = %+v, %v; want the built-in quotas and candidate %v", pol, err, want)
			}
			if pol, _ := s.Policy("free", plan.Overrides{}); pol.Candidate != nil {
				t.Errorf("free has a candidate: %+v", pol.Candidate)
			}
		}},
		{"a candidate with a ban policy", "plans: {pro: {candidate: {quotas: [{limit: 100, period: 1m}], ban: {threshold: 3, within: 10s, duration: 30s}}}, free: {candidate: {quotas: [{limit: 9, period: 1m}], ban: off}}}", func(t *testing.T, s *plan.Set) {
			pol, err := s.Policy("pro", plan.Overrides{})
			want := ratelimit.BanPolicy{Threshold: 3, StrikeWindow: 10 * time.Second, Base: 30 * time.Second, Multiplier: 2, Max: time.Hour, Memory: day}
			if err != nil || pol.CandidateBan != want || pol.Ban.Threshold == 0 || pol.Ban == want {
				t.Errorf("Policy(pro) = %+v, %v; want candidate ban %+v beside the built-in ban", pol, err, want)
			}
			if pol, _ := s.Policy("free", plan.Overrides{}); pol.CandidateBan.Enabled() || len(pol.Candidate) != 1 {
				t.Errorf("free: candidate %v ban %+v, want a candidate that bans nothing", pol.Candidate, pol.CandidateBan)
			}
			if pol, _ := s.Policy("business", plan.Overrides{}); pol.CandidateBan.Enabled() || pol.Candidate != nil {
				t.Errorf("business: candidate %v ban %+v, want none", pol.Candidate, pol.CandidateBan)
			}
		}},
		{"names in any case", "plans: {Gold: {quotas: [{limit: 1, period: 1s}]}, PRO: {remove: true}}", func(t *testing.T, s *plan.Set) {
			if got := s.Names(); !reflect.DeepEqual(got, []string{"business", "enterprise", "free", "gold", "loadtest"}) {
				t.Errorf("names = %v", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := plan.Parse([]byte(tt.file))
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file string
		want []string // each must appear in the error
	}{
		{"unknown top-level field", "plan: {}", []string{"plan (line 1): unknown field"}},
		{"unknown plan field", "plans:\n  free:\n    quota: []\n", []string{"plans.free.quota (line 3): unknown field"}},
		{"unknown quota field", "plans:\n  pro:\n    quotas: [{limit: 1, period: 1s, burst: 2}]\n", []string{"plans.pro.quotas[0].burst (line 3): unknown field"}},
		{"unknown ban field", "plans:\n  pro:\n    ban: {threshold: 1, within: 1m, duration: 1m, forever: true}\n", []string{"plans.pro.ban.forever (line 3): unknown field"}},
		{"limit of the wrong type", "plans:\n  free:\n    quotas:\n      - limit: sixty\n        period: 1m\n", []string{`plans.free.quotas[0].limit (line 4): want a whole number, got text "sixty"`}},
		{"limit as a fraction", "plans: {free: {quotas: [{limit: 1.5, period: 1m}]}}", []string{`plans.free.quotas[0].limit (line 1): want a whole number, got a number "1.5"`}},
		{"limit a mapping", "plans:\n  free:\n    quotas: [{limit: {a: 1}}]\n", []string{"plans.free.quotas[0].limit (line 3): want a whole number, got a mapping"}},
		{"quotas not a list", "plans:\n  free:\n    quotas: 60\n", []string{"plans.free.quotas (line 3): want a list"}},
		{"per_key not a boolean", "plans:\n  free:\n    per_key: [1]\n", []string{"plans.free.per_key (line 3): want true or false, got a list"}},
		{"ban neither off nor mapping", "plans:\n  free:\n    ban: on\n", []string{`plans.free.ban (line 3): want "off" or a mapping, got text "on"`}},
		{"plans not a mapping", "plans: [free]", []string{"plans (line 1): want a mapping, got a list"}},
		{"bad period", "plans:\n  free:\n    quotas: [{limit: 1, period: 7x}]\n", []string{`plans.free.quotas[0].period (line 3): period "7x": want a duration`}},
		{"period too long", "plans:\n  free:\n    quotas:\n      - {limit: 1, period: 1m}\n      - {limit: 9, period: 367d}\n", []string{`plans.free.quotas[1].period (line 5): period "367d": must be at most 366d`}},
		{"missing period", "plans:\n  free:\n    quotas:\n      - limit: 1\n", []string{"plans.free.quotas[0].period (line 4): required"}},
		{"limit below 1", "plans:\n  free:\n    quotas:\n      - {limit: 0, period: 1m}\n", []string{"plans.free.quotas[0].limit (line 4): must be from 1 to 1000000000, got 0"}},
		{"limit above the maximum", "plans:\n  free:\n    quotas:\n      - period: 1m\n        limit: 1000000001\n", []string{"plans.free.quotas[0].limit (line 5): must be from 1 to 1000000000, got 1000000001"}},
		{"duplicate periods", "plans:\n  free:\n    quotas:\n      - {limit: 1, period: 1m}\n      - {limit: 2, period: 60s}\n", []string{"plans.free.quotas[1].period (line 5): 1m is also the period of plans.free.quotas[0]"}},
		{"duplicate plan names", "plans:\n  gold: {quotas: [{limit: 1, period: 1s}]}\n  gold: {quotas: [{limit: 2, period: 1s}]}\n", []string{"plans.gold (line 3): defined twice (first at line 2)"}},
		{"duplicate plan names in other case", "plans:\n  Gold: {quotas: [{limit: 1, period: 1s}]}\n  gold: {quotas: [{limit: 2, period: 1s}]}\n", []string{`plans.gold (line 3): plan "gold" is already defined as "Gold"`}},
		{"bad plan name", "plans:\n  'gold plan': {quotas: [{limit: 1, period: 1s}]}\n", []string{"plans.gold plan (line 2): plan name must be a lowercase identifier"}},
		{"new plan without quotas", "plans:\n  gold: {}\n", []string{`plans.gold.quotas (line 2): plan "gold" needs at least one quota`}},
		{"remove with fields", "plans:\n  free:\n    remove: true\n    ban: off\n", []string{"plans.free.remove (line 3): a removed plan takes no other field"}},
		{"remove with a mode", "plans: {free: {remove: true, mode: shadow}}", []string{"plans.free.remove (line 1): a removed plan takes no other field"}},
		{"unknown mode", "plans:\n  free:\n    mode: dry-run\n", []string{`plans.free.mode (line 3): must be enforce or shadow, not "dry-run"`}},
		{"ban without threshold", "plans:\n  free:\n    ban:\n      within: 1m\n      duration: 1m\n", []string{"plans.free.ban.threshold (line 3): required (or write ban: off)"}},
		{"ban threshold below 1", "plans:\n  free:\n    ban:\n      within: 1m\n      threshold: 0\n", []string{"plans.free.ban.threshold (line 5): must be from 1 to 1000000000, got 0"}},
		{"ban threshold above the maximum", "plans: {free: {ban: {threshold: 1000000001, within: 1m, duration: 1m}}}", []string{"plans.free.ban.threshold (line 1): must be from 1 to 1000000000"}},
		{"ban without within", "plans:\n  free:\n    ban: {threshold: 1, duration: 1m}\n", []string{"plans.free.ban.within (line 3): required"}},
		{"ban within too long", "plans:\n  free:\n    ban: {threshold: 1, within: 400d, duration: 1m}\n", []string{`plans.free.ban.within (line 3): period "400d": must be at most 366d`}},
		{"ban bad duration", "plans:\n  free:\n    ban:\n      threshold: 1\n      within: 1m\n      duration: soon\n", []string{`plans.free.ban.duration (line 6): period "soon"`}},
		{"ban max below duration", "plans:\n  free:\n    ban: {threshold: 1, within: 1m, duration: 1h, max: 1m}\n", []string{"plans.free.ban.max (line 3): 1m is shorter than duration 1h"}},
		{"ban multiplier below 1", "plans:\n  free:\n    ban: {threshold: 1, within: 1m, duration: 1m, multiplier: 0.5}\n", []string{"plans.free.ban.multiplier (line 3): must be from 1 to 100"}},
		{"ban multiplier not a number", "plans: {free: {ban: {threshold: 1, within: 1m, duration: 1m, multiplier: .nan}}}", []string{"plans.free.ban.multiplier (line 1): must be from 1 to 100"}},
		{"every problem reported", "plans:\n  free: {quotas: [{limit: 0, period: 1m}]}\n  pro: {quotas: [{limit: 1, period: x}]}\n", []string{"plans.free.quotas[0].limit (line 2)", "plans.pro.quotas[0].period (line 3)"}},
		{"candidate without quotas", "plans:\n  free:\n    candidate: {}\n", []string{"plans.free.candidate.quotas (line 3): a candidate needs at least one quota"}},
		{"candidate with a bad quota", "plans:\n  free:\n    candidate:\n      quotas:\n        - {limit: 0, period: 1m}\n        - {limit: 1, period: 1m}\n", []string{"plans.free.candidate.quotas[0].limit (line 5): must be from 1 to 1000000000, got 0", "plans.free.candidate.quotas[1].period (line 6): 1m is also the period of plans.free.candidate.quotas[0]"}},
		{"candidate with an unknown field", "plans:\n  free:\n    candidate: {quotas: [{limit: 1, period: 1m}], within: 1m}\n", []string{"plans.free.candidate.within (line 3): unknown field"}},
		{"candidate ban without a threshold", "plans:\n  free:\n    candidate:\n      quotas: [{limit: 1, period: 1m}]\n      ban: {within: 1m, duration: 1m}\n", []string{"plans.free.candidate.ban.threshold (line 5): required (or write ban: off)"}},
		{"candidate ban with a bad period", "plans:\n  free:\n    candidate:\n      quotas: [{limit: 1, period: 1m}]\n      ban: {threshold: 2, within: 1y, duration: 1m}\n", []string{"plans.free.candidate.ban.within (line 5)"}},
		{"remove with a candidate", "plans: {free: {remove: true, candidate: {quotas: [{limit: 1, period: 1m}]}}}", []string{"plans.free.remove (line 1): a removed plan takes no other field"}},
		{"every decoding problem reported", "plans:\n  free: {quotas: [{limit: a, period: 1m}]}\n  pro: {quotaz: []}\n", []string{"plans.free.quotas[0].limit (line 2)", "plans.pro.quotaz (line 3): unknown field"}},
		{"two documents", "plans: {}\n---\nplans: {pro: {ban: off}}\n", []string{"plans (line 3): in a second YAML document, which starts on line 2: a plans file holds a single YAML document"}},
		{"empty file", "", []string{`plans (line 1): required, and the file is empty; write "plans: {}"`}},
		{"only comments", "# plans: {}\n\n", []string{"plans (line 1): required, and the file is empty"}},
		{"not YAML", "plans:\n  free:\n    quotas: []\n  pro: x: y\n", []string{"plans.pro (line 4, column 9): not YAML: mapping values are not allowed in this context"}},
		{"not YAML from the start of a line", "plans:\n  free:\n\tquotas: []\n", []string{"line 3, column 1: not YAML: found character that cannot start any token (after plans.free, line 2)"}},
		// The parser stops at the end of the file, in the mapping pro opens
		// on line 3 (YAML's own message names line 2, free's).
		{"not YAML: a flow mapping left open", "plans:\n  free: {quotas: [{limit: 1, period: 1m}]}\n  pro: {quotas: [{limit: 1, period: 1m}]\n",
			[]string{"line 4, column 1, the end of the file: not YAML: did not find expected ',' or '}' while parsing a flow mapping (plans.pro, line 3, column 8)"}},
		// The parser stops at the key indented too far (YAML's own message
		// names line 1).
		{"not YAML: a key indented too far", "plans:\n  free:\n    quotas: [{limit: 1, period: 1m}]\n   pro: {}\n",
			[]string{"line 4, column 4: not YAML: did not find expected key (after plans.free.quotas[0].period, line 3)"}},
		{"not YAML: a list left open before the next plan", "plans:\n  pro: {quotas: [{limit: 1, period: 1m}}\n  free: {}\n",
			[]string{"plans.pro (line 2, column 40): not YAML: did not find expected ',' or ']' while parsing a flow sequence (plans.pro, line 2, column 17)"}},
		{"not YAML: a quotation mark left open", "plans:\n  free:\n    mode: \"shadow\n    quotas: []\n",
			[]string{"line 5, column 1, the end of the file: not YAML: found unexpected end of stream while parsing a quoted scalar (plans.free.mode, line 3, column 11)"}},
		{"not YAML: an entry where a field belongs", "plans:\n  free:\n    quotas: []\n  - pro\n",
			[]string{"line 4, column 3: not YAML: did not find expected key (after plans.free.quotas, line 3)"}},
		{"not YAML on the last line without a newline", "plans: [",
			[]string{"plans (line 1, column 9, the end of the file): not YAML: did not find expected node content"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := plan.Parse([]byte(tt.file))
			if err == nil {
				t.Fatalf("Parse() = %v, want an error", s.Names())
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Parse() error = %q\nwant it to contain %q", err, want)
				}
			}
		})
	}
}
