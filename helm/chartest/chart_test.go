package chartest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestLint runs `helm lint --strict` on every ci values file: any warning
// fails, as an error does.
func TestLint(t *testing.T) {
	t.Parallel()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range ciValuesFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			lint.KubeVersion = kv
			res := lint.Run([]string{chartDir}, readValues(t, file))
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("lint: %v", err)
			}
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
		})
	}
}

// effectiveValues returns the chart's defaults with vals merged over them.
func effectiveValues(t *testing.T, vals map[string]any) chartutil.Values {
	t.Helper()
	merged, err := chartutil.CoalesceValues(loadChart(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	return merged
}

func lookup[T any](t *testing.T, v chartutil.Values, path string) T {
	t.Helper()
	var zero T
	raw, err := v.PathValue(path)
	if err != nil {
		return zero
	}
	switch x := any(raw).(type) {
	case T:
		return x
	case float64: // numbers from YAML arrive as float64
		if _, ok := any(zero).(int); ok {
			return any(int(x)).(T)
		}
	case int64:
		if _, ok := any(zero).(int); ok {
			return any(int(x)).(T)
		}
	}
	t.Fatalf("values %s: %T is not %T", path, raw, zero)
	return zero
}

// credentials lists every secret the values hand to the chart: these may
// appear in Secrets only.
func credentials(t *testing.T, v chartutil.Values) []string {
	var out []string
	for _, p := range []string{"postgres.url", "redis.url", "redis.password", "tests.rateLimit.apiKey"} {
		if s := lookup[string](t, v, p); s != "" {
			out = append(out, s)
		}
	}
	entries, _ := v.PathValue("apiKeys.entries")
	list, _ := entries.([]any)
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			if k, ok := m["key"].(string); ok && k != "" {
				out = append(out, k)
			}
		}
	}
	return out
}

// TestRenderCIValues renders every ci values file for Kubernetes 1.31 with
// the Prometheus operator present, decodes every manifest strictly, and
// checks what a reviewer would.
func TestRenderCIValues(t *testing.T) {
	t.Parallel()
	for _, file := range ciValuesFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			vals := readValues(t, file)
			objs := mustRender(t, vals, renderOptions{})
			v := effectiveValues(t, vals)
			for _, err := range checkRelease(t, objs, v) {
				t.Error(err)
			}
		})
	}
}

// envText is an environment variable as JSON, value or reference.
func envText(e corev1.EnvVar) string {
	b, _ := json.Marshal(e)
	return string(b)
}

