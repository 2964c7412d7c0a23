package plan

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/yamlerr"
	"github.com/animal-store/petstore/ratelimit"
)

// Load reads the plans file at path (see Parse). An empty path means no
// file: the built-in plans.
func Load(path string) (*Set, error) {
	if path == "" {
		return Defaults(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plans file: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("plans file %s: %w", path, err)
	}
	return s, nil
}

// Parse decodes a plans file and merges it over the built-in plans.
//
// The file is YAML with one key, plans, mapping plan names to definitions.
// A name that is built in changes only the fields the entry sets; any other
// name adds a plan. Names are lowercase identifiers (a-z, 0-9, '-', '_',
// starting with a letter) and are accepted in any case.
//
//	plans:
//	  free:                       # built in: redefine its quotas, keep its ban
//	    quotas:
//	      - {limit: 60, period: 1m}
//	      - {limit: 1000, period: 24h}
//	  pro:
//	    ban: off                  # keep pro's quotas, never ban pro keys
//	  business:
//	    ban: {threshold: 300, within: 1m, duration: 1m, multiplier: 2, max: 30m, memory: 24h}
//	  enterprise: {remove: true}  # no such plan any more
//	  tiny-test:                  # a new plan
//	    quotas: [{limit: 3, period: 10s}]
//	  partner:
//	    per_key: true             # each key must carry its own quotas
//	    quotas: [{limit: 100, period: 1s}, {limit: 100000, period: 7d}]
//
// Fields of a plan, all optional:
//
//   - quotas: list of {limit, period}; limit is a whole number of at least
//     1, period is a duration such as 1s, 10s, 1m, 24h or 7d (a day is 24h;
//     see ParsePeriod), at least 1ms; no two quotas may share a period. The
//     list replaces the plan's whole list. A plan that is not built in must
//     have quotas unless it is per_key.
//   - ban: "off" (never ban), or a mapping: threshold (required, at least 1:
//     a key with more rejected requests than this within `within` is
//     banned), within (required), duration (required: length of a first
//     ban), multiplier (at least 1; default 2: each further offence
//     multiplies the ban), max (longest ban; default 1h, or duration if
//     longer), memory (how long offences count towards the next ban;
//     default 24h). Left out: a built-in plan keeps its ban, a new plan gets
//     StandardBan of its quotas.
//   - per_key: true when quotas are agreed per key (as for enterprise):
//     every key on the plan must carry at least one quota of its own, which
//     replaces the plan's quota of the same period or adds one.
//   - mode: "enforce" (the default) or "shadow": a shadow plan's limits,
//     strikes and bans are evaluated and recorded on every request (metrics
//     petstore_ratelimit_shadow_decisions_total and _shadow_bans_total, a
//     debug log line per refusal it would have made) but never enforced:
//     its keys are always served, without rate-limit headers. For
//     introducing limits on a plan that had none. Left out, a plan keeps
//     its mode (built-in plans enforce).
//   - candidate: {quotas: [...]} proposed quotas, measured beside the
//     enforced ones on every request and never refusing one: what they
//     would have admitted and limited goes to
//     petstore_ratelimit_candidate_decisions_total{plan,outcome}, and
//     `petstore limits show` reports their usage. Left out, the plan has no
//     candidate (its records expire within their period).
//   - remove: true drops the plan (only with no other field). Keys on a
//     removed plan are then rejected.
//
// Decoding is strict: unknown fields, wrong types, bad periods, a limit
// below 1, two quotas with one period and a plan named twice (in any case)
// are errors naming the plan and the field. An empty file leaves the
// built-in plans as they are.
func Parse(data []byte) (*Set, error) {
	var f fileSpec
	if err := yamlerr.DecodeStrict(data, &f, "plans file"); err != nil {
		return nil, locate(data, err)
	}
	return f.build()
}

type fileSpec struct {
	Plans map[string]planSpec `yaml:"plans"`
}

type planSpec struct {
	Quotas    *[]Quota       `yaml:"quotas"`
	Ban       *banSpec       `yaml:"ban"`
	PerKey    *bool          `yaml:"per_key"`
	Mode      *string        `yaml:"mode"`
	Candidate *candidateSpec `yaml:"candidate"`
	Remove    bool           `yaml:"remove"`
}

// candidateSpec is a plan's candidate: quotas measured on live traffic
// beside the enforced ones, never refusing a request.
type candidateSpec struct {
	Quotas []Quota `yaml:"quotas"`
}

// Quota is one {limit, period} entry as written in the plans and keys
// files; ParsePeriod reads its period.
type Quota struct {
	Limit  Count  `yaml:"limit"`
	Period string `yaml:"period"`
}

// Count is a whole number in a YAML file. The decoder alone would truncate
// 1.5 to 1.
type Count int64

// UnmarshalYAML accepts integers only.
func (c *Count) UnmarshalYAML(n *yaml.Node) error {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		value := ""
		if n.Kind == yaml.ScalarNode {
			value = " `" + n.Value + "`"
		}
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s%s into int64", n.Line, n.ShortTag(), value)}}
	}
	*c = Count(v)
	return nil
}

