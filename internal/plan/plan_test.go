package plan_test

import (
	"errors"
	"reflect"
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
			pol, err := s.Policy(tt.name, overrides)
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
			pol, err := s.Policy(tt.plan, tt.overrides)
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
	if _, err := s.Policy("gold", nil); !errors.Is(err, plan.ErrUnknownPlan) {
		t.Errorf("Policy(gold) error = %v, want ErrUnknownPlan", err)
	}
}

func TestPolicyDoesNotChangeThePlan(t *testing.T) {
	t.Parallel()
	s := plan.Defaults()
	if _, err := s.Policy("free", []ratelimit.Window{w(5, time.Minute), w(7, time.Second)}); err != nil {
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