// checkRelease checks a rendering against the values it was made from.
func checkRelease(t *testing.T, objs []object, v chartutil.Values) []string {
	t.Helper()
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	hpa := lookup[bool](t, v, "autoscaling.enabled")
	replicas := lookup[int](t, v, "replicaCount")
	postgres := lookup[string](t, v, "store") == "postgres"
	redis := lookup[bool](t, v, "redis.enabled")
	testsOn := lookup[bool](t, v, "tests.enabled")
	rateLimitTest := testsOn && lookup[string](t, v, "tests.rateLimit.apiKey") != ""

	// Every pod the chart can start is hardened: the service, the
	// migration job and the test pods alike.
	d := one[*appsv1.Deployment](t, objs)
	errs = append(errs, checkDeployment(d)...)
	for _, j := range only[*batchv1.Job](objs) {
		errs = append(errs, checkPodSpec("Job "+j.Name, j.Spec.Template.Spec)...)
	}
	for _, p := range only[*corev1.Pod](objs) {
		errs = append(errs, checkPodSpec("Pod "+p.Name, p.Spec)...)
	}

	// Credentials reach Secrets and nothing else.
	secretText := ""
	for _, s := range only[*corev1.Secret](objs) {
		for _, b := range s.Data {
			secretText += string(b) + "\n"
		}
		for _, s := range s.StringData {
			secretText += s + "\n"
		}
	}
	for _, cred := range credentials(t, v) {
		if !strings.Contains(secretText, cred) {
			fail("credential %.12s... is in no Secret", cred)
		}
		for _, o := range objs {
			if o.Kind != "Secret" && strings.Contains(string(o.Raw), cred) {
				fail("%s %s contains a credential (%.12s...)", o.Kind, o.Name, cred)
			}
		}
	}

	// Replicas belong to the autoscaler when there is one.
	hpas := only[*autoscalingv2.HorizontalPodAutoscaler](objs)
	if hpa {
		if d.Spec.Replicas != nil {
			fail("Deployment sets replicas while the HPA owns them")
		}
		if len(hpas) != 1 {
			fail("want one HPA, got %d", len(hpas))
		}
	} else {
		if d.Spec.Replicas == nil || int(*d.Spec.Replicas) != replicas {
			fail("Deployment replicas must be replicaCount %d", replicas)
		}
		if len(hpas) != 0 {
			fail("HPA rendered while autoscaling is off")
		}
	}
	for _, h := range hpas {
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
			fail("HPA targets %s/%s, not the Deployment", h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
		if h.Spec.Behavior == nil || h.Spec.Behavior.ScaleDown == nil || h.Spec.Behavior.ScaleDown.StabilizationWindowSeconds == nil {
			fail("HPA needs scaleDown.stabilizationWindowSeconds")
		}
		cpu := false
		for _, m := range h.Spec.Metrics {
			if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Name == corev1.ResourceCPU {
				cpu = true
			}
		}
		if !cpu {
			fail("HPA must scale on CPU")
		}
	}

	// A disruption budget whenever more than one pod can run.
	pdbs := only[*policyv1.PodDisruptionBudget](objs)
	wantPDB := lookup[bool](t, v, "podDisruptionBudget.enabled") && (hpa || replicas > 1)
	if wantPDB != (len(pdbs) == 1) || len(pdbs) > 1 {
		fail("PodDisruptionBudget: want %v, got %d", wantPDB, len(pdbs))
	}
	for _, p := range pdbs {
		if !selects(p.Spec.Selector, d.Spec.Template.Labels) {
			fail("PDB does not select the Deployment's pods")
		}
	}

	// The Service: public and ops ports, API pods only.
	svc := one[*corev1.Service](t, objs)
	svcPorts := map[string]string{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = fmt.Sprintf("%d->%s", p.Port, p.TargetPort.String())
	}
	if svcPorts["http"] != "8080->http" || svcPorts["ops"] != "9090->ops" || len(svcPorts) != 2 {
		fail("Service ports must be http 8080 and ops 9090, got %v", svcPorts)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		fail("Service does not select the Deployment's pods")
	}
	for _, o := range objs {
		var podLabels map[string]string
		switch x := o.Obj.(type) {
		case *batchv1.Job:
			podLabels = x.Spec.Template.Labels
		case *corev1.Pod:
			podLabels = x.Labels
		default:
			continue
		}
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(podLabels)) {
			fail("Service selects %s %s: only API pods may receive traffic", o.Kind, o.Name)
		}
		if selects(d.Spec.Selector, podLabels) {
			fail("Deployment selector matches %s %s", o.Kind, o.Name)
		}
	}

	// The hook Jobs: the migration before install and upgrade, only with
	// PostgreSQL; the finalize step after them, only with Redis and asked
	// for. Each runs the service image, its credentials from Secrets that
	// exist when it runs.
	type hookJob struct {
		hook string   // helm.sh/hook
		args []string // the container's, but for the last of finalize's
		want bool
	}
	hookJobs := map[string]hookJob{
		"migrate":  {"pre-install,pre-upgrade", []string{"migrate"}, postgres && lookup[bool](t, v, "postgres.migrate.enabled")},
		"finalize": {"post-install,post-upgrade", []string{"limits", "finalize", "--wait"}, redis && lookup[bool](t, v, "rateLimit.finalize.afterUpgrade")},
	}
	if fin := hookJobs["finalize"]; !fin.want && redis && lookup[bool](t, v, "rateLimit.finalize.onInstall") {
		// After a fresh install alone, and never failing it.
		hookJobs["finalize"] = hookJob{"post-install", []string{"limits", "finalize", "--wait", "--optional"}, true}
	}
	jobs := only[*batchv1.Job](objs)
	for name, hj := range hookJobs {
		n := 0
		for _, j := range jobs {
			if j.Labels["app.kubernetes.io/component"] == name {
				n++
			}
		}
		if hj.want != (n == 1) || n > 1 {
			fail("%s Job: want %v, got %d", name, hj.want, n)
		}
	}
	for _, j := range jobs {
		hj, ok := hookJobs[j.Labels["app.kubernetes.io/component"]]
		if !ok {
			fail("Job %s: component %q is no hook the chart has", j.Name, j.Labels["app.kubernetes.io/component"])
			continue
		}
		ann := j.Annotations
		if ann["helm.sh/hook"] != hj.hook || ann["helm.sh/hook-delete-policy"] == "" {
			fail("Job %s must be a %s hook with a delete policy, got %v", j.Name, hj.hook, ann)
		}
		if j.Spec.BackoffLimit == nil || j.Spec.TTLSecondsAfterFinished == nil || j.Spec.ActiveDeadlineSeconds == nil {
			fail("Job %s needs backoffLimit, activeDeadlineSeconds and ttlSecondsAfterFinished", j.Name)
		}
		c := j.Spec.Template.Spec.Containers[0]
		args := c.Args
		if strings.HasPrefix(hj.hook, "post-") && len(args) >= 4 {
			// finalize --wait D: D parses, and the Job's deadline leaves
			// the wait room to end on its own.
			wait, err := time.ParseDuration(args[3])
			if err != nil || j.Spec.ActiveDeadlineSeconds != nil && wait >= time.Duration(*j.Spec.ActiveDeadlineSeconds)*time.Second {
				fail("Job %s: --wait %q must be a duration below activeDeadlineSeconds (%v)", j.Name, args[3], err)
			}
			args = slices.Delete(slices.Clone(args), 3, 4)
		}
		if !slices.Equal(args, hj.args) || c.Image != d.Spec.Template.Spec.Containers[0].Image {
			fail("Job %s must run %v from the service image, got %v", j.Name, hj.args, c.Args)
		}
		if j.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
			fail("Job %s: restartPolicy must be Never (backoffLimit counts pods)", j.Name)
		}
		for _, e := range c.Env {
			if secretEnv[e.Name] && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				fail("Job %s: env %s must come from a Secret", j.Name, e.Name)
			}
			if strings.HasPrefix(hj.hook, "pre-") && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !hookOrExternalSecret(objs, e.ValueFrom.SecretKeyRef.Name) {
				fail("Job %s: Secret %s does not exist yet when pre-install hooks run", j.Name, e.ValueFrom.SecretKeyRef.Name)
			}
		}
		if strings.HasPrefix(hj.hook, "post-") {
			// The Redis the service pods share, reached as they reach it.
			podEnv := map[string]string{}
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				podEnv[e.Name] = envText(e)
			}
			redisVars := 0
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "PETSTORE_REDIS_") {
					redisVars++
					if podEnv[e.Name] != envText(e) {
						fail("Job %s: %s differs from the service pods'", j.Name, e.Name)
					}
				}
			}
			for name := range podEnv {
				if strings.HasPrefix(name, "PETSTORE_REDIS_") {
					redisVars--
				}
			}
			if redisVars != 0 {
				fail("Job %s does not reach Redis as the service pods do", j.Name)
			}
		}
	}

	// Network policies: the API pods in from the load balancer and
	// monitoring only, out to DNS, Redis and PostgreSQL only; each hook
	// Job nothing in, out to DNS and the one store it uses.
	nps := only[*networkingv1.NetworkPolicy](objs)
	if lookup[bool](t, v, "networkPolicy.enabled") {
		redisPorts, pgPorts := ports(t, v, "networkPolicy.redisEgress.ports"), ports(t, v, "networkPolicy.postgresEgress.ports")
		selecting := func(podLabels map[string]string) []*networkingv1.NetworkPolicy {
			var out []*networkingv1.NetworkPolicy
			for _, np := range nps {
				if selects(&np.Spec.PodSelector, podLabels) {
					out = append(out, np)
				}
			}
			return out
		}
		if api := selecting(d.Spec.Template.Labels); len(api) != 1 {
			fail("want one NetworkPolicy selecting the API pods, got %d", len(api))
		} else {
			errs = append(errs, checkNetworkPolicy(api[0], d.Spec.Template.Labels, redis, postgres, redisPorts, pgPorts)...)
		}
		for _, j := range jobs {
			component := j.Labels["app.kubernetes.io/component"]
			hook := selecting(j.Spec.Template.Labels)
			if len(hook) != 1 {
				fail("want one NetworkPolicy selecting the %s Job's pod, got %d", component, len(hook))
				continue
			}
			if len(hook[0].Spec.Ingress) != 0 {
				fail("NetworkPolicy %s lets traffic in to the %s Job's pod", hook[0].Name, component)
			}
			errs = append(errs, checkNetworkPolicy(hook[0], j.Spec.Template.Labels, component == "finalize", component == "migrate", redisPorts, pgPorts)...)
		}
		if len(nps) != 1+len(jobs) {
			fail("want %d NetworkPolicies (the API pods' and one a hook Job), got %d", 1+len(jobs), len(nps))
		}
	} else if len(nps) != 0 {
		fail("NetworkPolicy rendered while disabled")
	}

	// Prometheus operator objects.
	sms := only[*serviceMonitor](objs)
	if lookup[bool](t, v, "serviceMonitor.enabled") != (len(sms) == 1) {
		fail("ServiceMonitor: want %v, got %d", lookup[bool](t, v, "serviceMonitor.enabled"), len(sms))
	}
	for _, sm := range sms {
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "ops" || sm.Spec.Endpoints[0].Path != "/metrics" {
			fail("ServiceMonitor must scrape the ops port at /metrics")
		}
		if !selects(&sm.Spec.Selector, svc.Labels) {
			fail("ServiceMonitor does not select the Service")
		}
	}
	rules := only[*prometheusRule](objs)
	if lookup[bool](t, v, "prometheusRule.enabled") != (len(rules) == 1) {
		fail("PrometheusRule: want %v, got %d", lookup[bool](t, v, "prometheusRule.enabled"), len(rules))
	}
	for _, r := range rules {
		want := alertsFor(t, lookup[bool](t, v, "prometheusRule.planTuningAlerts"))
		got, _ := json.Marshal(r.Spec)
		wantJSON, _ := json.Marshal(want)
		if string(got) != string(wantJSON) {
			fail("PrometheusRule spec differs from deploy/prometheus/alerts.yaml (opt-in groups: %v)", lookup[bool](t, v, "prometheusRule.planTuningAlerts"))
		}
	}

	// helm test pods.
	var tests []string
	for _, p := range only[*corev1.Pod](objs) {
		if p.Annotations["helm.sh/hook"] != "test" {
			fail("Pod %s is not a test hook", p.Name)
		}
		if p.Spec.RestartPolicy != corev1.RestartPolicyNever {
			fail("test Pod %s: restartPolicy must be Never", p.Name)
		}
		tests = append(tests, p.Name)
	}
	wantTests := 0
	if testsOn {
		wantTests++
	}
	if rateLimitTest {
		wantTests++
	}
	if len(tests) != wantTests {
		fail("want %d test pods, got %v", wantTests, tests)
	}
	if rateLimitTest {
		errs = append(errs, checkRateLimitTest(t, objs, v)...)
	}
	return errs
}

