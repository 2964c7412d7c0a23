package plan_test

import (
	"errors"
	"flag"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

const day = 24 * time.Hour

func w(limit int64, period time.Duration) ratelimit.Window {
	return ratelimit.Window{Limit: limit, Period: period}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	if got, want := s.Names(), []string{"business", "enterprise", "free", "loadtest", "pro"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	tests := []struct {
		name      string
		windows   []ratelimit.Window
		perKey    bool
		threshold int64
		max       time.Duration
	}{
		{plan.Free, []ratelimit.Window{w(60, time.Minute), w(1000, day)}, false, 20, time.Hour},
		{plan.Pro, []ratelimit.Window{w(300, time.Minute), w(10000, day)}, false, 100, time.Hour},
		{plan.Business, []ratelimit.Window{w(1000, time.Minute), w(100000, day)}, false, 333, time.Hour},
		{plan.Enterprise, nil, true, 500, 15 * time.Minute},
		{plan.LoadTest, []ratelimit.Window{w(60000, time.Minute), w(10000000, day)}, false, 20000, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, ok := s.Lookup(tt.name)
			if !ok {
				t.Fatalf("Lookup(%q) found nothing", tt.name)
			}
			if p.Name != tt.name || !reflect.DeepEqual(p.Windows, tt.windows) || p.PerKey != tt.perKey {
				t.Errorf("plan = %+v, want windows %v per-key %v", p, tt.windows, tt.perKey)
			}
			b := p.Ban
			if !b.Enabled() || b.Threshold != tt.threshold || b.StrikeWindow != time.Minute || b.Base != time.Minute ||
				b.Multiplier != 2 || b.Max != tt.max || b.Memory != day {
				t.Errorf("ban = %+v, want threshold %d within 1m, 1m doubling to %s, memory 24h", b, tt.threshold, tt.max)
			}
			overrides := []ratelimit.Window(nil)
			if tt.perKey {
				overrides = []ratelimit.Window{w(5000, time.Minute)}
			}
			pol, err := s.Policy(tt.name, plan.Overrides{Quotas: overrides})
			if err != nil {
				t.Fatalf("Policy: %v", err)
			}
			if pol.Name != tt.name || pol.Ban != b {
				t.Errorf("policy = %+v, want name %q and the plan's ban", pol, tt.name)
			}
		})
	}
}

func TestLookupAnyCase(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	for _, name := range []string{"free", "FREE", " Free "} {
		if p, ok := s.Lookup(name); !ok || p.Name != "free" {
			t.Errorf("Lookup(%q) = %+v, %v; want free", name, p, ok)
		}
	}
	if _, ok := s.Lookup("gold"); ok {
		t.Error("Lookup(gold) found a plan")
	}
}

func TestLookupReturnsACopy(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	p, _ := s.Lookup("free")
	p.Windows[0].Limit = 1
	if q, _ := s.Lookup("free"); q.Windows[0].Limit != 60 {
		t.Fatalf("changing a looked-up plan changed the set: limit %d", q.Windows[0].Limit)
	}
}

func TestPolicyOverrides(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	tests := []struct {
		name      string
		plan      string
		overrides []ratelimit.Window
		want      []ratelimit.Window
		err       string
	}{
		{name: "no overrides", plan: "free", want: []ratelimit.Window{w(60, time.Minute), w(1000, day)}},
		{name: "replace same period", plan: "free", overrides: []ratelimit.Window{w(120, time.Minute)},
			want: []ratelimit.Window{w(120, time.Minute), w(1000, day)}},
		{name: "add a period, kept in order", plan: "pro", overrides: []ratelimit.Window{w(20, time.Second)},
			want: []ratelimit.Window{w(20, time.Second), w(300, time.Minute), w(10000, day)}},
		{name: "replace and add", plan: "business", overrides: []ratelimit.Window{w(1e6, 7*day), w(2000, time.Minute)},
			want: []ratelimit.Window{w(2000, time.Minute), w(100000, day), w(1e6, 7*day)}},
		{name: "plan name in any case", plan: "Pro", want: []ratelimit.Window{w(300, time.Minute), w(10000, day)}},
		{name: "enterprise with its quotas", plan: "enterprise", overrides: []ratelimit.Window{w(1e6, day), w(5000, time.Minute)},
			want: []ratelimit.Window{w(5000, time.Minute), w(1e6, day)}},
		{name: "enterprise without quotas", plan: "enterprise", err: "agreed per key"},
		{name: "unknown plan", plan: "gold", err: "unknown plan"},
		{name: "two overrides for one period", plan: "free", overrides: []ratelimit.Window{w(1, time.Minute), w(2, time.Minute)}, err: "two overrides for period 1m"},
		{name: "override limit below 1", plan: "free", overrides: []ratelimit.Window{w(0, time.Minute)}, err: "limit must be from 1 to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pol, err := s.Policy(tt.plan, plan.Overrides{Quotas: tt.overrides})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Policy() error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Policy(): %v", err)
			}
			if !reflect.DeepEqual(pol.Windows, tt.want) {
				t.Errorf("windows = %v, want %v", pol.Windows, tt.want)
			}
			if pol.Name != plan.Normalize(tt.plan) {
				t.Errorf("policy name = %q, want %q", pol.Name, plan.Normalize(tt.plan))
			}
		})
	}
	if _, err := s.Policy("gold", plan.Overrides{}); !errors.Is(err, plan.ErrUnknownPlan) {
		t.Errorf("Policy(gold) error = %v, want ErrUnknownPlan", err)
	}
}

