// Package plan holds the subscription plans that decide an API key's request
// quotas and ban rules.
//
// Plans are data, not code: the built-in Free, Pro, Business and Enterprise
// plans (see Defaults) can be redefined and new plans added by a YAML plans
// file (see Parse for its schema). A Set is immutable once built, so a
// reloaded file is swapped in whole and readers never see half an update.
package plan

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// Names of the built-in plans.
const (
	Free       = "free"
	Pro        = "pro"
	Business   = "business"
	Enterprise = "enterprise"
	LoadTest   = "loadtest"
)

// ErrUnknownPlan is returned for a plan name that the set does not define.
var ErrUnknownPlan = errors.New("plan: unknown plan")

// Plan is a named set of quotas and ban rules.
type Plan struct {
	// Name is the plan's lowercase identifier.
	Name string
	// Windows are the plan's default quotas; keys may override them.
	Windows []ratelimit.Window
	// Ban decides when a key that keeps sending requests while limited is
	// banned for a while. The zero value never bans.
	Ban ratelimit.BanPolicy
	// PerKey means quotas are agreed per key (Enterprise): every key on the
	// plan must carry overrides for at least one window.
	PerKey bool
	// Candidate holds proposed quotas measured beside Windows on live
	// traffic, never enforced (ratelimit.Policy.Candidate). A key's own
	// candidate quotas override them as its quotas override Windows.
	// CandidateBan is the ban policy they would enforce
	// (ratelimit.Policy.CandidateBan; zero: none).
	Candidate    []ratelimit.Window
	CandidateBan ratelimit.BanPolicy
	// Shadow evaluates and records the plan's limits, strikes and bans on
	// every request but enforces none of them: for introducing limits on a
	// plan that had none (mode: shadow in the plans file).
	Shadow bool
}

// Standard ban settings. A key is banned after more rejected requests within
// banStrikeWindow than its threshold; a first ban lasts banBase and each
// further offence remembered within banMemory doubles it, up to banMax.
const (
	banMinThreshold = 20
	banStrikeWindow = time.Minute
	banBase         = time.Minute
	banMultiplier   = 2
	banMax          = time.Hour
	banMemory       = 24 * time.Hour
)

// StandardBan is the ban policy a plan gets when its definition does not
// set one. It scales with the plan's tightest quota: the threshold is a
// third of that quota's per-minute rate, and never less than 20. A client
// that keeps going for a third of a minute's quota after being told to
// wait is ignoring Retry-After, while a client retrying with backoff gets
// nowhere near it; larger plans run more concurrent workers and so see
// more rejections before they all back off.
func StandardBan(windows []ratelimit.Window) ratelimit.BanPolicy {
	threshold := int64(banMinThreshold)
	if len(windows) > 0 {
		tight := windows[0]
		for _, w := range windows[1:] {
			if w.Period < tight.Period {
				tight = w
			}
		}
		perMinute := float64(tight.Limit) * float64(time.Minute) / float64(tight.Period)
		if t := int64(perMinute / 3); t > threshold {
			threshold = t
		}
	}
	return ratelimit.BanPolicy{
		Threshold:    threshold,
		StrikeWindow: banStrikeWindow,
		Base:         banBase,
		Multiplier:   banMultiplier,
		Max:          banMax,
		Memory:       banMemory,
	}
}

// enterpriseBan is fixed because Enterprise quotas are set per key: 500
// rejections a minute is above the standard threshold of any key under
// 1500 requests a minute, and bans stop at 15 minutes because a long outage
// of a contracted integration costs more than the load it sheds.
var enterpriseBan = ratelimit.BanPolicy{
	Threshold:    500,
	StrikeWindow: banStrikeWindow,
	Base:         banBase,
	Multiplier:   banMultiplier,
	Max:          15 * time.Minute,
	Memory:       banMemory,
}

