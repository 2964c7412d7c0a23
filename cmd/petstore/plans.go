package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

func setupPlansCheck(fs *flag.FlagSet) action {
	keys := fs.String("keys", "", "also check this static keys `FILE` against the plans")
	format := fs.String("format", "text", "output: text or json (on stdout, failed or not)")
	return func(_ context.Context, c *call) error {
		if len(c.args) != 1 {
			return c.usageErrorf("plans check needs one plans FILE, got %d arguments", len(c.args))
		}
		if err := c.checkFormat(*format, "text", "json"); err != nil {
			return err
		}
		return checkPlans(c.stdout, c.args[0], *keys, *format)
	}
}

func setupPlansShow(fs *flag.FlagSet) action {
	plansFile := fs.String("plans", "", "plans `FILE` merged over the built-in plans (env PETSTORE_PLANS_FILE; none: the built-in plans)")
	format := fs.String("format", "text", "output: text, yaml (a complete plans file) or json")
	return func(_ context.Context, c *call) error {
		if len(c.args) != 0 {
			return c.usageErrorf("plans show takes no arguments, got %q (give the file with --plans)", c.args)
		}
		if err := c.checkFormat(*format, "text", "yaml", "json"); err != nil {
			return err
		}
		file := *plansFile
		if file == "" {
			file = c.getenv("PETSTORE_PLANS_FILE")
		}
		return showPlans(c.stdout, file, *format)
	}
}

