package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/animal-store/petstore/internal/accesslog"
	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/replay"
	"github.com/animal-store/petstore/ratelimit"
)

// simulateHelp is the text of `petstore plans simulate --help`.
const simulateHelp = `
Replays the requests of the service's JSON access log against proposed plans, with the
limiter's own decisions (what the shared Redis state would decide: no leases, no local
caches, no fallback), and reports per plan what the limiter decided then and what the
proposed plans decide: requests allowed, limited and banned, keys limited and banned,
the distribution of the keys' peak window use, and the most affected keys.

Every request the limiter decided (an access line with "ratelimit") is replayed, whatever
it got then, at the time it reached the limiter (its time less its duration_ms), in time
order across all the logs (give one per replica). A key's policy is its plan as logged,
looked up in the proposed plans file merged over the built-in plans, with the key's own
quotas from the keys file (checked against the proposed plans, as a reload would check
it). Requests of a plan the file does not define or removes, and of keys on a per-key
plan with no quotas in the keys file, are reported as unmatched.

Peak window use: for each key, the highest share of its limit (used/limit) that any of
its windows reached just after one of its admissions under the proposed plan (100%: a
window used to the full); p50, p95 and p99 are nearest-rank percentiles over the plan's
keys that had an admission. Most affected keys: by requests refused (limited or banned)
under the proposal, then by those refused then; keys refused neither way are left out.

Logs may be gzip-compressed (told by their content) or '-' for standard input. Lines that
are not access lines are skipped; malformed ones are counted and reported. Fails when no
line of the logs is an access line with a rate-limit decision.
`

func setupSimulate(fs *flag.FlagSet) action {
	var logs stringList
	fs.Var(&logs, "access-log", "the service's JSON access log `FILE`, plain or gzip; repeat for each replica's; - for standard input")
	plansFile := fs.String("plans", "", "the proposed plans `FILE`, merged over the built-in plans (none: the built-in plans)")
	keysFile := fs.String("keys", "", "static keys `FILE`: keys' own quotas (overrides), checked against the proposed plans")
	top := fs.Int("top", 10, "most affected keys to list per plan")
	format := fs.String("format", "text", "output: text or json")
	return func(ctx context.Context, c *call) error {
		switch {
		case len(c.args) != 0:
			return c.usageErrorf("plans simulate takes no arguments, got %q (give each log with --access-log)", c.args)
		case len(logs) == 0:
			return c.usageErrorf("plans simulate: give at least one --access-log (- for standard input)")
		case *top < 0:
			return c.usageErrorf("--top must not be negative, got %d", *top)
		}
		if err := c.checkFormat(*format, "text", "json"); err != nil {
			return err
		}
		return simulate(ctx, c, logs, *plansFile, *keysFile, *top, *format)
	}
}