// Defaults returns the built-in plans, with the rates of the Animal Store
// API (requests per minute and per day):
//
//	free        60/1m    1000/24h     banned after 20 rejections in 1m
//	pro        300/1m   10000/24h     banned after 100 rejections in 1m
//	business  1000/1m  100000/24h     banned after 333 rejections in 1m
//	enterprise quotas agreed per key  banned after 500 rejections in 1m (max 15m)
//	loadtest 60000/1m  10000000/24h   banned after 20000 rejections in 1m
//
// A first ban lasts 1m, doubling with each offence within 24h, up to 1h.
//
// The loadtest plan is for load-testing a deployment: 1,000 requests/s per
// key, so a load test measures the service rather than its quotas, while
// still running every request through the limiter (every window, the
// strike count and the ban check) as a production key would. Issue keys on
// it only to load-test clients.
func Defaults() *Set { return build(defaultPlans()) }

func defaultPlans() []Plan {
	day := 24 * time.Hour
	withBan := func(name string, ws ...ratelimit.Window) Plan {
		return Plan{Name: name, Windows: ws, Ban: StandardBan(ws)}
	}
	return []Plan{
		withBan(Free, ratelimit.Window{Limit: 60, Period: time.Minute}, ratelimit.Window{Limit: 1000, Period: day}),
		withBan(Pro, ratelimit.Window{Limit: 300, Period: time.Minute}, ratelimit.Window{Limit: 10000, Period: day}),
		withBan(Business, ratelimit.Window{Limit: 1000, Period: time.Minute}, ratelimit.Window{Limit: 100000, Period: day}),
		{Name: Enterprise, PerKey: true, Ban: enterpriseBan},
		withBan(LoadTest, ratelimit.Window{Limit: 60000, Period: time.Minute}, ratelimit.Window{Limit: 10000000, Period: day}),
	}
}

// Set is an immutable collection of plans, looked up by name.
type Set struct {
	plans map[string]Plan
	names []string
	// file holds the names a plans file defined, changed or removed.
	file map[string]bool
}

// NewSet returns a set of the given plans, each valid on its own and named
// uniquely.
func NewSet(plans ...Plan) (*Set, error) {
	seen := make(map[string]bool, len(plans))
	for _, p := range plans {
		if err := p.validate(); err != nil {
			return nil, err
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("plan %q: defined twice", p.Name)
		}
		seen[p.Name] = true
	}
	return build(plans), nil
}

// build makes a set of plans already known to be valid.
func build(plans []Plan) *Set {
	s := &Set{plans: make(map[string]Plan, len(plans))}
	for _, p := range plans {
		p.Windows = sortedWindows(p.Windows)
		s.plans[p.Name] = p
		s.names = append(s.names, p.Name)
	}
	sort.Strings(s.names)
	return s
}

