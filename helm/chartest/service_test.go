package chartest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestChartConfigRunsService closes the loop between the chart and the
// binary: it builds cmd/petstore, starts it with exactly the environment,
// plans file and keys file the chart renders (in-memory store, no Redis),
// runs the chart's two `helm test` pods' commands against it, then sends
// SIGTERM and checks the drain the termination budget is sized for.
// It needs the Go toolchain, sh and curl; -short skips it.
func TestChartConfigRunsService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service")
	}
	for _, tool := range []string{"go", "sh", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is needed: %v", tool, err)
			}
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	t.Parallel()
	bin := buildService(t)

	const staticKey = "pst_acme0static0key0for0ci0values0011POUDs"
	vals := map[string]any{
		"lifecycle": map[string]any{"drainDelaySeconds": 1, "shutdownGraceSeconds": 5},
		"config":    map[string]any{"logFormat": "text"},
		"apiKeys": map[string]any{"entries": []any{map[string]any{"key": staticKey, "plan": "pro", "label": "acme",
			"candidate": map[string]any{"quotas": []any{map[string]any{"limit": 100, "period": "1m"}}}}}},
		// What SREs tuning plans set through the values: a candidate with
		// its ban policy, and a plan in shadow mode.
		"plans": map[string]any{
			"pro": map[string]any{"candidate": map[string]any{"quotas": []any{map[string]any{"limit": 200, "period": "1m"}},
				"ban": map[string]any{"threshold": 30, "within": "1m", "duration": "5m"}}},
			"trial": map[string]any{"mode": "shadow", "quotas": []any{map[string]any{"limit": 20, "period": "1m"}}},
		},
		"tests": map[string]any{"rateLimit": map[string]any{"apiKey": "pst_ci0helm0test0key0rate0limit000012RjBW3"}},
	}
	objs := mustRender(t, vals, renderOptions{})
	svc := startPod(t, bin, objs)
	d, spec := svc.deployment, svc.deployment.Spec.Template.Spec
	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", svc.ops)
	waitStatus(t, readyz, http.StatusOK, svc.exited)

	// The chart's helm test pods, run here as they run in the cluster.
	for _, p := range only[*corev1.Pod](objs) {
		pc := p.Spec.Containers[0]
		argv := append(append([]string{}, pc.Command...), pc.Args...)
		for i := range argv {
			argv[i] = strings.NewReplacer(
				fmt.Sprintf("%s.%s.svc:9090", d.Name, namespace), fmt.Sprintf("127.0.0.1:%d", svc.ops),
				fmt.Sprintf("%s.%s.svc:8080", d.Name, namespace), fmt.Sprintf("127.0.0.1:%d", svc.api),
				"/tmp/", svc.dir+"/",
			).Replace(argv[i])
		}
		// The test key comes from the test's own hook Secret.
		cmd := exec.CommandContext(svc.ctx, argv[0], argv[1:]...)
		cmd.Env = svc.resolve(pc.Env)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("helm test pod %s failed: %v\n%s", p.Name, err, out)
		} else {
			t.Logf("helm test pod %s:\n%s", p.Name, out)
		}
	}

	// Draining: readiness turns false at once while requests are still
	// served, and the process ends within the termination budget.
	if err := svc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, readyz, http.StatusServiceUnavailable, svc.exited)
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/pets", svc.api), nil)
	req.Header.Set("Authorization", "Bearer "+staticKey)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("request while draining: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request while draining: %s", resp.Status)
		}
	}
	budget := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	select {
	case err := <-svc.exited:
		if err != nil {
			t.Errorf("service exited with %v after SIGTERM", err)
		}
	case <-time.After(budget):
		t.Errorf("service still running %s after SIGTERM: the kubelet would kill it", budget)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitStatus polls url until it answers want, the process exits, or a
// generous deadline passes.
func waitStatus(t *testing.T, url string, want int, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("service exited while waiting for %s to answer %d: %v", url, want, err)
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not answer %d", url, want)
}

// serviceBuild is the petstore binary built once for every test that runs
// it; TestMain removes it.
var serviceBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if serviceBuild.dir != "" {
		os.RemoveAll(serviceBuild.dir)
	}
	os.Exit(code)
}

