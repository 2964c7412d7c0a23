package chartest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// build runs `kustomize build` on a directory under deploy/kustomize and
// decodes every resource strictly.
func build(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(kustomizeDir, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs []object
	for i, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		o, err := decodeManifest(fmt.Sprintf("%s#%d", dir, i), doc)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	return objs
}

// TestKustomizeBuilds builds every kustomization and checks it as the
// chart's rendering is checked.
func TestKustomizeBuilds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dir       string
		namespace string
		hpa       bool
		netpol    bool
		redis     bool
		postgres  bool
	}{
		{dir: "base"},
		{dir: "overlays/dev", namespace: "petstore-dev"},
		{dir: "overlays/production", namespace: "petstore", hpa: true, netpol: true, redis: true, postgres: true},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			t.Parallel()
			objs := build(t, tt.dir)
			for _, o := range objs {
				if o.Meta.Namespace != tt.namespace {
					t.Errorf("%s %s: namespace %q, want %q", o.Kind, o.Name, o.Meta.Namespace, tt.namespace)
				}
			}
			d := one[*appsv1.Deployment](t, objs)
			for _, err := range checkDeployment(d) {
				t.Error(err)
			}
			if hpas := only[*autoscalingv2.HorizontalPodAutoscaler](objs); (len(hpas) == 1) != tt.hpa {
				t.Errorf("HPA: want %v, got %d", tt.hpa, len(hpas))
			}
			if tt.hpa && d.Spec.Replicas != nil {
				t.Error("Deployment sets replicas while the HPA owns them")
			}
			if !selects(one[*policyv1.PodDisruptionBudget](t, objs).Spec.Selector, d.Spec.Template.Labels) {
				t.Error("PDB does not select the pods")
			}
			nps := only[*networkingv1.NetworkPolicy](objs)
			if (len(nps) == 1) != tt.netpol {
				t.Errorf("NetworkPolicy: want %v, got %d", tt.netpol, len(nps))
			}
			for _, np := range nps {
				for _, err := range checkNetworkPolicy(np, d.Spec.Template.Labels, tt.redis, tt.postgres, []int32{6380}, []int32{5432}) {
					t.Error(err)
				}
			}
			// Every file the pods are told to read is provided by the build
			// or named as an external Secret in the overlay's notes.
			for _, cm := range only[*corev1.ConfigMap](objs) {
				if data, ok := cm.Data["plans.yaml"]; ok {
					var plans map[string]any
					if err := yaml.UnmarshalStrict([]byte(data), &plans); err != nil || plans["plans"] == nil {
						t.Errorf("plans.yaml: %v", err)
					}
				}
			}
			for _, s := range only[*corev1.Secret](objs) {
				var keys struct {
					Keys []map[string]any `json:"keys"`
				}
				if err := yaml.Unmarshal(s.Data["keys.yaml"], &keys); err != nil {
					t.Errorf("Secret %s keys.yaml: %v", s.Name, err)
				}
				for i, k := range keys.Keys {
					if key, ok := k["key"].(string); ok {
						if err := checkKeyFormat(key); err != nil {
							t.Errorf("Secret %s keys[%d]: %v", s.Name, i, err)
						}
					}
				}
			}
		})
	}
}

// TestKustomizeHookJobs checks the production overlay's Jobs, the
// migration and the finalize step, and that they run the image the
// production overlay deploys.
func TestKustomizeHookJobs(t *testing.T) {
	t.Parallel()
	d := one[*appsv1.Deployment](t, build(t, "overlays/production"))
	for name, args := range map[string][]string{"migrate": {"migrate"}, "finalize": {"limits", "finalize", "--wait", "4m"}} {
		objs := build(t, "overlays/production/"+name)
		if len(objs) != 2 {
			t.Fatalf("%s: want the Job and its NetworkPolicy, got %d objects", name, len(objs))
		}
		j := one[*batchv1.Job](t, objs)
		np := one[*networkingv1.NetworkPolicy](t, objs)
		if np.Namespace != "petstore" || len(np.Spec.Ingress) != 0 {
			t.Errorf("NetworkPolicy %s: want the production namespace and nothing in", np.Name)
		}
		for _, err := range checkNetworkPolicy(np, j.Spec.Template.Labels, name == "finalize", name == "migrate", []int32{6380}, []int32{5432}) {
			t.Error(err)
		}
		for _, err := range checkPodSpec("Job "+j.Name, j.Spec.Template.Spec) {
			t.Error(err)
		}
		if j.Namespace != "petstore" || j.Spec.BackoffLimit == nil || j.Spec.TTLSecondsAfterFinished == nil {
			t.Errorf("Job %s needs the production namespace, backoffLimit and ttlSecondsAfterFinished", j.Name)
		}
		if got, want := j.Spec.Template.Spec.Containers[0].Image, d.Spec.Template.Spec.Containers[0].Image; got != want {
			t.Errorf("Job %s runs image %s, production runs %s", j.Name, got, want)
		}
		if got := j.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, args) {
			t.Errorf("Job %s runs %v, want %v", j.Name, got, args)
		}
	}
}