// simulate runs `petstore plans simulate`.
func simulate(ctx context.Context, c *call, logs []string, plansFile, keysFile string, top int, format string) error {
	plans, keys, err := apikey.LoadFiles(plansFile, keysFile)
	if err != nil {
		return err
	}
	inputs, err := simulateInputs(logs)
	if err != nil {
		return c.usage(err)
	}
	log, err := accesslog.Read(ctx, inputs, 0)
	if err != nil {
		return err
	}
	if log.Total.Replayable == 0 {
		n := log.Total
		return fmt.Errorf("nothing to replay: no line of %s is an access line with a rate-limit decision "+
			"(%d lines: %d malformed, %d other messages, %d not decided by the limiter)",
			strings.Join(logs, ", "), n.Lines, n.Malformed, n.Other, n.NotAsked)
	}
	overrides := map[string][]ratelimit.Window{}
	labels := map[string]string{}
	for _, r := range keys.Records() {
		if len(r.Overrides) > 0 {
			overrides[r.ID] = r.Overrides
		}
		if r.Label != "" {
			labels[r.ID] = r.Label
		}
	}
	rep, err := replay.Run(ctx, log, replay.Options{Plans: plans, Overrides: overrides, Top: top})
	if err != nil {
		return err
	}
	if n := log.Total.Malformed; n > 0 {
		fmt.Fprintf(c.stderr, "petstore: plans simulate: %d malformed lines skipped\n", n)
	}
	sim := simulation{plansFile: plansFile, keysFile: keysFile, logs: logs, plans: plans, labels: labels, log: log, report: rep}
	if format == "json" {
		return sim.writeJSON(c.stdout)
	}
	return sim.writeText(c.stdout)
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// simulateInputs opens the logs as named, "-" being standard input.
func simulateInputs(names []string) ([]accesslog.Input, error) {
	var inputs []accesslog.Input
	stdin := false
	for _, name := range names {
		if name == "-" {
			if stdin {
				return nil, errors.New("--access-log: standard input (-) given twice")
			}
			stdin = true
			inputs = append(inputs, accesslog.Input{Name: "standard input", Open: func() (io.ReadCloser, error) { return io.NopCloser(os.Stdin), nil }})
			continue
		}
		inputs = append(inputs, accesslog.Input{Name: name, Open: func() (io.ReadCloser, error) { return os.Open(name) }})
	}
	return inputs, nil
}

// simulation is a replay and what it was made of, to be reported.
type simulation struct {
	plansFile, keysFile string
	logs                []string
	plans               *plan.Set
	log                 *accesslog.Log
	report              *replay.Report
	labels              map[string]string // by key id, from the keys file
}

// proposed describes the proposed plan the log's plan name stands for, in
// one line, or why there is none.
func (s simulation) proposed(p replay.Plan) string {
	pl, ok := s.plans.Lookup(p.Name)
	if !ok {
		if p.Unmatched.Reason != "" {
			return p.Unmatched.Reason
		}
		return "not a proposed plan"
	}
	quotas := strings.ReplaceAll(plan.FormatQuotas(pl.Windows), ",", ", ")
	if pl.PerKey {
		quotas = strings.TrimSuffix("per key; default "+quotas, "; default ")
	}
	out := quotas + "; ban: " + describeBan(pl.Ban)
	if pl.Shadow {
		out += "; shadow mode: nothing would be enforced"
	}
	return out
}

func keysText(n int64) string {
	if n == 1 {
		return "1 key"
	}
	return strconv.FormatInt(n, 10) + " keys"
}

func percent(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func (s simulation) writeText(w io.Writer) error {
	r, c := s.report, s.log.Total
	against := "the built-in plans"
	if s.plansFile != "" {
		against = s.plansFile + " merged over the built-in plans"
	}
	if s.keysFile != "" {
		against += ", keys' own quotas from " + s.keysFile
	}
	fmt.Fprintf(w, "%d requests of %s, %s to %s, replayed against %s.\n", r.Total.Requests, keysText(r.Total.Keys),
		r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), against)
	fmt.Fprintf(w, "Read %d lines: %d replayed, %d not decided by the limiter, %d other messages, %d malformed.\n",
		c.Lines, c.Replayable, c.NotAsked, c.Other, c.Malformed)
	for _, p := range r.Plans {
		fmt.Fprintf(w, "\nPlan %s, proposed: %s\n", p.Name, s.proposed(p))
		if err := writePlanText(w, p, true, s.labels); err != nil {
			return err
		}
	}
	if len(r.Plans) > 1 {
		fmt.Fprintf(w, "\nAll plans\n")
		return writePlanText(w, r.Total, false, nil)
	}
	return nil
}

// writePlanText writes the figures of one plan (or of all), and with top
// its most affected keys, with the labels the keys file gives them.
func writePlanText(w io.Writer, p replay.Plan, top bool, labels map[string]string) error {
	fmt.Fprintf(w, "  %d requests of %s", p.Requests, keysText(p.Keys))
	if p.Shadow > 0 {
		fmt.Fprintf(w, "; %d decided in shadow mode then (not enforced)", p.Shadow)
	}
	if p.Unmatched.Requests > 0 {
		fmt.Fprintf(w, "; %d requests of %s unmatched", p.Unmatched.Requests, keysText(p.Unmatched.Keys))
		if p.Unmatched.Reason != "" {
			fmt.Fprintf(w, " (%s)", p.Unmatched.Reason)
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  \tALLOWED\tLIMITED\tBANNED\tKEYS LIMITED\tKEYS BANNED")
	o := p.Then
	fmt.Fprintf(tw, "  then\t%d\t%d\t%d\t%d\t%d\n", o.Allowed, o.Limited, o.Banned, o.KeysLimited, o.KeysBanned)
	replayed := p.Unmatched.Requests < p.Requests
	if replayed {
		o = p.Proposed
		fmt.Fprintf(tw, "  proposed\t%d\t%d\t%d\t%d\t%d\n", o.Allowed, o.Limited, o.Banned, o.KeysLimited, o.KeysBanned)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if replayed {
		fmt.Fprintf(w, "  bans begun: %d; peak window use over %s: p50 %s, p95 %s, p99 %s\n",
			p.Bans, keysText(p.Peak.Keys), percent(p.Peak.P50), percent(p.Peak.P95), percent(p.Peak.P99))
	}
	switch {
	case !top || !replayed:
	case p.Then.Refused() == 0 && p.Proposed.Refused() == 0:
		fmt.Fprintln(w, "  no key refused, then or under the proposal")
	case len(p.Top) > 0:
		fmt.Fprintln(w, "  most affected keys:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  KEY\tLABEL\tREQUESTS\tTHEN LIMITED\tBANNED\tPROPOSED LIMITED\tBANNED\tPEAK")
		for _, k := range p.Top {
			label := cmp.Or(labels[k.KeyID], "-")
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", k.KeyID, label, k.Requests, k.Then.Limited, k.Then.Banned,
				k.Proposed.Limited, k.Proposed.Banned, percent(k.Peak))
		}
		return tw.Flush()
	}
	return nil
}

// The JSON report. Field names are stable; later releases only add fields.
type (
	jsonSimulation struct {
		// PlansFile is the proposed plans file (empty: the built-in plans).
		PlansFile  string          `json:"plans_file"`
		KeysFile   string          `json:"keys_file"`
		AccessLogs []jsonAccessLog `json:"access_logs"`
		// Lines counts the lines of all the logs.
		Lines accesslog.Counts `json:"lines"`
		// From and To are the first and last request replayed (RFC 3339, UTC).
		From  string        `json:"from"`
		To    string        `json:"to"`
		Plans []jsonSimPlan `json:"plans"`
		// Total sums the plans; a key on two plans counts once.
		Total jsonSimPlan `json:"total"`
	}
	jsonAccessLog struct {
		Name  string           `json:"name"`
		Lines accesslog.Counts `json:"lines"`
	}
	jsonSimPlan struct {
		// Plan is the plan as the log names it ("all" for the total).
		Plan string `json:"plan"`
		// Proposal is the proposed plan of that name; null when there is
		// none (and for the total).
		Proposal  *jsonPlan     `json:"proposal"`
		Requests  int64         `json:"requests"`
		Keys      int64         `json:"keys"`
		Then      jsonThen      `json:"then"`
		Proposed  jsonProposed  `json:"proposed"`
		Unmatched jsonUnmatched `json:"unmatched"`
		Peak      jsonPeak      `json:"peak"`
		TopKeys   []jsonSimKey  `json:"top_keys"`
	}
	jsonThen struct {
		Allowed     int64 `json:"allowed"`
		Limited     int64 `json:"limited"`
		Banned      int64 `json:"banned"`
		KeysLimited int64 `json:"keys_limited"`
		KeysBanned  int64 `json:"keys_banned"`
		// Shadow counts the decisions made in shadow mode (not enforced).
		Shadow int64 `json:"shadow"`
	}
	jsonProposed struct {
		Allowed     int64 `json:"allowed"`
		Limited     int64 `json:"limited"`
		Banned      int64 `json:"banned"`
		KeysLimited int64 `json:"keys_limited"`
		KeysBanned  int64 `json:"keys_banned"`
		// Bans counts the bans begun.
		Bans int64 `json:"bans"`
	}
	jsonUnmatched struct {
		Requests int64  `json:"requests"`
		Keys     int64  `json:"keys"`
		Reason   string `json:"reason"`
	}
	jsonPeak struct {
		// Keys is how many keys the percentiles are over.
		Keys int64   `json:"keys"`
		P50  float64 `json:"p50"`
		P95  float64 `json:"p95"`
		P99  float64 `json:"p99"`
	}
	jsonSimKey struct {
		KeyID string `json:"key_id"`
		// Label is the key's label in the keys file; empty when unknown.
		Label    string       `json:"label"`
		Requests int64        `json:"requests"`
		Then     jsonThen     `json:"then"`
		Proposed jsonProposed `json:"proposed"`
		// Peak is the key's peak window use, a share of the limit.
		Peak float64 `json:"peak"`
	}
)

func (s simulation) writeJSON(w io.Writer) error {
	r := s.report
	out := jsonSimulation{PlansFile: s.plansFile, KeysFile: s.keysFile, AccessLogs: []jsonAccessLog{}, Lines: s.log.Total,
		From: r.From.Format(time.RFC3339Nano), To: r.To.Format(time.RFC3339Nano), Plans: []jsonSimPlan{}, Total: simPlanJSON(r.Total, nil)}
	for i, name := range s.logs {
		out.AccessLogs = append(out.AccessLogs, jsonAccessLog{Name: name, Lines: s.log.Inputs[i]})
	}
	for _, p := range r.Plans {
		jp := simPlanJSON(p, s.labels)
		if pl, ok := s.plans.Lookup(p.Name); ok {
			desc := planJSON(pl, sourceOf(s.plans, pl.Name))
			jp.Proposal = &desc
		}
		out.Plans = append(out.Plans, jp)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func simPlanJSON(p replay.Plan, labels map[string]string) jsonSimPlan {
	jp := jsonSimPlan{Plan: p.Name, Requests: p.Requests, Keys: p.Keys,
		Then:      thenJSON(p.Then, p.Shadow),
		Proposed:  proposedJSON(p.Proposed, p.Bans),
		Unmatched: jsonUnmatched{Requests: p.Unmatched.Requests, Keys: p.Unmatched.Keys, Reason: p.Unmatched.Reason},
		Peak:      jsonPeak{Keys: p.Peak.Keys, P50: p.Peak.P50, P95: p.Peak.P95, P99: p.Peak.P99},
		TopKeys:   []jsonSimKey{}}
	for _, k := range p.Top {
		jp.TopKeys = append(jp.TopKeys, jsonSimKey{KeyID: k.KeyID, Label: labels[k.KeyID], Requests: k.Requests, Then: thenJSON(k.Then, k.Shadow),
			Proposed: proposedJSON(k.Proposed, k.Bans), Peak: k.Peak})
	}
	return jp
}

func thenJSON(o replay.Outcomes, shadow int64) jsonThen {
	return jsonThen{Allowed: o.Allowed, Limited: o.Limited, Banned: o.Banned, KeysLimited: o.KeysLimited, KeysBanned: o.KeysBanned, Shadow: shadow}
}

func proposedJSON(o replay.Outcomes, bans int64) jsonProposed {
	return jsonProposed{Allowed: o.Allowed, Limited: o.Limited, Banned: o.Banned, KeysLimited: o.KeysLimited, KeysBanned: o.KeysBanned, Bans: bans}
}
