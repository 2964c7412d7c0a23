package chartest

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The checks below are shared by the chart and the kustomize tests. Each
// returns every problem it finds, so one run shows them all.

// serviceUser is the image's numeric non-root user.
const serviceUser = 65532

// agreedEnv is every environment variable the petstore binary reads.
var agreedEnv = map[string]bool{
	"PETSTORE_ADDR": true, "PETSTORE_OPS_ADDR": true, "PETSTORE_STORE": true, "PETSTORE_DATABASE_URL": true,
	"PETSTORE_DB_MAX_CONNS": true, "PETSTORE_REDIS_URL": true, "PETSTORE_REDIS_MODE": true, "PETSTORE_REDIS_ADDRS": true,
	"PETSTORE_REDIS_MASTER_NAME": true, "PETSTORE_REDIS_USERNAME": true, "PETSTORE_REDIS_PASSWORD": true,
	"PETSTORE_REDIS_TIMEOUT": true, "PETSTORE_RATELIMIT_FAILURE_MODE": true, "PETSTORE_RATELIMIT_REPLICAS": true,
	"PETSTORE_RATELIMIT_PIPELINES": true, "PETSTORE_RATELIMIT_PIPELINE_HOLD": true, "PETSTORE_RATELIMIT_DRAFT_FIELDS": true,
	"PETSTORE_PLANS_FILE": true, "PETSTORE_KEYS_FILE": true, "PETSTORE_KEY_CACHE_TTL": true, "PETSTORE_RELOAD_INTERVAL": true,
	"PETSTORE_TRUSTED_PROXIES": true, "PETSTORE_AUTH_FAILURE_LIMIT": true, "PETSTORE_MAX_BODY_BYTES": true,
	"PETSTORE_SHUTDOWN_GRACE": true, "PETSTORE_DRAIN_DELAY": true, "PETSTORE_LOG_LEVEL": true, "PETSTORE_LOG_FORMAT": true,
	// The Go runtime's own: the collector's pace and soft memory limit.
	"GOGC": true, "GOMEMLIMIT": true,
}

// secretEnv must come from a Secret, never from a literal value.
var secretEnv = map[string]bool{
	"PETSTORE_DATABASE_URL": true, "PETSTORE_REDIS_URL": true, "PETSTORE_REDIS_PASSWORD": true,
}

// checkPodSpec checks the hardening every pod must have, whatever it runs.
func checkPodSpec(where string, spec corev1.PodSpec) []string {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, where+": "+fmt.Sprintf(format, args...)) }

	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		fail("automountServiceAccountToken must be false")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		fail("must not share host namespaces")
	}
	psc := spec.SecurityContext
	if psc == nil {
		fail("no pod securityContext")
		psc = &corev1.PodSecurityContext{}
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		fail("pod securityContext.runAsNonRoot must be true")
	}
	if psc.RunAsUser == nil || *psc.RunAsUser != serviceUser {
		fail("pod securityContext.runAsUser must be %d", serviceUser)
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("pod seccompProfile must be RuntimeDefault")
	}

	emptyDirs := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
		if v.HostPath != nil {
			fail("volume %s: hostPath is not allowed", v.Name)
		}
	}
	var containers []corev1.Container
	containers = append(containers, spec.InitContainers...)
	containers = append(containers, spec.Containers...)
	if len(spec.Containers) == 0 {
		fail("no containers")
	}
	for _, c := range containers {
		cw := fmt.Sprintf("container %s", c.Name)
		if c.Image == "" || strings.HasSuffix(c.Image, ":latest") || !strings.ContainsAny(c.Image, ":@") {
			fail("%s: image %q must be pinned to a tag or digest", cw, c.Image)
		}
		sc := c.SecurityContext
		if sc == nil {
			fail("%s: no securityContext", cw)
			continue
		}
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			fail("%s: runAsNonRoot must be true", cw)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser != serviceUser {
			fail("%s: runAsUser must be %d", cw, serviceUser)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			fail("%s: readOnlyRootFilesystem must be true", cw)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			fail("%s: allowPrivilegeEscalation must be false", cw)
		}
		if sc.Privileged != nil && *sc.Privileged {
			fail("%s: must not be privileged", cw)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			fail("%s: capabilities must drop ALL and add none", cw)
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			fail("%s: seccompProfile must be RuntimeDefault", cw)
		}
		req, lim := c.Resources.Requests, c.Resources.Limits
		if req.Cpu().IsZero() || req.Memory().IsZero() {
			fail("%s: resources.requests needs cpu and memory", cw)
		}
		if lim.Memory().IsZero() {
			fail("%s: resources.limits needs memory", cw)
		}
		tmp := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/tmp" && emptyDirs[m.Name] {
				tmp = true
			}
		}
		if !tmp {
			fail("%s: /tmp must be an emptyDir (the root filesystem is read-only)", cw)
		}
	}
	return errs
}

