package chartest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestSchemaIsStrictAndSelfContained walks values.schema.json: no remote
// $ref, and every object schema either lists its properties and forbids
// others, or is a map whose values have a schema of their own.
func TestSchemaIsStrictAndSelfContained(t *testing.T) {
	t.Parallel()
	var schema any
	if err := json.Unmarshal(readFile(t, chartDir+"/values.schema.json"), &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, node any)
	walk = func(path string, node any) {
		switch n := node.(type) {
		case []any:
			for i, v := range n {
				walk(fmt.Sprintf("%s[%d]", path, i), v)
			}
		case map[string]any:
			if ref, ok := n["$ref"].(string); ok && !strings.HasPrefix(ref, "#/") {
				t.Errorf("%s: $ref %q leaves the file", path, ref)
			}
			if id, ok := n["$id"].(string); ok {
				t.Errorf("%s: $id %q", path, id)
			}
			_, hasProps := n["properties"]
			ap, hasAP := n["additionalProperties"]
			if hasProps && ap != false {
				t.Errorf("%s: lists properties but does not set additionalProperties: false", path)
			}
			if n["type"] == "object" && !hasProps {
				if m, ok := ap.(map[string]any); !hasAP || !ok || len(m) == 0 {
					t.Errorf("%s: an object without properties must give its values a schema (additionalProperties: {...})", path)
				}
			}
			keys := make([]string, 0, len(n))
			for k := range n {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(path+"/"+k, n[k])
			}
		}
	}
	walk("#", schema)
}

// TestSchemaRejectsBadValues renders with one wrong value at a time and
// expects the schema (or a guard in the templates) to refuse it.
func TestSchemaRejectsBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		path string
		val  any
		want string // part of the error
	}{
		{"unknown top-level key", "replicas", 3, "replicas"},
		{"unknown nested key", "redis.host", "redis", "host"},
		{"unknown key in a list item", "tolerations", []any{map[string]any{"key": "a", "oops": "b"}}, "oops"},
		{"string for an integer", "replicaCount", "3", "replicaCount"},
		{"float for an integer", "replicaCount", 1.5, "replicaCount"},
		{"zero replicas", "replicaCount", 0, "replicaCount"},
		{"unknown store", "store", "mysql", "store"},
		{"bad duration", "redis.timeout", "fast", "timeout"},
		{"bad redis mode", "redis.mode", "ring", "mode"},
		{"integer for a boolean", "autoscaling.enabled", 1, "enabled"},
		{"quota limit below one", "plans.free.quotas", []any{map[string]any{"limit": 0, "period": "1m"}}, "limit"},
		{"bad quota period", "plans.free.quotas", []any{map[string]any{"limit": 5, "period": "1 minute"}}, "period"},
		{"unknown plan field", "plans.free.burst", 5, "burst"},
		{"ban must be off or settings", "plans.free.ban", "never", "ban"},
		{"unknown plan mode", "plans.free.mode", "dry-run", "mode"},
		{"candidate without quotas", "plans.free.candidate", map[string]any{"ban": "off"}, "quotas"},
		{"candidate with no quota", "plans.free.candidate", map[string]any{"quotas": []any{}}, "quotas"},
		{"candidate ban not off or settings", "plans.free.candidate", map[string]any{"quotas": []any{map[string]any{"limit": 5, "period": "1m"}}, "ban": "later"}, "ban"},
		{"key candidate with an unknown field", "apiKeys.entries", []any{map[string]any{"plan": "pro", "sha256": strings.Repeat("a", 64), "candidate": map[string]any{"quotas": []any{map[string]any{"limit": 5, "period": "1m"}}, "ban": "off"}}}, "ban"},
		{"key entry without key or hash", "apiKeys.entries", []any{map[string]any{"plan": "pro"}}, "entries"},
		{"malformed sha256", "apiKeys.entries", []any{map[string]any{"plan": "pro", "sha256": "abc"}}, "sha256"},
		{"url in the wrong scheme", "redis.url", "http://redis:6379", "url"},
		{"bad pull policy", "image.pullPolicy", "Sometimes", "pullPolicy"},
		{"bad trusted proxy", "config.trustedProxies", []any{"10.0.0.1"}, "trustedProxies"},
		{"bad auth failure limit", "config.authFailureLimit", "lots", "authFailureLimit"},
		{"bad egress port", "networkPolicy.redisEgress.ports", []any{70000}, "ports"},
		{"port as a string", "service.port", "8080", "port"},
		{"cpu as garbage", "resources.requests.cpu", "lots", "cpu"},
		{"requests without cpu", "resources.requests.cpu", nil, "cpu"},
		{"limits without memory", "resources.limits.memory", nil, "memory"},
		{"test key not a key", "tests.rateLimit.apiKey", "secret", "apiKey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vals := map[string]any{}
			setPath(vals, tt.path, tt.val)
			_, err := render(vals, renderOptions{})
			if err == nil {
				t.Fatalf("%s=%v rendered; want the schema to refuse it", tt.path, tt.val)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error does not name %q: %v", tt.want, err)
			}
		})
	}
}