func TestPolicyDoesNotChangeThePlan(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	if _, err := s.Policy("free", plan.Overrides{Quotas: []ratelimit.Window{w(5, time.Minute), w(7, time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Lookup("free"); !reflect.DeepEqual(p.Windows, []ratelimit.Window{w(60, time.Minute), w(1000, day)}) {
		t.Fatalf("free's windows became %v", p.Windows)
	}
}

func TestStandardBan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		windows []ratelimit.Window
		want    int64
	}{
		{nil, 20},
		{[]ratelimit.Window{w(3, 10*time.Second)}, 20},
		{[]ratelimit.Window{w(600, time.Minute)}, 200},
		{[]ratelimit.Window{w(1e6, day), w(100, time.Second)}, 2000},
	}
	for _, tt := range tests {
		if got := plan.StandardBan(tt.windows).Threshold; got != tt.want {
			t.Errorf("StandardBan(%v).Threshold = %d, want %d", tt.windows, got, tt.want)
		}
	}
}

func TestNewSet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		plans []plan.Plan
		err   string
	}{
		{name: "valid", plans: []plan.Plan{{Name: "a", Windows: []ratelimit.Window{w(1, time.Second)}}, {Name: "b", PerKey: true}}},
		{name: "bad name", plans: []plan.Plan{{Name: "A b", Windows: []ratelimit.Window{w(1, time.Second)}}}, err: "lowercase identifier"},
		{name: "twice", plans: []plan.Plan{{Name: "a", PerKey: true}, {Name: "a", PerKey: true}}, err: "defined twice"},
		{name: "no quotas", plans: []plan.Plan{{Name: "a"}}, err: "no quotas"},
		{name: "bad window", plans: []plan.Plan{{Name: "a", Windows: []ratelimit.Window{w(0, time.Second)}}}, err: "limit must be from 1 to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := plan.NewSet(tt.plans...)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("NewSet() error = %v, want one containing %q", err, tt.err)
			}
		})
	}
}