// hookOrExternalSecret reports whether a pre-install hook can read Secret
// name: it is a hook itself, or not made by the chart at all.
func hookOrExternalSecret(objs []object, name string) bool {
	for _, o := range objs {
		if o.Kind == "Secret" && o.Name == name {
			return o.Hook
		}
	}
	return true
}

func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(set))
}

func ports(t *testing.T, v chartutil.Values, path string) []int32 {
	raw, _ := v.PathValue(path)
	list, _ := raw.([]any)
	var out []int32
	for _, p := range list {
		switch x := p.(type) {
		case float64:
			out = append(out, int32(x))
		case int64:
			out = append(out, int32(x))
		case int:
			out = append(out, int32(x))
		default:
			t.Fatalf("%s: port %v is %T", path, p, p)
		}
	}
	return out
}

// checkNetworkPolicy checks that the policy selects the pods labelled
// podLabels, lets in only the public and ops ports, and lets out exactly
// DNS, and Redis and PostgreSQL as asked.
func checkNetworkPolicy(np *networkingv1.NetworkPolicy, podLabels map[string]string, redis, postgres bool, redisPorts, pgPorts []int32) []string {
	var errs []string
	fail := func(format string, args ...any) {
		errs = append(errs, "NetworkPolicy "+np.Name+": "+fmt.Sprintf(format, args...))
	}
	if !selects(&np.Spec.PodSelector, podLabels) {
		fail("does not select the pods it is for")
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		fail("policyTypes must be Ingress and Egress")
	}
	for i, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			fail("ingress rule %d admits every source", i)
		}
		if len(r.Ports) == 0 {
			fail("ingress rule %d admits every port", i)
		}
		for _, p := range r.Ports {
			if p.Port == nil || (p.Port.String() != "http" && p.Port.String() != "ops") {
				fail("ingress rule %d opens port %v", i, p.Port)
			}
		}
	}
	type egress struct {
		name  string
		ports []string
	}
	want := []egress{{"dns", []string{"TCP/53", "UDP/53"}}}
	tcp := func(ps []int32) []string {
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("TCP/%d", p))
		}
		slices.Sort(out)
		return out
	}
	if redis {
		want = append(want, egress{"redis", tcp(redisPorts)})
	}
	if postgres {
		want = append(want, egress{"postgres", tcp(pgPorts)})
	}
	if len(np.Spec.Egress) != len(want) {
		fail("want %d egress rules (DNS, Redis, PostgreSQL as used), got %d", len(want), len(np.Spec.Egress))
		return errs
	}
	for i, r := range np.Spec.Egress {
		if len(r.To) == 0 {
			fail("egress rule %d (%s) allows every destination", i, want[i].name)
		}
		var got []string
		for _, p := range r.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if p.Port == nil || p.EndPort != nil {
				fail("egress rule %d (%s) opens a port range", i, want[i].name)
				continue
			}
			got = append(got, fmt.Sprintf("%s/%s", proto, p.Port.String()))
		}
		slices.Sort(got)
		if !slices.Equal(got, want[i].ports) {
			fail("egress rule %d (%s): ports %v, want %v", i, want[i].name, got, want[i].ports)
		}
	}
	return errs
}

