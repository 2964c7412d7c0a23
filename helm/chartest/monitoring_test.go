package chartest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Metric names are taken from the expressions by parsing them with the
// Prometheus query parser and collecting every vector selector's metric
// name, so an expression that does not parse fails too. The allowed names
// come from testdata/metrics.txt (what the service exports; meant to be
// regenerated from a running binary's /metrics) and
// testdata/external-metrics.txt (Prometheus and kube-state-metrics).

const (
	alertsPath       = deployDir + "/prometheus/alerts.yaml"
	chartAlertsPath  = chartDir + "/files/alerts.yaml"
	dashboardPath    = deployDir + "/grafana/petstore-dashboard.json"
	runbookPath      = deployDir + "/RUNBOOK.md"
	runbookURLPrefix = "https://github.com/animal-store/petstore/blob/main/deploy/RUNBOOK.md#"
)

// readMetricFamilies reads "# TYPE name type" lines; other comments and
// blank lines are skipped, anything else is an error.
func readMetricFamilies(t *testing.T, path string) map[string]string {
	t.Helper()
	fams := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, path)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			if !model.LegacyValidation.IsValidMetricName(f[2]) {
				t.Fatalf("%s:%d: bad metric name %q", path, n, f[2])
			}
			fams[f[2]] = f[3]
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		t.Fatalf("%s:%d: want a \"# TYPE name type\" line, got %q", path, n, line)
	}
	if len(fams) == 0 {
		t.Fatalf("%s: no metric families", path)
	}
	return fams
}

// seriesNames expands metric families into the series names a query can
// select: a histogram's _bucket, _sum and _count, a summary's quantiles,
// _sum and _count.
func seriesNames(fams map[string]string) map[string]bool {
	names := map[string]bool{}
	for name, typ := range fams {
		switch typ {
		case "histogram":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "summary":
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names
}

// allowedSeries is every series name the dashboard and alerts may use.
func allowedSeries(t *testing.T) map[string]bool {
	t.Helper()
	names := seriesNames(readMetricFamilies(t, "testdata/metrics.txt"))
	for n := range seriesNames(readMetricFamilies(t, "testdata/external-metrics.txt")) {
		names[n] = true
	}
	return names
}

// grafanaVars stands in for Grafana's variables so that a dashboard query
// parses as PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "${__rate_interval}", "5m",
	"$__interval", "1m", "${__interval}", "1m",
	"$__range", "1h", "${__range}", "1h",
	"${namespace}", "ns", "$namespace", "ns",
)

// metricNames parses a PromQL expression and returns the metric names it
// selects.
func metricNames(expr string) ([]string, error) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && name == "" {
				name = m.Value
			}
		}
		if name == "" {
			names = append(names, "<no metric name>")
		} else {
			names = append(names, name)
		}
		return nil
	})
	return names, nil
}

// readAlerts decodes deploy/prometheus/alerts.yaml strictly.
func readAlerts(t *testing.T) ruleFile {
	t.Helper()
	js, err := yaml.YAMLToJSONStrict(readFile(t, alertsPath))
	if err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	var rf ruleFile
	strict, err := kjson.UnmarshalStrict(js, &rf)
	if err != nil || len(strict) > 0 {
		t.Fatalf("%s: %v %v", alertsPath, err, strict)
	}
	return rf
}

// optionalGroup is the rule group the chart renders only with
// prometheusRule.planTuningAlerts; only its alerts may be severity info.
const optionalGroup = "petstore.plan-tuning"

// alertsFor returns the rules the chart's PrometheusRule holds: those of
// deploy/prometheus/alerts.yaml, without the optional group unless asked.
func alertsFor(t *testing.T, planTuning bool) ruleFile {
	t.Helper()
	rf := readAlerts(t)
	if !planTuning {
		rf.Groups = slices.DeleteFunc(rf.Groups, func(g ruleGroup) bool { return g.Name == optionalGroup })
	}
	return rf
}

// TestPlanTuningAlertsOptIn renders the chart's PrometheusRule with and
// without the opt-in group.
func TestPlanTuningAlertsOptIn(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		vals := readValues(t, filepath.Join(ciValuesDir, "production-values.yaml"))
		setPath(vals, "prometheusRule.planTuningAlerts", on)
		r := one[*prometheusRule](t, mustRender(t, vals, renderOptions{}))
		var alerts []string
		for _, g := range r.Spec.Groups {
			for _, rule := range g.Rules {
				alerts = append(alerts, rule.Alert)
			}
		}
		if got := slices.Contains(alerts, "PetstorePlanNearLimit"); got != on {
			t.Errorf("planTuningAlerts %v: PetstorePlanNearLimit rendered %v (alerts %v)", on, got, alerts)
		}
		if !slices.Contains(alerts, "PetstoreHigh5xxRatio") {
			t.Errorf("planTuningAlerts %v: the other alerts are missing: %v", on, alerts)
		}
	}
}

// runbookAnchors returns the GitHub anchors of the runbook's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(readFile(t, runbookPath)), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			slug := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
			anchors[slug] = true
		}
	}
	return anchors
}