// buildService builds cmd/petstore (once) and returns the binary's path.
func buildService(t *testing.T) string {
	t.Helper()
	serviceBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "chartest-petstore-")
		if err != nil {
			serviceBuild.err = err
			return
		}
		serviceBuild.dir = dir
		bin := filepath.Join(dir, "petstore")
		gobuild := exec.Command("go", "build", "-o", bin, "./cmd/petstore")
		gobuild.Dir = "../.."
		if out, err := gobuild.CombinedOutput(); err != nil {
			serviceBuild.err = fmt.Errorf("go build ./cmd/petstore: %v\n%s", err, out)
			return
		}
		serviceBuild.path = bin
	})
	if serviceBuild.err != nil {
		t.Fatal(serviceBuild.err)
	}
	return serviceBuild.path
}

// pod is the service started as the rendered Deployment's container.
type pod struct {
	deployment *appsv1.Deployment
	container  corev1.Container
	dir        string // the pod's files: mounts and HOME
	api, ops   int    // free local ports standing for 8080 and 9090
	ctx        context.Context
	cmd        *exec.Cmd
	exited     chan error
	logs       *lockedBuffer
	// resolve turns a container's env into the local process environment:
	// Secret references resolved, mount paths and ports mapped.
	resolve func([]corev1.EnvVar) []string
}

// lockedBuffer collects a process's output while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPod starts bin with exactly the args, environment and mounted files
// the rendered Deployment gives its container, on free loopback ports. The
// process is killed when the test ends.
func startPod(t *testing.T, bin string, objs []object) *pod {
	t.Helper()
	dir := t.TempDir()
	// Lay out the mounted files as the kubelet would.
	mounts := map[string]string{} // mount path -> local dir
	secrets := map[string]*corev1.Secret{}
	for _, s := range only[*corev1.Secret](objs) {
		secrets[s.Name] = s
	}
	configMaps := map[string]*corev1.ConfigMap{}
	for _, cm := range only[*corev1.ConfigMap](objs) {
		configMaps[cm.Name] = cm
	}
	d := one[*appsv1.Deployment](t, objs)
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	for _, m := range c.VolumeMounts {
		local := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts[m.MountPath] = local
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			files := map[string][]byte{}
			switch {
			case v.ConfigMap != nil:
				for k, s := range configMaps[v.ConfigMap.Name].Data {
					files[k] = []byte(s)
				}
			case v.Secret != nil:
				files = secrets[v.Secret.SecretName].Data
			}
			for name, data := range files {
				if err := os.WriteFile(filepath.Join(local, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The pod's environment: literal values, Secret references resolved,
	// mount paths mapped to the local directories, ports made free.
	api, ops := freePort(t), freePort(t)
	resolve := func(env []corev1.EnvVar) []string {
		out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
		for _, e := range env {
			v := e.Value
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
				v = string(secrets[ref.SecretKeyRef.Name].Data[ref.SecretKeyRef.Key])
			}
			best := ""
			for mount := range mounts {
				if (v == mount || strings.HasPrefix(v, mount+"/")) && len(mount) > len(best) {
					best = mount
				}
			}
			if best != "" {
				v = mounts[best] + strings.TrimPrefix(v, best)
			}
			v = strings.NewReplacer(":8080", fmt.Sprintf(":%d", api), ":9090", fmt.Sprintf(":%d", ops)).Replace(v)
			v = strings.ReplaceAll(v, fmt.Sprintf("%s.%s.svc", d.Name, namespace), "127.0.0.1")
			out = append(out, e.Name+"="+v)
		}
		return out
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	logs := &lockedBuffer{}
	serve := exec.CommandContext(ctx, bin, c.Args...)
	serve.Env = resolve(c.Env)
	serve.Stdout, serve.Stderr = logs, logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		if t.Failed() {
			t.Logf("service log:\n%s", logs.String())
		}
	})
	return &pod{deployment: d, container: c, dir: dir, api: api, ops: ops, ctx: ctx,
		cmd: serve, exited: exited, logs: logs, resolve: resolve}
}