// validate checks what a plan needs on its own; keys' overrides are checked
// by Policy.
func (p Plan) validate() error {
	if !ValidName(p.Name) {
		return fmt.Errorf("plan %q: name must be a lowercase identifier (a-z, 0-9, '-' or '_', starting with a letter, at most 63 characters)", p.Name)
	}
	if len(p.Windows) == 0 && !p.PerKey {
		return fmt.Errorf("plan %q: no quotas: give at least one, or set per_key", p.Name)
	}
	if len(p.Windows) > 0 {
		if err := (ratelimit.Policy{Name: p.Name, Windows: p.Windows, Ban: p.Ban, Candidate: p.Candidate}).Validate(); err != nil {
			return fmt.Errorf("plan %q: %w", p.Name, err)
		}
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// ValidName reports whether name is a plan identifier: lowercase letters,
// digits, '-' and '_', starting with a letter, at most 63 characters.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Normalize returns name as the plan identifier it stands for: plan names
// are accepted in any case in files and on the command line.
func Normalize(name string) string { return strings.ToLower(strings.TrimSpace(name)) }

// Lookup returns the plan called name (in any case).
func (s *Set) Lookup(name string) (Plan, bool) {
	p, ok := s.plans[Normalize(name)]
	if !ok {
		return Plan{}, false
	}
	p.Windows = slices.Clone(p.Windows)
	return p, true
}

// Names returns the names of all plans in alphabetical order.
func (s *Set) Names() []string { return slices.Clone(s.names) }

// FromFile reports whether the plans file the set was parsed from defines
// the plan called name, or changes or removes the built-in plan of that
// name, even to the values it had.
func (s *Set) FromFile(name string) bool { return s.file[Normalize(name)] }

// Removed returns the built-in plans the plans file removed, in
// alphabetical order.
func (s *Set) Removed() []string {
	var out []string
	for _, p := range defaultPlans() {
		if _, ok := s.plans[p.Name]; !ok && s.file[p.Name] {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Overrides are one key's own limits, merged over its plan's by Policy.
type Overrides struct {
	// Quotas replace the plan's enforced window of the same period, or add
	// a window.
	Quotas []ratelimit.Window
	// Candidate windows replace the plan's candidate window of the same
	// period, or add one, exactly as Quotas do for the enforced windows: a
	// key can carry a candidate of its own whether or not its plan has one.
	Candidate []ratelimit.Window
}

// Policy returns the rate-limit policy for a key on planName with the key's
// overrides: each of the key's quotas replaces the plan's window of the
// same period or adds a window, and each of its candidate quotas does the
// same to the plan's candidate windows. The policy is named after the
// plan, its windows and candidate windows are ordered by period, and it is
// valid for the limiter.
func (s *Set) Policy(planName string, o Overrides) (ratelimit.Policy, error) {
	p, ok := s.plans[Normalize(planName)]
	if !ok {
		return ratelimit.Policy{}, fmt.Errorf("%w %q", ErrUnknownPlan, planName)
	}
	if p.PerKey && len(o.Quotas) == 0 {
		return ratelimit.Policy{}, fmt.Errorf("plan %q: quotas are agreed per key, and this key has none", p.Name)
	}
	windows, err := override(p.Windows, o.Quotas)
	if err != nil {
		return ratelimit.Policy{}, fmt.Errorf("plan %q: %w", p.Name, err)
	}
	candidate, err := override(p.Candidate, o.Candidate)
	if err != nil {
		return ratelimit.Policy{}, fmt.Errorf("plan %q: candidate: %w", p.Name, err)
	}
	pol := ratelimit.Policy{Name: p.Name, Windows: windows, Ban: p.Ban, Shadow: p.Shadow}
	if len(candidate) > 0 {
		pol.Candidate, pol.CandidateBan = candidate, p.CandidateBan
	}
	if err := pol.Validate(); err != nil {
		return ratelimit.Policy{}, fmt.Errorf("plan %q: %w", p.Name, err)
	}
	return pol, nil
}

// override returns the windows of a plan (base) with a key's overrides
// applied: an override replaces base's window of its period or adds one.
// It is the one place that decides how a key's quotas, enforced or
// candidate, combine with its plan's, and it keeps what the README
// promises of that: every override is in the result, every window of base
// whose period no override names is in it unchanged, nothing else is, and
// the result is ordered by period. base is never changed.
func override(base, overrides []ratelimit.Window) ([]ratelimit.Window, error) {
	out := slices.Clone(base)
	seen := make(map[time.Duration]bool, len(overrides))
	for _, o := range overrides {
		if seen[o.Period] {
			return nil, fmt.Errorf("two overrides for period %s", ratelimit.FormatPeriod(o.Period))
		}
		seen[o.Period] = true
		if i := slices.IndexFunc(out, func(w ratelimit.Window) bool { return w.Period == o.Period }); i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	return sortedWindows(out), nil
}

func sortedWindows(ws []ratelimit.Window) []ratelimit.Window {
	ws = slices.Clone(ws)
	sort.Slice(ws, func(i, j int) bool { return ws[i].Period < ws[j].Period })
	return ws
}