// banSpec is "off" or a mapping of ban settings.
type banSpec struct {
	Off        bool
	Threshold  *Count   `yaml:"threshold"`
	Within     string   `yaml:"within"`
	Duration   string   `yaml:"duration"`
	Multiplier *float64 `yaml:"multiplier"`
	Max        string   `yaml:"max"`
	Memory     string   `yaml:"memory"`
}

// maxMultiplier bounds ban growth to something a person would configure.
const maxMultiplier = 100

var banFields = map[string]bool{"threshold": true, "within": true, "duration": true, "multiplier": true, "max": true, "memory": true}

// UnmarshalYAML accepts "off" (or false) and otherwise decodes the mapping
// as strictly as the rest of the file: a custom unmarshaler does not
// inherit the decoder's KnownFields, so fields are checked here.
func (b *banSpec) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if v := strings.ToLower(n.Value); (n.ShortTag() == "!!str" && v == "off") || (n.ShortTag() == "!!bool" && v == "false") {
			*b = banSpec{Off: true}
			return nil
		}
	case yaml.MappingNode:
		var unknown []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; !banFields[k.Value] {
				unknown = append(unknown, fmt.Sprintf("line %d: field %s not found in type plan.banSpec", k.Line, k.Value))
			}
		}
		if len(unknown) > 0 {
			return &yaml.TypeError{Errors: unknown}
		}
		type plain banSpec // without this method
		return n.Decode((*plain)(b))
	}
	value := ""
	if n.Kind == yaml.ScalarNode {
		value = " `" + n.Value + "`"
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s%s into plan.banSpec", n.Line, n.ShortTag(), value)}}
}