// A key's candidate quotas combine with its plan's exactly as its quotas
// combine with the plan's enforced ones, and neither list touches the
// other.
func TestPolicyCandidate(t *testing.T) {
	t.Parallel()
	s, err := plan.Parse([]byte(`plans:
  growth:
    quotas: [{limit: 300, period: 1m}, {limit: 10000, period: 24h}]
    candidate: {quotas: [{limit: 200, period: 1m}, {limit: 5000, period: 24h}]}
  partner: {per_key: true, quotas: [{limit: 100, period: 1s}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	growthWindows := []ratelimit.Window{w(300, time.Minute), w(10000, day)}
	tests := []struct {
		name          string
		plan          string
		overrides     plan.Overrides
		windows, want []ratelimit.Window
		err           string
	}{
		{name: "the plan's candidate", plan: "growth",
			windows: growthWindows, want: []ratelimit.Window{w(200, time.Minute), w(5000, day)}},
		{name: "the key's candidate of the same period wins", plan: "growth",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(150, time.Minute)}},
			windows:   growthWindows, want: []ratelimit.Window{w(150, time.Minute), w(5000, day)}},
		{name: "the key's candidate adds a period, kept in order", plan: "growth",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(100000, 7*day), w(10, time.Second)}},
			windows:   growthWindows, want: []ratelimit.Window{w(10, time.Second), w(200, time.Minute), w(5000, day), w(100000, 7*day)}},
		{name: "replace one and add one", plan: "growth",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(1, day), w(20, time.Second)}},
			windows:   growthWindows, want: []ratelimit.Window{w(20, time.Second), w(200, time.Minute), w(1, day)}},
		{name: "a candidate on a plan without one", plan: "free",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(30, time.Minute)}},
			windows:   []ratelimit.Window{w(60, time.Minute), w(1000, day)}, want: []ratelimit.Window{w(30, time.Minute)}},
		{name: "no candidate anywhere", plan: "free",
			windows: []ratelimit.Window{w(60, time.Minute), w(1000, day)}},
		{name: "quotas and candidate, each over its own list", plan: "growth",
			overrides: plan.Overrides{Quotas: []ratelimit.Window{w(400, time.Minute)}, Candidate: []ratelimit.Window{w(9000, day)}},
			windows:   []ratelimit.Window{w(400, time.Minute), w(10000, day)}, want: []ratelimit.Window{w(200, time.Minute), w(9000, day)}},
		{name: "a candidate on a per-key plan", plan: "partner",
			overrides: plan.Overrides{Quotas: []ratelimit.Window{w(50, time.Second)}, Candidate: []ratelimit.Window{w(40, time.Second)}},
			windows:   []ratelimit.Window{w(50, time.Second)}, want: []ratelimit.Window{w(40, time.Second)}},
		{name: "a candidate does not stand in for a per-key plan's quotas", plan: "partner",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(40, time.Second)}}, err: "agreed per key"},
		{name: "two candidate overrides for one period", plan: "growth",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(1, time.Minute), w(2, 60*time.Second)}},
			err:       `plan "growth": candidate: two overrides for period 1m`},
		{name: "candidate limit below 1", plan: "free",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(0, time.Minute)}}, err: "candidate window 0/1m: limit must be from 1 to 1000000000"},
		{name: "candidate limit above the maximum", plan: "free",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(ratelimit.MaxLimit+1, time.Minute)}}, err: "limit must be from 1 to 1000000000"},
		{name: "candidate period below 1ms", plan: "free",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(1, time.Microsecond)}}, err: "period must be from 1ms to"},
		{name: "candidate period above 366d", plan: "free",
			overrides: plan.Overrides{Candidate: []ratelimit.Window{w(1, 367*day)}}, err: "period must be from 1ms to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pol, err := s.Policy(tt.plan, tt.overrides)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Policy() = %+v, %v; want an error containing %q", pol, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Policy(): %v", err)
			}
			if !reflect.DeepEqual(pol.Windows, tt.windows) || !reflect.DeepEqual(pol.Candidate, tt.want) {
				t.Errorf("Policy() windows %v, candidate %v; want %v, %v", pol.Windows, pol.Candidate, tt.windows, tt.want)
			}
		})
	}
	if p, _ := s.Lookup("growth"); !reflect.DeepEqual(p.Candidate, []ratelimit.Window{w(200, time.Minute), w(5000, day)}) {
		t.Errorf("a key's candidate changed its plan's: %v", p.Candidate)
	}
}

var (
	overrideCases = flag.Int("override.cases", 2000, "generated plan and key combinations per override property test")
	overrideSeed  = flag.Uint64("override.seed", 1, "seed of the override property tests (0: random)")
)

// TestPolicyOverrideProperty checks what the README promises of a key's
// quotas and candidate quotas over generated plans and keys, with periods
// drawn so that the key's and the plan's often coincide and limits and
// periods often sit at the ends of their ranges: every window of the key's
// is in the policy; every window of the plan whose period the key does not
// name is in it unchanged; nothing else is; each list is ordered by period
// and valid; and the two lists never mix. make fuzz runs it longer with a
// random seed.
func TestPolicyOverrideProperty(t *testing.T) {
	t.Parallel()
	seed := *overrideSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -override.seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	periods := []time.Duration{ratelimit.MinPeriod, time.Millisecond + 1, time.Second, time.Minute, time.Hour, day, 7 * day, ratelimit.MaxPeriod}
	limit := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 1
		case 1:
			return ratelimit.MaxLimit
		default:
			return 1 + rng.Int64N(ratelimit.MaxLimit)
		}
	}
	// windows returns up to max windows of distinct periods.
	windows := func(max int) []ratelimit.Window {
		var ws []ratelimit.Window
		for _, i := range rng.Perm(len(periods))[:rng.IntN(max+1)] {
			ws = append(ws, w(limit(), periods[i]))
		}
		return ws
	}
	for i := range *overrideCases {
		p := plan.Plan{Name: "p", Windows: windows(4), Candidate: windows(4)}
		if len(p.Windows) == 0 {
			p.PerKey = true
		}
		o := plan.Overrides{Quotas: windows(4), Candidate: windows(4)}
		if p.PerKey && len(o.Quotas) == 0 {
			o.Quotas = windows(1)
			if len(o.Quotas) == 0 {
				o.Quotas = []ratelimit.Window{w(limit(), periods[rng.IntN(len(periods))])}
			}
		}
		s, err := plan.NewSet(p)
		if err != nil {
			t.Fatalf("case %d: NewSet(%+v): %v", i, p, err)
		}
		pol, err := s.Policy("p", o)
		if err != nil {
			t.Fatalf("case %d: Policy(%+v, %+v): %v", i, p, o, err)
		}
		if err := pol.Validate(); err != nil {
			t.Fatalf("case %d: policy %+v is not valid: %v", i, pol, err)
		}
		checkOverride(t, i, "windows", p.Windows, o.Quotas, pol.Windows)
		checkOverride(t, i, "candidate", p.Candidate, o.Candidate, pol.Candidate)
		if got, _ := s.Lookup("p"); !reflect.DeepEqual(got.Candidate, p.Candidate) {
			t.Fatalf("case %d: Policy changed the plan's candidate to %v", i, got.Candidate)
		}

		// The same key with one of its periods twice is refused, naming
		// the list.
		if len(o.Candidate) > 0 {
			dup := o
			dup.Candidate = append(slices.Clone(o.Candidate), w(limit(), o.Candidate[rng.IntN(len(o.Candidate))].Period))
			if _, err := s.Policy("p", dup); err == nil || !strings.Contains(err.Error(), "candidate: two overrides") {
				t.Fatalf("case %d: a candidate period given twice: %v", i, err)
			}
		}
	}
}

// checkOverride checks got, the policy's list made of base and a key's
// overrides.
func checkOverride(t *testing.T, i int, what string, base, overrides, got []ratelimit.Window) {
	t.Helper()
	want := map[time.Duration]int64{}
	for _, b := range base {
		want[b.Period] = b.Limit
	}
	for _, o := range overrides {
		want[o.Period] = o.Limit
	}
	if len(got) != len(want) {
		t.Fatalf("case %d: %s %v from %v and the key's %v: want %d windows", i, what, got, base, overrides, len(want))
	}
	for j, g := range got {
		if j > 0 && got[j-1].Period >= g.Period {
			t.Fatalf("case %d: %s %v not ordered by period", i, what, got)
		}
		if l, ok := want[g.Period]; !ok || l != g.Limit {
			t.Fatalf("case %d: %s %v from %v and the key's %v: window %v is neither the key's nor the plan's left alone", i, what, got, base, overrides, g)
		}
	}
	if len(got) == 0 && got != nil && what == "candidate" {
		t.Fatalf("case %d: an empty candidate is not nil", i)
	}
}