// checkDeployment checks the service's Deployment: ports, probes, rollout,
// termination budget, configuration files, env names and sources.
func checkDeployment(d *appsv1.Deployment) []string {
	var errs []string
	fail := func(format string, args ...any) {
		errs = append(errs, "Deployment "+d.Name+": "+fmt.Sprintf(format, args...))
	}
	spec := d.Spec.Template.Spec
	errs = append(errs, checkPodSpec("Deployment "+d.Name, spec)...)

	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		fail("selector %v does not match the pod labels %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate == nil ||
		d.Spec.Strategy.RollingUpdate.MaxUnavailable == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.String() != "0" {
		fail("strategy must be RollingUpdate with maxUnavailable 0")
	}

	var c *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "petstore" {
			c = &spec.Containers[i]
		}
	}
	if c == nil {
		return append(errs, "Deployment "+d.Name+": no container named petstore")
	}
	if len(c.Command) > 0 || !slices.Equal(c.Args, []string{"serve"}) {
		fail("container must run the image entrypoint with args [serve], got command %v args %v", c.Command, c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			fail("port %s must be TCP", p.Name)
		}
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["ops"] != 9090 || len(ports) != 2 {
		fail("ports must be http 8080 and ops 9090, got %v", ports)
	}
	probe := func(name string, p *corev1.Probe, wantPath string) {
		if p == nil || p.HTTPGet == nil {
			fail("%s probe must be an httpGet", name)
			return
		}
		port := p.HTTPGet.Port
		if port.Type == intstr.String {
			port = intstr.FromInt32(ports[port.StrVal])
		}
		if port.IntVal != 9090 {
			fail("%s probe must use the ops port 9090, got %s", name, p.HTTPGet.Port.String())
		}
		if p.HTTPGet.Path != wantPath {
			fail("%s probe path must be %s, got %s", name, wantPath, p.HTTPGet.Path)
		}
	}
	probe("startup", c.StartupProbe, "/healthz")
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if !agreedEnv[e.Name] {
			fail("env %s is not a setting of the service", e.Name)
		}
		if _, dup := env[e.Name]; dup {
			fail("env %s set twice", e.Name)
		}
		env[e.Name] = e
		if secretEnv[e.Name] && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			fail("env %s must come from a Secret (secretKeyRef)", e.Name)
		}
	}
	if len(c.EnvFrom) > 0 {
		fail("envFrom hides which settings are set; list env explicitly")
	}
	for name, want := range map[string]string{"PETSTORE_ADDR": ":8080", "PETSTORE_OPS_ADDR": ":9090"} {
		if env[name].Value != want {
			fail("env %s must be %q", name, want)
		}
	}

	// Termination: preStop sleep, then SIGTERM: drain delay, then the grace
	// for in-flight requests; all of it before the kubelet's SIGKILL.
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			fail("preStop must be the sleep action (the image has no shell)")
		} else {
			preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
	}
	drain, err1 := time.ParseDuration(env["PETSTORE_DRAIN_DELAY"].Value)
	grace, err2 := time.ParseDuration(env["PETSTORE_SHUTDOWN_GRACE"].Value)
	if err1 != nil || err2 != nil {
		fail("PETSTORE_DRAIN_DELAY and PETSTORE_SHUTDOWN_GRACE must be set as durations")
	}
	if spec.TerminationGracePeriodSeconds == nil {
		fail("terminationGracePeriodSeconds must be set")
	} else if budget := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second; preStop+drain+grace > budget {
		fail("preStop %s + drain %s + grace %s exceeds terminationGracePeriodSeconds %s", preStop, drain, grace, budget)
	}

	// Plans and keys files are read from directory mounts, so that the
	// kubelet's atomic swap of a ConfigMap or Secret reaches the pod.
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	fileMount := func(envName string, configMap bool) {
		e, ok := env[envName]
		if !ok {
			return
		}
		dir := path.Dir(e.Value)
		for _, m := range c.VolumeMounts {
			if m.MountPath != dir {
				continue
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				fail("%s: mount %s uses subPath, which never sees updates", envName, dir)
			}
			v := volumes[m.Name]
			if configMap && v.ConfigMap == nil || !configMap && v.Secret == nil {
				fail("%s: mount %s must be a %s volume", envName, dir, map[bool]string{true: "ConfigMap", false: "Secret"}[configMap])
			}
			return
		}
		fail("%s=%s: no volume mounted at %s", envName, e.Value, dir)
	}
	if _, ok := env["PETSTORE_PLANS_FILE"]; !ok {
		fail("PETSTORE_PLANS_FILE must be set")
	}
	fileMount("PETSTORE_PLANS_FILE", true)
	fileMount("PETSTORE_KEYS_FILE", false)

	keys := map[string]bool{}
	for _, t := range spec.TopologySpreadConstraints {
		keys[t.TopologyKey] = true
		sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			fail("topology spread on %s does not select the pods", t.TopologyKey)
		}
	}
	if !keys["topology.kubernetes.io/zone"] || !keys["kubernetes.io/hostname"] {
		fail("topologySpreadConstraints must spread across zones and nodes")
	}
	return errs
}

// envNames returns a container's env names, sorted.
func envNames(c corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		out = append(out, e.Name)
	}
	slices.Sort(out)
	return out
}
