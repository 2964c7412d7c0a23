package chartest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Paths of the artifacts under test, relative to this package.
const (
	chartDir     = "../petstore"
	ciValuesDir  = "../petstore/ci"
	kustomizeDir = "../../deploy/kustomize"
	deployDir    = "../../deploy"
	releaseName  = "petstore"
	namespace    = "petstore"
)

// kubeVersion is the cluster version the chart is rendered for unless a
// test says otherwise; the SDK would assume 1.20 if told nothing.
const kubeVersion = "v1.31.0"

// extraAPIVersions are the API groups a production cluster offers beyond
// the built-in ones: the Prometheus operator's.
var extraAPIVersions = []string{"monitoring.coreos.com/v1", "autoscaling/v2"}

// object is one rendered manifest, decoded strictly into its API type.
type object struct {
	Kind   string
	Name   string
	Hook   bool   // a Helm hook (migration job, tests)
	Source string // template path or kustomize origin
	Raw    []byte // the manifest as JSON
	Meta   metav1.ObjectMeta
	Obj    any // *appsv1.Deployment, *corev1.Secret, ...
}

// newObject returns an empty value of the API type for apiVersion and kind;
// unknown kinds are an error, so nothing is rendered that is not checked.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/Pod":
		return &corev1.Pod{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "batch/v1/Job":
		return &batchv1.Job{}, nil
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1/Ingress":
		return &networkingv1.Ingress{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, nil
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &prometheusRule{}, nil
	}
	return nil, fmt.Errorf("unknown kind %s %s", apiVersion, kind)
}

// decodeManifest decodes one YAML document strictly: duplicate keys,
// unknown fields and case-insensitive field matches are all errors.
func decodeManifest(source string, doc []byte) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	var head struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	obj, err := newObject(head.APIVersion, head.Kind)
	if err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	strict, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return object{}, fmt.Errorf("%s: %s %s: %w", source, head.Kind, head.Metadata.Name, err)
	}
	if len(strict) > 0 {
		return object{}, fmt.Errorf("%s: %s %s: %v", source, head.Kind, head.Metadata.Name, strict)
	}
	o := object{Kind: head.Kind, Name: head.Metadata.Name, Source: source, Raw: js, Meta: head.Metadata, Obj: obj}
	if err := checkMeta(o); err != nil {
		return object{}, err
	}
	return o, nil
}

// checkMeta applies the API server's rules for names and labels.
func checkMeta(o object) error {
	if o.Name == "" {
		return fmt.Errorf("%s: %s without a name", o.Source, o.Kind)
	}
	if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
		return fmt.Errorf("%s: %s name %q: %v", o.Source, o.Kind, o.Name, errs)
	}
	if o.Kind == "Service" {
		if errs := validation.IsDNS1035Label(o.Name); len(errs) > 0 {
			return fmt.Errorf("%s: Service name %q: %v", o.Source, o.Name, errs)
		}
	}
	for k, v := range o.Meta.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("%s: label key %q: %v", o.Source, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("%s: label %s=%q: %v", o.Source, k, v, errs)
		}
	}
	return nil
}

var (
	chartOnce sync.Once
	chartVal  *chart.Chart
	chartErr  error
)

// loadChart loads the chart once; rendering does not modify it.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chartOnce.Do(func() { chartVal, chartErr = loader.Load(chartDir) })
	if chartErr != nil {
		t.Fatalf("load chart: %v", chartErr)
	}
	return chartVal
}

// ciValuesFiles lists helm/petstore/ci/*-values.yaml.
func ciValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(ciValuesDir, "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci values files in %s (%v)", ciValuesDir, err)
	}
	return files
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return v.AsMap()
}

// renderOptions are the cluster the chart is rendered for.
type renderOptions struct {
	KubeVersion string // default kubeVersion
}

// render renders the chart as `helm install --dry-run` would, client-side,
// and returns every manifest (hooks included) decoded strictly.
func render(vals map[string]any, opts renderOptions) ([]object, error) {
	c, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	kv := opts.KubeVersion
	if kv == "" {
		kv = kubeVersion
	}
	parsed, err := chartutil.ParseKubeVersion(kv)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = parsed
	install.APIVersions = chartutil.VersionSet(extraAPIVersions)
	rel, err := install.Run(c, vals)
	if err != nil {
		return nil, err
	}
	var objs []object
	add := func(source, manifest string, hook bool) error {
		docs := releaseutil.SplitManifests(manifest)
		for _, k := range slices.Sorted(maps.Keys(docs)) {
			doc := docs[k]
			if strings.TrimSpace(doc) == "" {
				continue
			}
			o, err := decodeManifest(source, []byte(doc))
			if err != nil {
				return err
			}
			o.Hook = hook
			objs = append(objs, o)
		}
		return nil
	}
	if err := add("manifest", rel.Manifest, false); err != nil {
		return nil, err
	}
	for _, h := range rel.Hooks {
		if err := add(h.Path, h.Manifest, true); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, o := range objs {
		id := o.Kind + "/" + o.Name
		if seen[id] {
			return nil, fmt.Errorf("%s rendered twice", id)
		}
		seen[id] = true
		if o.Meta.Namespace != namespace {
			return nil, fmt.Errorf("%s: namespace %q, want the release namespace %q", id, o.Meta.Namespace, namespace)
		}
	}
	return objs, nil
}

// mustRender renders or fails the test.
func mustRender(t *testing.T, vals map[string]any, opts renderOptions) []object {
	t.Helper()
	objs, err := render(vals, opts)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return objs
}

// only returns the objects of one Go type.
func only[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.Obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the single object of one Go type, failing otherwise.
func one[T any](t *testing.T, objs []object) T {
	t.Helper()
	all := only[T](objs)
	if len(all) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d", zero, len(all))
	}
	return all[0]
}

// readFile reads a repository file relative to this package.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// setPath sets a dotted path in a values map, creating maps on the way.
func setPath(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}