// TestKustomizeMatchesChart renders the chart with ci/production-values.yaml
// and fails on any drift from the production overlay in the fields that
// decide how the service runs.
func TestKustomizeMatchesChart(t *testing.T) {
	t.Parallel()
	chartObjs := mustRender(t, readValues(t, ciValuesDir+"/production-values.yaml"), renderOptions{})
	kustObjs := build(t, "overlays/production")

	same := func(what string, chartVal, kustVal any) {
		t.Helper()
		a, _ := json.Marshal(chartVal)
		b, _ := json.Marshal(kustVal)
		if !bytes.Equal(a, b) {
			t.Errorf("%s drifted:\n  chart:     %s\n  kustomize: %s", what, a, b)
		}
	}

	cd, kd := one[*appsv1.Deployment](t, chartObjs), one[*appsv1.Deployment](t, kustObjs)
	same("Deployment name", cd.Name, kd.Name)
	same("Deployment selector", cd.Spec.Selector, kd.Spec.Selector)
	same("Deployment replicas", cd.Spec.Replicas, kd.Spec.Replicas)
	same("Deployment strategy", cd.Spec.Strategy, kd.Spec.Strategy)
	same("pod labels", cd.Spec.Template.Labels, kd.Spec.Template.Labels)
	cp, kp := cd.Spec.Template.Spec, kd.Spec.Template.Spec
	same("pod securityContext", cp.SecurityContext, kp.SecurityContext)
	same("terminationGracePeriodSeconds", cp.TerminationGracePeriodSeconds, kp.TerminationGracePeriodSeconds)
	same("automountServiceAccountToken", cp.AutomountServiceAccountToken, kp.AutomountServiceAccountToken)
	same("serviceAccountName", cp.ServiceAccountName, kp.ServiceAccountName)
	same("topologySpreadConstraints", cp.TopologySpreadConstraints, kp.TopologySpreadConstraints)
	same("volumes", cp.Volumes, kp.Volumes)
	if len(cp.Containers) != 1 || len(kp.Containers) != 1 {
		t.Fatalf("want one container each, got %d and %d", len(cp.Containers), len(kp.Containers))
	}
	cc, kc := cp.Containers[0], kp.Containers[0]
	same("image", cc.Image, kc.Image)
	same("args", cc.Args, kc.Args)
	same("ports", cc.Ports, kc.Ports)
	same("startupProbe", cc.StartupProbe, kc.StartupProbe)
	same("livenessProbe", cc.LivenessProbe, kc.LivenessProbe)
	same("readinessProbe", cc.ReadinessProbe, kc.ReadinessProbe)
	same("lifecycle", cc.Lifecycle, kc.Lifecycle)
	same("container securityContext", cc.SecurityContext, kc.SecurityContext)
	same("resources", cc.Resources, kc.Resources)
	same("volumeMounts", cc.VolumeMounts, kc.VolumeMounts)
	same("env names", envNames(cc), envNames(kc))
	same("env", sortedEnv(cc.Env), sortedEnv(kc.Env))

	cs, ks := one[*corev1.Service](t, chartObjs), one[*corev1.Service](t, kustObjs)
	same("Service", cs.Spec, ks.Spec)
	same("HPA", one[*autoscalingv2.HorizontalPodAutoscaler](t, chartObjs).Spec, one[*autoscalingv2.HorizontalPodAutoscaler](t, kustObjs).Spec)
	same("PDB", one[*policyv1.PodDisruptionBudget](t, chartObjs).Spec, one[*policyv1.PodDisruptionBudget](t, kustObjs).Spec)

	var cn *networkingv1.NetworkPolicy
	for _, np := range only[*networkingv1.NetworkPolicy](chartObjs) {
		if selects(&np.Spec.PodSelector, cd.Spec.Template.Labels) {
			cn = np
		}
	}
	if cn == nil {
		t.Fatal("the chart with production values has no NetworkPolicy for the API pods")
	}
	kn := one[*networkingv1.NetworkPolicy](t, kustObjs)
	same("NetworkPolicy podSelector", cn.Spec.PodSelector, kn.Spec.PodSelector)
	same("NetworkPolicy egress", cn.Spec.Egress, kn.Spec.Egress)
	// The chart also lets its own helm test pods in; kustomize has none.
	var chartIngress []networkingv1.NetworkPolicyIngressRule
	for _, r := range cn.Spec.Ingress {
		if !strings.Contains(fmt.Sprint(r.From), "helm-test") {
			chartIngress = append(chartIngress, r)
		}
	}
	same("NetworkPolicy ingress", chartIngress, kn.Spec.Ingress)

	// The hook Jobs (the migration, the finalize step): same image,
	// command, hardening and settings names.
	for _, name := range []string{"migrate", "finalize"} {
		var cj *batchv1.Job
		for _, j := range only[*batchv1.Job](chartObjs) {
			if j.Labels["app.kubernetes.io/component"] == name {
				cj = j
			}
		}
		if cj == nil {
			t.Errorf("the chart with production values has no %s Job", name)
			continue
		}
		kobjs := build(t, "overlays/production/"+name)
		kj := one[*batchv1.Job](t, kobjs)
		for _, np := range only[*networkingv1.NetworkPolicy](chartObjs) {
			if selects(&np.Spec.PodSelector, cj.Spec.Template.Labels) {
				knp := one[*networkingv1.NetworkPolicy](t, kobjs)
				same(name+" NetworkPolicy podSelector", np.Spec.PodSelector, knp.Spec.PodSelector)
				same(name+" NetworkPolicy egress", np.Spec.Egress, knp.Spec.Egress)
				same(name+" NetworkPolicy ingress", np.Spec.Ingress, knp.Spec.Ingress)
			}
		}
		cjc, kjc := cj.Spec.Template.Spec.Containers[0], kj.Spec.Template.Spec.Containers[0]
		same(name+" image", cjc.Image, kjc.Image)
		same(name+" args", cjc.Args, kjc.Args)
		same(name+" securityContext", cjc.SecurityContext, kjc.SecurityContext)
		same(name+" pod securityContext", cj.Spec.Template.Spec.SecurityContext, kj.Spec.Template.Spec.SecurityContext)
		same(name+" env names", envNames(cjc), envNames(kjc))
		same(name+" resources", cjc.Resources, kjc.Resources)
		same(name+" limits", []any{cj.Spec.BackoffLimit, cj.Spec.ActiveDeadlineSeconds, cj.Spec.TTLSecondsAfterFinished},
			[]any{kj.Spec.BackoffLimit, kj.Spec.ActiveDeadlineSeconds, kj.Spec.TTLSecondsAfterFinished})
	}

	// The overlay ships the chart's production plans (less the helm test plan).
	var chartPlans, kustPlans map[string]any
	for _, cm := range only[*corev1.ConfigMap](chartObjs) {
		_ = yaml.Unmarshal([]byte(cm.Data["plans.yaml"]), &chartPlans)
	}
	for _, cm := range only[*corev1.ConfigMap](kustObjs) {
		_ = yaml.Unmarshal([]byte(cm.Data["plans.yaml"]), &kustPlans)
	}
	if chartPlans == nil || kustPlans == nil {
		t.Fatal("plans.yaml missing from the chart or the overlay")
	}
	cpl, _ := chartPlans["plans"].(map[string]any)
	delete(cpl, "helm-test")
	same("plans", chartPlans, kustPlans)
}

func sortedEnv(env []corev1.EnvVar) []corev1.EnvVar {
	out := slices.Clone(env)
	slices.SortFunc(out, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return out
}