// build merges the file's plans over the built-in ones.
func (f fileSpec) build() (*Set, error) {
	plans := make(map[string]Plan)
	for _, p := range defaultPlans() {
		plans[p.Name] = p
	}
	names := make([]string, 0, len(f.Plans))
	for name := range f.Plans {
		names = append(names, name)
	}
	sort.Strings(names)

	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	seen := make(map[string]string, len(names))
	for _, raw := range names {
		spec := f.Plans[raw]
		name := Normalize(raw)
		at := "plans." + raw
		if !ValidName(name) {
			fail("%s: plan name must be a lowercase identifier (a-z, 0-9, '-' or '_', starting with a letter, at most 63 characters)", at)
			continue
		}
		if first, dup := seen[name]; dup {
			fail("%s: plan %q is already defined as %q", at, name, first)
			continue
		}
		seen[name] = raw
		if spec.Remove {
			if spec.Quotas != nil || spec.Ban != nil || spec.PerKey != nil || spec.Mode != nil || spec.Candidate != nil {
				fail("%s.remove: a removed plan takes no other field", at)
			}
			delete(plans, name)
			continue
		}
		p, builtin := plans[name]
		if !builtin {
			p = Plan{Name: name}
		}
		if spec.PerKey != nil {
			p.PerKey = *spec.PerKey
		}
		if spec.Mode != nil {
			switch *spec.Mode {
			case "enforce":
				p.Shadow = false
			case "shadow":
				p.Shadow = true
			default:
				fail("%s.mode: must be enforce or shadow, not %q", at, *spec.Mode)
			}
		}
		if spec.Quotas != nil {
			ws, qerrs := spec.quotas(at + ".quotas")
			errs = append(errs, qerrs...)
			p.Windows = ws
		}
		if spec.Candidate != nil {
			if len(spec.Candidate.Quotas) == 0 {
				fail("%s.candidate.quotas: a candidate needs at least one quota (leave candidate out to drop it)", at)
			}
			q := spec
			q.Quotas = &spec.Candidate.Quotas
			ws, qerrs := q.quotas(at + ".candidate.quotas")
			errs = append(errs, qerrs...)
			p.Candidate = ws
		} else {
			p.Candidate = nil
		}
		if len(p.Windows) == 0 && !p.PerKey {
			fail("%s.quotas: plan %q needs at least one quota unless per_key is true", at, name)
		}
		switch {
		case spec.Ban != nil:
			ban, err := spec.Ban.policy()
			if err != nil {
				fail("%s.ban.%v", at, err)
			}
			p.Ban = ban
		case !builtin:
			p.Ban = StandardBan(p.Windows)
		}
		plans[name] = p
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	list := make([]Plan, 0, len(plans))
	for _, p := range plans {
		list = append(list, p)
	}
	return NewSet(list...)
}

func (s planSpec) quotas(at string) ([]ratelimit.Window, []string) {
	var errs []string
	ws := make([]ratelimit.Window, 0, len(*s.Quotas))
	periods := make(map[time.Duration]int)
	for i, q := range *s.Quotas {
		qat := fmt.Sprintf("%s[%d]", at, i)
		if q.Limit < 1 {
			errs = append(errs, fmt.Sprintf("%s.limit: must be at least 1, got %d", qat, q.Limit))
		}
		if q.Period == "" {
			errs = append(errs, fmt.Sprintf("%s.period: required", qat))
			continue
		}
		d, err := ParsePeriod(q.Period)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s.period: %v", qat, err))
			continue
		}
		if j, dup := periods[d]; dup {
			errs = append(errs, fmt.Sprintf("%s.period: %s is also the period of %s[%d]", qat, ratelimit.FormatPeriod(d), at, j))
			continue
		}
		periods[d] = i
		ws = append(ws, ratelimit.Window{Limit: int64(q.Limit), Period: d})
	}
	return ws, errs
}

// policy returns the ban policy; its errors start with the field's name.
func (b banSpec) policy() (ratelimit.BanPolicy, error) {
	if b.Off {
		return ratelimit.BanPolicy{}, nil
	}
	period := func(field, v string, def time.Duration) (time.Duration, error) {
		if v == "" {
			if def == 0 {
				return 0, fmt.Errorf("%s: required", field)
			}
			return def, nil
		}
		d, err := ParsePeriod(v)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", field, err)
		}
		return d, nil
	}
	if b.Threshold == nil {
		return ratelimit.BanPolicy{}, errors.New("threshold: required (or write ban: off)")
	}
	if *b.Threshold < 1 {
		return ratelimit.BanPolicy{}, fmt.Errorf("threshold: must be at least 1, got %d", *b.Threshold)
	}
	p := ratelimit.BanPolicy{Threshold: int64(*b.Threshold), Multiplier: banMultiplier}
	var err error
	if p.StrikeWindow, err = period("within", b.Within, 0); err != nil {
		return p, err
	}
	if p.Base, err = period("duration", b.Duration, 0); err != nil {
		return p, err
	}
	if p.Max, err = period("max", b.Max, max(banMax, p.Base)); err != nil {
		return p, err
	}
	if p.Max < p.Base {
		return p, fmt.Errorf("max: %s is shorter than duration %s", ratelimit.FormatPeriod(p.Max), ratelimit.FormatPeriod(p.Base))
	}
	if p.Memory, err = period("memory", b.Memory, banMemory); err != nil {
		return p, err
	}
	if b.Multiplier != nil {
		if m := *b.Multiplier; !(m >= 1 && m <= maxMultiplier) {
			return p, fmt.Errorf("multiplier: must be from 1 to %d, got %g", maxMultiplier, m)
		}
		p.Multiplier = *b.Multiplier
	}
	return p, nil
}