// checkPlans validates the files as a replica's reload does, with the same
// code, so its errors are the ones a rejected reload logs. In JSON it states
// the outcome on stdout either way, and fails as text does.
func checkPlans(stdout io.Writer, plansFile, keysFile, format string) error {
	plans, keys, err := apikey.LoadFiles(plansFile, keysFile)
	if format == "json" {
		out := jsonCheck{PlansFile: plansFile, KeysFile: keysFile, OK: err == nil, Plans: []string{}}
		if err != nil {
			msg := err.Error()
			out.Error = &msg
		} else {
			out.Plans, out.Keys = plans.Names(), keys.Len()
		}
		if werr := writeJSON(stdout, out); werr != nil {
			return werr
		}
		return err
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d plans, %d keys: ok\n", len(plans.Names()), keys.Len())
	return nil
}

// jsonCheck is the JSON of `plans check`: names a later release keeps, and
// only adds to.
type jsonCheck struct {
	PlansFile string `json:"plansFile"`
	KeysFile  string `json:"keysFile"` // empty: none checked
	OK        bool   `json:"ok"`
	// Plans are the plans in force and Keys how many keys the keys file
	// holds; none when the check failed.
	Plans []string `json:"plans"`
	Keys  int      `json:"keys"`
	// Error is what a reload would log; null when the files are good.
	Error *string `json:"error"`
}

// Where a plan shown comes from.
const (
	sourceBuiltIn = "built-in"
	sourceFile    = "file"
	sourceChanged = "file over built-in"
	sourceRemoved = "removed by file"
)

// shownPlan is one plan in force, or one the file removed.
type shownPlan struct {
	plan.Plan
	source string
}

func (p shownPlan) removed() bool { return p.source == sourceRemoved }

func showPlans(stdout io.Writer, plansFile, format string) error {
	set, err := plan.Load(plansFile)
	if err != nil {
		return err
	}
	var shown []shownPlan
	for _, name := range set.Names() {
		p, _ := set.Lookup(name)
		p.Candidate = byPeriod(p.Candidate)
		shown = append(shown, shownPlan{Plan: p, source: sourceOf(set, name)})
	}
	for _, name := range set.Removed() {
		shown = append(shown, shownPlan{Plan: plan.Plan{Name: name}, source: sourceRemoved})
	}
	switch format {
	case "yaml":
		return writePlansYAML(stdout, plansFile, shown)
	case "json":
		return writePlansJSON(stdout, plansFile, shown)
	default:
		return writePlansText(stdout, shown)
	}
}

// sourceOf says where the plan called name in set comes from.
func sourceOf(set *plan.Set, name string) string {
	if !set.FromFile(name) {
		return sourceBuiltIn
	}
	if _, ok := plan.Defaults().Lookup(name); ok {
		return sourceChanged
	}
	return sourceFile
}

// byPeriod returns ws ordered by period, as the windows of a set are; the
// file's order of a candidate's quotas means nothing.
func byPeriod(ws []ratelimit.Window) []ratelimit.Window {
	return slices.SortedFunc(slices.Values(ws), func(a, b ratelimit.Window) int { return cmp.Compare(a.Period, b.Period) })
}

func modeName(p plan.Plan) string {
	if p.Shadow {
		return "shadow"
	}
	return "enforce"
}

func writePlansText(w io.Writer, shown []shownPlan) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLAN\tSOURCE\tMODE\tQUOTAS\tCANDIDATE\tBAN")
	for _, p := range shown {
		if p.removed() {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\n", p.Name, p.source)
			continue
		}
		candidate := "-"
		if len(p.Candidate) > 0 {
			candidate = strings.ReplaceAll(plan.FormatQuotas(p.Candidate), ",", ", ")
			if p.CandidateBan.Enabled() {
				candidate += "; ban " + describeBan(p.CandidateBan)
			}
		}
		quotas := strings.ReplaceAll(plan.FormatQuotas(p.Windows), ",", ", ")
		if p.PerKey {
			quotas = strings.TrimSuffix("per key; default "+quotas, "; default ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.source, modeName(p.Plan), quotas, candidate, describeBan(p.Ban))
	}
	return tw.Flush()
}

// describeBan says a ban policy in one line.
func describeBan(b ratelimit.BanPolicy) string {
	if !b.Enabled() {
		return "off"
	}
	f := ratelimit.FormatPeriod
	return fmt.Sprintf("more than %d refused in %s: %s, x%g per repeat up to %s (repeats remembered %s)",
		b.Threshold, f(b.StrikeWindow), f(b.Base), b.Multiplier, f(b.Max), f(b.Memory))
}

// The YAML output is a plans file that states every field of every plan,
// so that it means the same whatever the built-in plans are.
type (
	yamlPlan struct {
		Mode      string         `yaml:"mode"`
		PerKey    bool           `yaml:"per_key"`
		Quotas    []yamlQuota    `yaml:"quotas,flow"`
		Candidate *yamlCandidate `yaml:"candidate,omitempty"` // left out: none
		Ban       any            `yaml:"ban,flow"`            // "off" or yamlBan
	}
	yamlCandidate struct {
		Quotas []yamlQuota `yaml:"quotas,flow"`
		Ban    any         `yaml:"ban,flow"` // "off" or yamlBan
	}
	yamlQuota struct {
		Limit  int64  `yaml:"limit"`
		Period string `yaml:"period"`
	}
	yamlBan struct {
		Threshold  int64   `yaml:"threshold"`
		Within     string  `yaml:"within"`
		Duration   string  `yaml:"duration"`
		Multiplier float64 `yaml:"multiplier"`
		Max        string  `yaml:"max"`
		Memory     string  `yaml:"memory"`
	}
)

func writePlansYAML(w io.Writer, plansFile string, shown []shownPlan) error {
	plans := &yaml.Node{Kind: yaml.MappingNode}
	for _, p := range shown {
		yp := yamlPlan{Mode: modeName(p.Plan), PerKey: p.PerKey, Quotas: quotasYAML(p.Windows), Ban: banYAML(p.Ban)}
		if len(p.Candidate) > 0 {
			yp.Candidate = &yamlCandidate{Quotas: quotasYAML(p.Candidate), Ban: banYAML(p.CandidateBan)}
		}
		var v any = yp
		if p.removed() {
			v = struct {
				Remove bool `yaml:"remove"`
			}{true}
		}
		var value yaml.Node
		if err := value.Encode(v); err != nil {
			return err
		}
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: p.Name, LineComment: p.source}
		if p.removed() {
			// On one line, where the comment must follow the value.
			value.Style, value.LineComment, key.LineComment = yaml.FlowStyle, p.source, ""
		}
		plans.Content = append(plans.Content, key, &value)
	}
	from := "the built-in plans"
	if plansFile != "" {
		from = "the plans file " + plansFile + " merged over the built-in plans"
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, HeadComment: "The plans in force: " + from + ".\nEvery field is stated, so the file does not depend on the built-in values.", Content: []*yaml.Node{{
		Kind:    yaml.MappingNode,
		Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: "plans"}, plans},
	}}}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}