// prometheusTemplateFuncs returns the functions Prometheus offers alert
// templates; only their names matter for parsing.
func prometheusTemplateFuncs() template.FuncMap {
	funcs := template.FuncMap{}
	for _, name := range []string{
		"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp",
		"query", "first", "label", "value", "sortByLabel", "strvalue", "args", "reReplaceAll", "safeHtml",
		"match", "title", "toUpper", "toLower", "graphLink", "tableLink", "pathPrefix", "externalURL",
		"parseDuration", "toTime", "stripPort", "stripDomain",
	} {
		funcs[name] = func(...any) string { return "" }
	}
	return funcs
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	allowed := allowedSeries(t)
	anchors := runbookAnchors(t)
	rf := readAlerts(t)
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert
			if r.Alert == "" {
				t.Errorf("%s: only alerting rules belong here (record: %q)", g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert defined twice", where)
			}
			seen[r.Alert] = true
			names, err := metricNames(r.Expr)
			if err != nil {
				t.Errorf("%s: expr: %v", where, err)
			}
			for _, n := range names {
				if !allowed[n] {
					t.Errorf("%s: metric %s is not exported (testdata/metrics.txt)", where, n)
				}
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for: %v", where, err)
				}
			}
			switch s := r.Labels["severity"]; {
			case g.Name == optionalGroup && s == "info":
			case s != "warning" && s != "critical":
				t.Errorf("%s: severity label must be warning or critical (info only in the opt-in group %s), got %q", where, optionalGroup, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: missing annotation %s", where, a)
				}
			}
			for k, text := range r.Annotations {
				// Prometheus defines these variables before expanding a template.
				const header = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
				if _, err := template.New(k).Funcs(prometheusTemplateFuncs()).Parse(header + text); err != nil {
					t.Errorf("%s: annotation %s: %v", where, k, err)
				}
			}
			u, err := url.Parse(r.Annotations["runbook_url"])
			if err != nil || !strings.HasPrefix(r.Annotations["runbook_url"], runbookURLPrefix) || !anchors[u.Fragment] {
				t.Errorf("%s: runbook_url %q must point at a heading of deploy/RUNBOOK.md", where, r.Annotations["runbook_url"])
			}
			if u != nil && u.Fragment != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook anchor %q, want #%s", where, u.Fragment, strings.ToLower(r.Alert))
			}
		}
	}
	// The brief's alerts, each present.
	for _, want := range []string{
		"PetstoreHigh5xxRatio", "Petstore429RatioSpike", "PetstoreRateLimitRedisErrors",
		"PetstoreRateLimitFallbackActive", "PetstoreHighLatencyP99", "PetstorePodsNotReady",
	} {
		if !seen[want] {
			t.Errorf("alert %s is missing", want)
		}
	}
	// Every runbook section belongs to an alert.
	for a := range anchors {
		found := false
		for alert := range seen {
			found = found || strings.ToLower(alert) == a
		}
		if !found {
			t.Errorf("runbook section #%s has no alert", a)
		}
	}
}

// TestChartAlertsMatchDeploy keeps the chart's copy of the rules identical
// to deploy/prometheus/alerts.yaml (a chart cannot read files outside it).
func TestChartAlertsMatchDeploy(t *testing.T) {
	t.Parallel()
	if !bytes.Equal(readFile(t, alertsPath), readFile(t, chartAlertsPath)) {
		t.Errorf("%s differs from %s: cp %s %s", chartAlertsPath, alertsPath, alertsPath, chartAlertsPath)
	}
}

// dashboard is the part of a Grafana dashboard model the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	raw := readFile(t, dashboardPath)
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	allowed := allowedSeries(t)
	used := map[string]bool{}
	var exprs []string
	check := func(where, expr string) {
		names, err := metricNames(grafanaVars.Replace(expr))
		if err != nil {
			t.Errorf("%s: %q: %v", where, expr, err)
		}
		for _, n := range names {
			used[n] = true
			if !allowed[n] {
				t.Errorf("%s: metric %s is not exported (testdata/metrics.txt)", where, n)
			}
		}
		exprs = append(exprs, expr)
	}
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			used[m[1]] = true
			if !allowed[m[1]] {
				t.Errorf("variable %s: metric %s is not exported", v.Name, m[1])
			}
		} else {
			check("variable "+v.Name, q)
		}
	}
	ids := map[int]bool{}
	all := flatten(d.Panels)
	for i, p := range all {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		for _, q := range all[:i] {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q must use the ${datasource} variable", p.Title)
		}
		for _, tg := range p.Targets {
			check(fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr)
		}
	}
	// What the dashboard must show.
	for _, want := range []string{
		"petstore_http_requests_total", "petstore_http_request_duration_seconds_bucket",
		"petstore_ratelimit_decisions_total", "petstore_ratelimit_bans_total", "petstore_ratelimit_near_limit_total",
		"petstore_ratelimit_redis_duration_seconds_bucket", "petstore_ratelimit_redis_errors_total",
		"petstore_ratelimit_fallback_active", "kube_deployment_status_replicas_available",
	} {
		if !used[want] {
			t.Errorf("dashboard does not use %s", want)
		}
	}
	joined := strings.Join(exprs, "\n")
	for _, split := range []string{`code=~"2.."`, `code=~"4..",code!="429"`, `code="429"`, `code=~"5.."`, `by (route)`, `by (plan, outcome)`} {
		if !strings.Contains(joined, split) {
			t.Errorf("dashboard has no query with %s", split)
		}
	}
}

func TestMetricsFileShape(t *testing.T) {
	t.Parallel()
	fams := readMetricFamilies(t, "testdata/metrics.txt")
	// The service's own families all carry the petstore_ namespace.
	var own []string
	for name := range fams {
		if strings.HasPrefix(name, "petstore_") {
			own = append(own, name)
		}
	}
	slices.Sort(own)
	if len(own) == 0 {
		t.Fatal("testdata/metrics.txt lists no petstore_ metric")
	}
	got := seriesNames(map[string]string{"a_seconds": "histogram", "b_total": "counter", "c": "summary"})
	for _, want := range []string{"a_seconds_bucket", "a_seconds_sum", "a_seconds_count", "b_total", "c", "c_sum", "c_count"} {
		if !got[want] {
			t.Errorf("seriesNames misses %s", want)
		}
	}
	if got["a_seconds"] {
		t.Error("a histogram's bare name is not a series")
	}
}
