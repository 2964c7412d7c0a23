package chartest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
)

// TestFinalizeJobWaitsForTheRollout runs the chart's pod with Redis
// beside a pod of an older release (its heartbeats in the census every
// release writes, and not in the one of releases that can finalize), then
// the finalize hook Job's command as rendered. The Job must wait while the
// older pod is live, leaving no mark, and finalize once it has left; the
// chart's pod then writes its records as finalized (its metric says so).
func TestFinalizeJobWaitsForTheRollout(t *testing.T) {
	addr, bin, objs, job := finalizeRig(t, map[string]any{"afterUpgrade": true, "wait": "30s"})
	pod := startPod(t, bin, objs)
	waitStatus(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", pod.ops), http.StatusOK, pod.exited)
	metric := func(name string) string {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", pod.ops))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return v
			}
		}
		return ""
	}

	// The older pod heartbeats every 500 ms until it is stopped; its first
	// heartbeat is written before the Job starts, so the Job cannot run
	// ahead of it.
	beat := func() error {
		_, err := redisDo(addr, "ZADD", "petstore:rl:{replicas}", strconv.FormatInt(time.Now().UnixMilli(), 10), "old-pod")
		return err
	}
	if err := beat(); err != nil {
		t.Fatal(err)
	}
	stopOld := make(chan struct{})
	oldGone := make(chan struct{})
	go func() {
		defer close(oldGone)
		for {
			select {
			case <-stopOld:
				if _, err := redisDo(addr, "ZREM", "petstore:rl:{replicas}", "old-pod"); err != nil {
					t.Error(err)
				}
				return
			case <-time.After(500 * time.Millisecond):
			}
			if err := beat(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stopOld:
		default:
			close(stopOld)
		}
		<-oldGone
	}()

	c := job.Spec.Template.Spec.Containers[0]
	var out, errOut lockedBuffer
	fin := exec.CommandContext(pod.ctx, bin, c.Args...)
	fin.Env = pod.resolve(c.Env)
	fin.Stdout, fin.Stderr = &out, &errOut
	if err := fin.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fin.Wait() }()

	// Beside the older pod: waiting, no mark.
	select {
	case err := <-done:
		t.Fatalf("finalize Job ended beside an older pod: %v\n%s%s", err, out.String(), errOut.String())
	case <-time.After(3 * time.Second):
	}
	if v, err := redisDo(addr, "EXISTS", "petstore:rl:{replicas}:finalized4"); err != nil || v != ":0" {
		t.Fatalf("mark beside an older pod: %q %v", v, err)
	}
	if !strings.Contains(errOut.String(), "waiting: 1 replica(s) of an older release live") {
		t.Errorf("the Job did not say what it waits for: %q", errOut.String())
	}
	if v := metric("petstore_ratelimit_older_replicas"); v != "1" {
		t.Errorf("the pod counts %q older replicas, want 1", v)
	}

	// The older pod leaves: the Job finalizes, and the pod takes it up.
	close(stopOld)
	<-oldGone
	select {
	case err := <-done:
		if err != nil || !strings.HasPrefix(out.String(), "finalized at ") {
			t.Fatalf("finalize Job once the older pod left: %v\n%s%s", err, out.String(), errOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("finalize Job still waiting after the older pod left\n%s", errOut.String())
	}
	if v, err := redisDo(addr, "EXISTS", "petstore:rl:{replicas}:finalized4"); err != nil || v != ":1" {
		t.Fatalf("no mark after the Job: %q %v", v, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric("petstore_ratelimit_records_finalized") != "1" {
		if time.Now().After(deadline) {
			t.Fatal("the pod never wrote records as finalized after the Job")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFinalizeOnInstallNeverFailsTheInstall: with the chart's defaults
// (onInstall), the finalize Job runs after a fresh install alone, and
// beside a pod of an older release sharing the Redis it gives up after
// its wait with a line saying so and exit status 0 (a failed hook would
// fail the install), leaving no mark; with no such pod it finalizes.
func TestFinalizeOnInstallNeverFailsTheInstall(t *testing.T) {
	addr, bin, objs, job := finalizeRig(t, map[string]any{"wait": "2s"})
	if hook := job.Annotations["helm.sh/hook"]; hook != "post-install" {
		t.Fatalf("the defaults must render the finalize Job as a post-install hook alone, got %q", hook)
	}
	pod := startPod(t, bin, objs)
	waitStatus(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", pod.ops), http.StatusOK, pod.exited)
	c := job.Spec.Template.Spec.Containers[0]
	runJob := func() (string, error) {
		var out, errOut lockedBuffer
		fin := exec.CommandContext(pod.ctx, bin, c.Args...)
		fin.Env = pod.resolve(c.Env)
		fin.Stdout, fin.Stderr = &out, &errOut
		err := fin.Run()
		return out.String() + errOut.String(), err
	}

	// An older release's pod shares the Redis for the whole wait.
	if _, err := redisDo(addr, "ZADD", "petstore:rl:{replicas}", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10), "old-pod"); err != nil {
		t.Fatal(err)
	}
	out, err := runJob()
	if err != nil || !strings.Contains(out, "not finalized after 2s: 1 replica(s) of an older release live") || !strings.Contains(out, "the records stay as they are") {
		t.Fatalf("the install's finalize Job beside an older pod: %v\n%s", err, out)
	}
	if v, err := redisDo(addr, "EXISTS", "petstore:rl:{replicas}:finalized4"); err != nil || v != ":0" {
		t.Fatalf("mark beside an older pod: %q %v", v, err)
	}
	if _, err := redisDo(addr, "ZREM", "petstore:rl:{replicas}", "old-pod"); err != nil {
		t.Fatal(err)
	}
	if out, err := runJob(); err != nil || !strings.HasPrefix(out, "finalized at ") {
		t.Fatalf("the install's finalize Job alone: %v\n%s", err, out)
	}
	if v, err := redisDo(addr, "EXISTS", "petstore:rl:{replicas}:finalized4"); err != nil || v != ":1" {
		t.Fatalf("no mark after the install's Job: %q %v", v, err)
	}
}

// finalizeRig starts a private redis-server and builds the service, then
// renders the chart with that Redis and the rateLimit.finalize values
// given, and returns the Redis's address, the binary, the objects and the
// finalize Job. It needs the Go toolchain and redis-server (a private one
// on a free port, stopped by its PID); -short skips its tests.
func finalizeRig(t *testing.T, finalize map[string]any) (addr, bin string, objs []object, job *batchv1.Job) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the service")
	}
	for _, tool := range []string{"go", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is needed: %v", tool, err)
			}
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	t.Parallel()
	addr = startRedis(t)
	bin = buildService(t)
	objs = mustRender(t, map[string]any{
		"redis":     map[string]any{"enabled": true, "url": "redis://" + addr},
		"rateLimit": map[string]any{"finalize": finalize},
	}, renderOptions{})
	for _, j := range only[*batchv1.Job](objs) {
		if j.Labels["app.kubernetes.io/component"] == "finalize" {
			job = j
		}
	}
	if job == nil {
		t.Fatal("no finalize Job rendered")
	}
	return addr, bin, objs, job
}

// startRedis starts a private redis-server on a free port, keeping nothing
// on disk, and stops it (by its PID) when the test ends.
func startRedis(t *testing.T) string {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v, err := redisDo(addr, "PING"); err == nil && v == "+PONG" {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisDo sends one command to the Redis at addr and returns the first
// line of its reply: all this test reads (integers and simple strings).
func redisDo(addr string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "-") {
		return "", fmt.Errorf("redis %s: %s", args[0], line)
	}
	return line, nil
}