func quotasYAML(ws []ratelimit.Window) []yamlQuota {
	out := make([]yamlQuota, 0, len(ws))
	for _, w := range ws {
		out = append(out, yamlQuota{Limit: w.Limit, Period: ratelimit.FormatPeriod(w.Period)})
	}
	return out
}

func banYAML(b ratelimit.BanPolicy) any {
	if !b.Enabled() {
		return "off"
	}
	f := ratelimit.FormatPeriod
	return yamlBan{Threshold: b.Threshold, Within: f(b.StrikeWindow), Duration: f(b.Base), Multiplier: b.Multiplier, Max: f(b.Max), Memory: f(b.Memory)}
}

type (
	jsonPlans struct {
		// PlansFile is the file merged over the built-in plans; empty for none.
		PlansFile string     `json:"plans_file"`
		Plans     []jsonPlan `json:"plans"`
		// Removed are the built-in plans the file removed.
		Removed []string `json:"removed"`
	}
	jsonPlan struct {
		Name     string      `json:"name"`
		Source   string      `json:"source"`
		FromFile bool        `json:"from_file"`
		Mode     string      `json:"mode"`
		PerKey   bool        `json:"per_key"`
		Quotas   []jsonQuota `json:"quotas"`
		// Candidate holds quotas measured beside Quotas, never enforced,
		// and CandidateBan the ban policy they would enforce.
		Candidate    []jsonQuota `json:"candidate"`
		CandidateBan *jsonBan    `json:"candidate_ban"` // null: none
		Ban          *jsonBan    `json:"ban"`           // null: never banned
	}
	jsonQuota struct {
		Limit         int64   `json:"limit"`
		Period        string  `json:"period"`
		PeriodSeconds float64 `json:"period_seconds"`
	}
	jsonBan struct {
		Threshold       int64   `json:"threshold"`
		WithinSeconds   float64 `json:"within_seconds"`
		DurationSeconds float64 `json:"duration_seconds"`
		Multiplier      float64 `json:"multiplier"`
		MaxSeconds      float64 `json:"max_seconds"`
		MemorySeconds   float64 `json:"memory_seconds"`
	}
)

func writePlansJSON(w io.Writer, plansFile string, shown []shownPlan) error {
	out := jsonPlans{PlansFile: plansFile, Plans: []jsonPlan{}, Removed: []string{}}
	for _, p := range shown {
		if p.removed() {
			out.Removed = append(out.Removed, p.Name)
			continue
		}
		out.Plans = append(out.Plans, planJSON(p.Plan, p.source))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// planJSON states plan p, which comes from source.
func planJSON(p plan.Plan, source string) jsonPlan {
	jp := jsonPlan{Name: p.Name, Source: source, FromFile: source != sourceBuiltIn, Mode: modeName(p), PerKey: p.PerKey,
		Quotas: quotasJSON(p.Windows), Candidate: quotasJSON(byPeriod(p.Candidate)), Ban: banJSON(p.Ban), CandidateBan: banJSON(p.CandidateBan)}
	return jp
}

// banJSON states ban policy b; nil when it bans nothing.
func banJSON(b ratelimit.BanPolicy) *jsonBan {
	if !b.Enabled() {
		return nil
	}
	return &jsonBan{Threshold: b.Threshold, WithinSeconds: b.StrikeWindow.Seconds(), DurationSeconds: b.Base.Seconds(),
		Multiplier: b.Multiplier, MaxSeconds: b.Max.Seconds(), MemorySeconds: b.Memory.Seconds()}
}

func quotasJSON(ws []ratelimit.Window) []jsonQuota {
	out := make([]jsonQuota, 0, len(ws))
	for _, q := range ws {
		out = append(out, jsonQuota{Limit: q.Limit, Period: ratelimit.FormatPeriod(q.Period), PeriodSeconds: q.Period.Seconds()})
	}
	return out
}