// checkRateLimitTest checks the wiring of the rate-limit helm test: the
// test plan is in the plans file, the key's hash is in the keys file, and
// the key is well formed so the service does not reject it as malformed.
func checkRateLimitTest(t *testing.T, objs []object, v chartutil.Values) []string {
	var errs []string
	key := lookup[string](t, v, "tests.rateLimit.apiKey")
	planName := lookup[string](t, v, "tests.rateLimit.plan")
	limit := lookup[int](t, v, "tests.rateLimit.limit")
	if err := checkKeyFormat(key); err != nil {
		errs = append(errs, fmt.Sprintf("tests.rateLimit.apiKey: %v", err))
	}
	var plans struct {
		Plans map[string]struct {
			Quotas []struct {
				Limit  int    `json:"limit"`
				Period string `json:"period"`
			} `json:"quotas"`
			Ban any `json:"ban"`
		} `json:"plans"`
	}
	for _, cm := range only[*corev1.ConfigMap](objs) {
		if data, ok := cm.Data["plans.yaml"]; ok {
			if err := yaml.UnmarshalStrict([]byte(data), &plans); err != nil {
				errs = append(errs, fmt.Sprintf("plans.yaml: %v", err))
			}
		}
	}
	p, ok := plans.Plans[planName]
	if !ok || len(p.Quotas) != 1 || p.Quotas[0].Limit != limit || p.Quotas[0].Period != "1m" || p.Ban != "off" {
		errs = append(errs, fmt.Sprintf("plans.yaml: plan %s must be %d/1m without bans, got %+v", planName, limit, p))
	}
	var keys struct {
		Keys []map[string]any `json:"keys"`
	}
	found := false
	for _, s := range only[*corev1.Secret](objs) {
		if data, ok := s.Data[lookup[string](t, v, "apiKeys.secretKey")]; ok && !strings.Contains(s.Name, "test") {
			if err := yaml.Unmarshal(data, &keys); err != nil {
				errs = append(errs, fmt.Sprintf("keys file: %v", err))
			}
			for _, k := range keys.Keys {
				if k["sha256"] == sha256hex(key) && k["plan"] == planName {
					found = true
				}
				if _, plain := k["key"]; plain && k["plan"] == planName {
					errs = append(errs, "keys file holds the test key in plaintext; use its sha256")
				}
			}
		}
	}
	if !found {
		errs = append(errs, "keys file has no sha256 entry for the test key on the test plan")
	}
	return errs
}
