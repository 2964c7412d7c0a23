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
//   - quotas: list of {limit, period}; limit is a whole number from 1 to
//     1,000,000,000, period is a duration such as 1s, 10s, 1m, 24h or 7d (a
//     day is 24h; see ParsePeriod), from 1ms to 366d; no two quotas may
//     share a period. The
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
//   - candidate: {quotas: [...], ban: ...} proposed quotas, measured beside
//     the enforced ones on every request and never refusing one, and the
//     ban policy they would enforce (written as ban above; left out, the
//     candidate bans nothing): what they would have admitted, limited and
//     refused as banned goes to
//     petstore_ratelimit_candidate_decisions_total{plan,outcome}, the bans
//     they would have issued to petstore_ratelimit_candidate_bans_total,
//     and `petstore limits show` reports their usage and ban. Left out, the
//     plan has no candidate (its records expire within their period).
//   - remove: true drops the plan (only with no other field). Keys on a
//     removed plan are then rejected.
//
// Decoding is strict: unknown fields, wrong types, bad periods, a limit
// out of range, two quotas with one period, a plan named twice (in any
// case), a file that is not YAML and a second YAML document are errors
// naming the field (plans.free.quotas[0].limit) and its line. So is an
// empty file: more likely a file caught half written than a wish to drop
// every change, which "plans: {}" says.
func Parse(data []byte) (*Set, error) {
	var f fileSpec
	if err := yamlerr.DecodeStrict(data, &f, "plans file"); err != nil {
		return nil, locate(data, err)
	}
	s, problems, err := f.build()
	if len(problems) > 0 {
		return nil, place(data, problems)
	}
	return s, err
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
// beside the enforced ones, never refusing a request, and the ban policy
// they would enforce.
type candidateSpec struct {
	Quotas []Quota  `yaml:"quotas"`
	Ban    *banSpec `yaml:"ban"`
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

// problem is one thing wrong in a plans file, at path (plans.free.ban);
// Parse adds the line.
type problem struct {
	path, msg string
}

// build merges the file's plans over the built-in ones; a file with
// problems builds nothing.
func (f fileSpec) build() (*Set, []problem, error) {
	plans := make(map[string]Plan)
	for _, p := range defaultPlans() {
		plans[p.Name] = p
	}
	names := make([]string, 0, len(f.Plans))
	for name := range f.Plans {
		names = append(names, name)
	}
	sort.Strings(names)

	var problems []problem
	fail := func(path, format string, args ...any) {
		problems = append(problems, problem{path, fmt.Sprintf(format, args...)})
	}
	seen := make(map[string]string, len(names))
	file := make(map[string]bool, len(names))
	for _, raw := range names {
		spec := f.Plans[raw]
		name := Normalize(raw)
		at := "plans." + raw
		if !ValidName(name) {
			fail(at, "plan name must be a lowercase identifier (a-z, 0-9, '-' or '_', starting with a letter, at most 63 characters)")
			continue
		}
		if first, dup := seen[name]; dup {
			fail(at, "plan %q is already defined as %q", name, first)
			continue
		}
		seen[name] = raw
		file[name] = true
		if spec.Remove {
			if spec.Quotas != nil || spec.Ban != nil || spec.PerKey != nil || spec.Mode != nil || spec.Candidate != nil {
				fail(at+".remove", "a removed plan takes no other field")
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
				fail(at+".mode", "must be enforce or shadow, not %q", *spec.Mode)
			}
		}
		var badQuotas bool
		if spec.Quotas != nil {
			ws, qproblems := spec.quotas(at + ".quotas")
			problems = append(problems, qproblems...)
			p.Windows, badQuotas = ws, len(qproblems) > 0
		}
		if spec.Candidate != nil {
			if len(spec.Candidate.Quotas) == 0 {
				fail(at+".candidate.quotas", "a candidate needs at least one quota (leave candidate out to drop it)")
			}
			q := spec
			q.Quotas = &spec.Candidate.Quotas
			ws, qproblems := q.quotas(at + ".candidate.quotas")
			problems = append(problems, qproblems...)
			p.Candidate, p.CandidateBan = ws, ratelimit.BanPolicy{}
			if spec.Candidate.Ban != nil {
				ban, field, err := spec.Candidate.Ban.policy()
				if err != nil {
					fail(at+".candidate.ban."+field, "%v", err)
				}
				p.CandidateBan = ban
			}
		} else {
			p.Candidate, p.CandidateBan = nil, ratelimit.BanPolicy{}
		}
		if len(p.Windows) == 0 && !p.PerKey && !badQuotas {
			fail(at+".quotas", "plan %q needs at least one quota unless per_key is true", name)
		}
		switch {
		case spec.Ban != nil:
			ban, field, err := spec.Ban.policy()
			if err != nil {
				fail(at+".ban."+field, "%v", err)
			}
			p.Ban = ban
		case !builtin:
			p.Ban = StandardBan(p.Windows)
		}
		plans[name] = p
	}
	if len(problems) > 0 {
		return nil, problems, nil
	}
	list := make([]Plan, 0, len(plans))
	for _, p := range plans {
		list = append(list, p)
	}
	s, err := NewSet(list...)
	if err != nil {
		return nil, nil, err
	}
	s.file = file
	return s, nil, nil
}

func (s planSpec) quotas(at string) ([]ratelimit.Window, []problem) {
	var problems []problem
	fail := func(path, format string, args ...any) {
		problems = append(problems, problem{path, fmt.Sprintf(format, args...)})
	}
	ws := make([]ratelimit.Window, 0, len(*s.Quotas))
	periods := make(map[time.Duration]int)
	for i, q := range *s.Quotas {
		qat := fmt.Sprintf("%s[%d]", at, i)
		if q.Limit < 1 || q.Limit > ratelimit.MaxLimit {
			fail(qat+".limit", "must be from 1 to %d, got %d", ratelimit.MaxLimit, q.Limit)
		}
		if q.Period == "" {
			fail(qat+".period", "required")
			continue
		}
		d, err := ParseQuotaPeriod(q.Period)
		if err != nil {
			fail(qat+".period", "%v", err)
			continue
		}
		if j, dup := periods[d]; dup {
			fail(qat+".period", "%s is also the period of %s[%d]", ratelimit.FormatPeriod(d), at, j)
			continue
		}
		periods[d] = i
		ws = append(ws, ratelimit.Window{Limit: int64(q.Limit), Period: d})
	}
	return ws, problems
}

// ParseQuotaPeriod parses the period of a quota or of a ban's strike
// window: a period (see ParsePeriod) of at most the limiter's MaxPeriod.
func ParseQuotaPeriod(s string) (time.Duration, error) {
	d, err := ParsePeriod(s)
	if err != nil {
		return 0, err
	}
	if d > ratelimit.MaxPeriod {
		return 0, fmt.Errorf("period %q: must be at most %dd", s, ratelimit.MaxPeriod/Day)
	}
	return d, nil
}

// policy returns the ban policy or, if it cannot, the field at fault and
// why.
func (b banSpec) policy() (ratelimit.BanPolicy, string, error) {
	if b.Off {
		return ratelimit.BanPolicy{}, "", nil
	}
	period := func(v string, def time.Duration, parse func(string) (time.Duration, error)) (time.Duration, error) {
		if v == "" {
			if def == 0 {
				return 0, errors.New("required")
			}
			return def, nil
		}
		return parse(v)
	}
	if b.Threshold == nil {
		return ratelimit.BanPolicy{}, "threshold", errors.New("required (or write ban: off)")
	}
	if *b.Threshold < 1 || *b.Threshold > ratelimit.MaxLimit {
		return ratelimit.BanPolicy{}, "threshold", fmt.Errorf("must be from 1 to %d, got %d", ratelimit.MaxLimit, *b.Threshold)
	}
	p := ratelimit.BanPolicy{Threshold: int64(*b.Threshold), Multiplier: banMultiplier}
	var err error
	if p.StrikeWindow, err = period(b.Within, 0, ParseQuotaPeriod); err != nil {
		return p, "within", err
	}
	if p.Base, err = period(b.Duration, 0, ParsePeriod); err != nil {
		return p, "duration", err
	}
	if p.Max, err = period(b.Max, max(banMax, p.Base), ParsePeriod); err != nil {
		return p, "max", err
	}
	if p.Max < p.Base {
		return p, "max", fmt.Errorf("%s is shorter than duration %s", ratelimit.FormatPeriod(p.Max), ratelimit.FormatPeriod(p.Base))
	}
	if p.Memory, err = period(b.Memory, banMemory, ParsePeriod); err != nil {
		return p, "memory", err
	}
	if b.Multiplier != nil {
		if m := *b.Multiplier; !(m >= 1 && m <= maxMultiplier) {
			return p, "multiplier", fmt.Errorf("must be from 1 to %d, got %g", maxMultiplier, m)
		}
		p.Multiplier = *b.Multiplier
	}
	return p, "", nil
}
