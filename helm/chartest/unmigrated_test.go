package chartest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq" // PostgreSQL driver for database/sql: only to make and drop the test's schema
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestUnmigratedPodStaysOutOfService runs the chart's pod, with pets in
// PostgreSQL, against a database no migration has touched (the migrate Job
// failed, was skipped, or ran against another database). Its readiness
// probe, called exactly as rendered, answers 503 saying to run `petstore
// migrate`, so the kubelet reports the pod not ready and the Service, which
// does not publish not-ready addresses, keeps it out of its endpoints; with
// maxUnavailable 0 a rollout stops there and the old pods keep serving.
// Running the migrate Job's command as rendered then brings the pod in by
// itself, without a restart.
//
// It needs the Go toolchain and PostgreSQL (PETSTORE_TEST_DATABASE_URL; the
// test works in a schema of its own); -short skips it.
func TestUnmigratedPodStaysOutOfService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service")
	}
	dbURL := os.Getenv("PETSTORE_TEST_DATABASE_URL")
	if dbURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PETSTORE_TEST_DATABASE_URL is not set: CI must provide PostgreSQL")
		}
		t.Skip("PETSTORE_TEST_DATABASE_URL not set; set it to run this test")
	}
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is needed: %v", err)
		}
		t.Skipf("go not found: %v", err)
	}
	t.Parallel()
	schemaURL := newSchema(t, dbURL)
	bin := buildService(t)

	objs := mustRender(t, map[string]any{
		"store":    "postgres",
		"postgres": map[string]any{"url": schemaURL},
	}, renderOptions{})
	d := one[*appsv1.Deployment](t, objs)
	if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rollout strategy %+v: an unready new pod must not let an old one go (maxUnavailable 0)", d.Spec.Strategy)
	}
	for _, svc := range only[*corev1.Service](objs) {
		if svc.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s publishes not-ready addresses: an unmigrated pod would get traffic", svc.Name)
		}
		matches := len(svc.Spec.Selector) > 0
		for k, v := range svc.Spec.Selector {
			matches = matches && d.Spec.Template.Labels[k] == v
		}
		if !matches {
			t.Errorf("Service %s does not select the Deployment's pods", svc.Name)
		}
	}

	pod := startPod(t, bin, objs)
	probe := pod.container.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		t.Fatal("no httpGet readiness probe")
	}
	port := probe.HTTPGet.Port
	if port.Type == intstr.String {
		for _, p := range pod.container.Ports {
			if p.Name == port.StrVal {
				port = intstr.FromInt32(p.ContainerPort)
			}
		}
	}
	if port.IntValue() != 9090 {
		t.Fatalf("readiness probe on port %s, want the ops port", probe.HTTPGet.Port.String())
	}
	readyURL := fmt.Sprintf("http://127.0.0.1:%d%s", pod.ops, probe.HTTPGet.Path)

	// Unready for good, not for a moment: one 200 would put the pod in the
	// endpoints, so it must answer 503 through several of the service's
	// readiness rounds (every 2 s).
	waitStatus(t, readyURL, http.StatusServiceUnavailable, pod.exited)
	stayUntil := time.Now().Add(6 * time.Second)
	for time.Now().Before(stayUntil) {
		code, body := get(t, readyURL)
		if code != http.StatusServiceUnavailable || !strings.Contains(body["message"], "run `petstore migrate`") {
			t.Fatalf("readiness probe on an unmigrated database: %d %v", code, body)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// The migrate Job's container, as rendered, against the same database.
	jc := one[*batchv1.Job](t, objs).Spec.Template.Spec.Containers[0]
	migrate := exec.CommandContext(pod.ctx, bin, jc.Args...)
	migrate.Env = pod.resolve(jc.Env)
	if out, err := migrate.CombinedOutput(); err != nil || !strings.Contains(string(out), "applied 0001_") {
		t.Fatalf("migrate Job: %v\n%s", err, out)
	}
	start := time.Now()
	waitStatus(t, readyURL, http.StatusOK, pod.exited)
	t.Logf("pod ready %v after the migrate Job finished, without a restart", time.Since(start).Round(time.Millisecond))
}

// newSchema makes a schema of its own in the database at base, dropped when
// the test ends, and returns base with that schema as its search_path.
func newSchema(t *testing.T, base string) string {
	t.Helper()
	db, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "chartest_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "search_path=" + schema
}

func get(t *testing.T, url string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]string
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("%s: %q: %v", url, b, err)
	}
	return resp.StatusCode, body
}
