package fleettest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterScript runs make cluster's script as a user does: up, on a
// private redis-server and with pets in memory, two replicas behind
// HAProxy. The fleet it starts answers through HAProxy, is finalized (as
// a fresh install of the chart is: blocks in force on every replica),
// holds the tiny plan's window, and up again starts nothing and keeps the
// mark; down stops exactly the processes up started.
func TestClusterScript(t *testing.T) {
	dir := t.TempDir()
	redis := startRedis(t, dir)
	state := filepath.Join(dir, "cluster")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	// No database: pets in memory, keys in the state directory's file.
	if err := os.WriteFile(filepath.Join(state, "database-url"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	port := clusterPorts(t, 2)
	script := func(args ...string) (string, error) {
		cmd := exec.Command("bash", append([]string{"../../deploy/local/cluster.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "REPLICAS=2", "PORT="+strconv.Itoa(port), "CLUSTER_DIR="+state,
			"PETSTORE_BIN="+petstoreBin, "CLUSTER_REDIS_URL=redis://"+redis.addr()+"/0")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := script("up")
	t.Cleanup(func() { _, _ = script("down") })
	if err != nil {
		t.Fatalf("cluster.sh up: %v\n%s", err, out)
	}
	if !strings.Contains(out, "[cluster] finalized at ") {
		t.Fatalf("cluster.sh up did not finalize:\n%s", out)
	}
	var pids []int
	for _, name := range []string{"replica-1", "replica-2", "haproxy"} {
		b, err := os.ReadFile(filepath.Join(state, name+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}

	// Every replica puts blocks in force within a heartbeat.
	for i := 1; i <= 2; i++ {
		url := fmt.Sprintf("http://127.0.0.1:%d", port+1000+i)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if v, err := scrape(url, "petstore_ratelimit_blocks_in_force"); err == nil && v == 1 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("replica %d: blocks_in_force %v (%v) 5 s after up finalized", i, v, err)
			}
		}
	}

	// The tiny plan through HAProxy: 5 per 10 s, then refusals.
	b, err := os.ReadFile(filepath.Join(state, "keys-tiny.csv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		t.Fatalf("keys-tiny.csv holds no key:\n%s", b)
	}
	tiny := strings.Split(lines[1], ",")[1]
	var codes []int
	for range 8 {
		req, err := newGet(context.Background(), fmt.Sprintf("http://127.0.0.1:%d", port), tiny)
		if err != nil {
			t.Fatal(err)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		codes = append(codes, res.StatusCode)
	}
	if want := []int{200, 200, 200, 200, 200, 429, 429, 429}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("the tiny key through HAProxy answered %v, want %v", codes, want)
	}

	// Up again starts nothing and keeps the mark.
	if out, err := script("up"); err != nil || !strings.Contains(out, "already finalized") || strings.Contains(out, "starting") {
		t.Fatalf("cluster.sh up, again: %v\n%s", err, out)
	}

	if out, err := script("down"); err != nil {
		t.Fatalf("cluster.sh down: %v\n%s", err, out)
	}
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("pid %d still runs after cluster.sh down", pid)
		}
	}
	if !redis.answers() {
		t.Error("cluster.sh down stopped a Redis it had not started")
	}
}

// clusterPorts returns a base port for cluster.sh (PORT): it and the
// ports the script derives from it for n replicas (PORT+i for the API,
// PORT+1000+i for ops) are free now.
func clusterPorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(20000)
		free := true
		for i := 0; i <= n && free; i++ {
			for _, p := range []int{base + i, base + 1000 + i} {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
				if err != nil {
					free = false
					break
				}
				l.Close()
			}
		}
		if free {
			return base
		}
	}
	t.Fatal("no free range of ports for cluster.sh")
	return 0
}