// TestRenderGuards checks the combinations the templates refuse with a
// message of their own.
func TestRenderGuards(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vals string
		want string
	}{
		{"memory store with replicas", "replicaCount: 3", "store=memory"},
		{"memory store with autoscaling", "autoscaling: {enabled: true}", "store=memory"},
		{"postgres without a URL", "store: postgres", "postgres.existingSecret or postgres.url"},
		{"redis without a URL", "redis: {enabled: true}", "redis.existingSecret or redis.url"},
		{"cluster without addresses", "redis: {enabled: true, mode: cluster, password: x}", "redis.addrs"},
		{"sentinel without master", "redis: {enabled: true, mode: sentinel, addrs: ['s:26379']}", "masterName"},
		{"termination budget", "terminationGracePeriodSeconds: 29", "exceeds terminationGracePeriodSeconds"},
		{"network policy without redis peers", "{redis: {enabled: true, url: 'redis://r:6379'}, networkPolicy: {enabled: true}}", "redisEgress.to"},
		{"test plan shadows a plan", "{plans: {helm-test: {quotas: [{limit: 1, period: 1m}]}}, tests: {rateLimit: {apiKey: pst_ci0helm0test0key0rate0limit000012RjBW3}}}", "reserved"},
		{"autoscaling bounds", "{store: postgres, postgres: {url: 'postgres://p'}, autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}}", "minReplicas"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tt.vals), &vals); err != nil {
				t.Fatal(err)
			}
			_, err := render(vals, renderOptions{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("want an error containing %q, got %v", tt.want, err)
			}
		})
	}
}

// TestKubeVersions renders the production values for every supported
// minor: the preStop sleep action appears from 1.30 on, and before that the
// service's own drain delay does the job, within the same budget.
func TestKubeVersions(t *testing.T) {
	t.Parallel()
	vals := readValues(t, ciValuesDir+"/production-values.yaml")
	for _, tt := range []struct {
		version string
		sleep   bool
	}{
		{"v1.25.0", false}, {"v1.29.4", false}, {"v1.30.0", true}, {"v1.31.0", true}, {"v1.34.1", true},
	} {
		t.Run(tt.version, func(t *testing.T) {
			t.Parallel()
			objs := mustRender(t, vals, renderOptions{KubeVersion: tt.version})
			d := one[*appsv1.Deployment](t, objs)
			for _, err := range checkDeployment(d) {
				t.Error(err)
			}
			c := d.Spec.Template.Spec.Containers[0]
			got := c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil
			if got != tt.sleep {
				t.Errorf("preStop sleep rendered = %v, want %v", got, tt.sleep)
			}
		})
	}
	t.Run("v1.24 is refused", func(t *testing.T) {
		t.Parallel()
		if _, err := render(vals, renderOptions{KubeVersion: "v1.24.9"}); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
			t.Errorf("want a kubeVersion error, got %v", err)
		}
	})
	t.Run("budget without preStop", func(t *testing.T) {
		t.Parallel()
		// 5s drain + 20s grace fit in 25s only where there is no preStop sleep.
		v := map[string]any{"terminationGracePeriodSeconds": 25}
		if _, err := render(v, renderOptions{KubeVersion: "v1.29.0"}); err != nil {
			t.Errorf("1.29: %v", err)
		}
		if _, err := render(v, renderOptions{KubeVersion: "v1.30.0"}); err == nil {
			t.Error("1.30: 5s preStop + 5s drain + 20s grace rendered within 25s")
		}
	})
}

// TestConfigChecksumToggle: the checksum annotation follows the plans, so
// a plan change rolls the pods only when asked to.
func TestConfigChecksumToggle(t *testing.T) {
	t.Parallel()
	annotation := func(vals map[string]any) string {
		d := one[*appsv1.Deployment](t, mustRender(t, vals, renderOptions{}))
		return d.Spec.Template.Annotations["checksum/config"]
	}
	off := annotation(map[string]any{})
	if off != "" {
		t.Errorf("checksum/config set while off: %q", off)
	}
	a := annotation(map[string]any{"config": map[string]any{"checksumAnnotation": true}})
	b := annotation(map[string]any{"config": map[string]any{"checksumAnnotation": true},
		"plans": map[string]any{"free": map[string]any{"quotas": []any{map[string]any{"limit": 61, "period": "1m"}}}}})
	if a == "" || a == b {
		t.Errorf("checksum/config must change with the plans: %q vs %q", a, b)
	}
}

// TestToggles renders the switches the ci values files leave alone and
// checks each rendering as the ci files are checked.
func TestToggles(t *testing.T) {
	t.Parallel()
	const pg = "{store: postgres, postgres: {url: 'postgres://u:ci-toggle-pw@db:5432/p'}"
	tests := []struct {
		name string
		vals string
	}{
		{"budget off with replicas", pg + ", replicaCount: 3, podDisruptionBudget: {enabled: false}}"},
		{"autoscaling on cpu only", pg + ", autoscaling: {enabled: true, minReplicas: 2}}"},
		{"migration off", "{store: postgres, replicaCount: 2, postgres: {url: 'postgres://u:ci-toggle-pw@db:5432/p', migrate: {enabled: false}}}"},
		{"no tests", "{tests: {enabled: false}}"},
		{"sentinel without password", pg + ", replicaCount: 2, redis: {enabled: true, mode: sentinel, addrs: ['s:26379'], masterName: m}}"},
		{"network policy memory store", "{networkPolicy: {enabled: true}}"},
		{"digest and ingress", "{image: {digest: 'sha256:" + strings.Repeat("ab", 32) + "'}, ingress: {enabled: true, hosts: [{host: a.example}]}}"},
		{"existing keys secret", "{apiKeys: {existingSecret: my-keys, secretKey: k.yaml}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tt.vals), &vals); err != nil {
				t.Fatal(err)
			}
			objs := mustRender(t, vals, renderOptions{})
			for _, err := range checkRelease(t, objs, effectiveValues(t, vals)) {
				t.Error(err)
			}
		})
	}
}
