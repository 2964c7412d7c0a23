package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is make cluster's fleet, run by its own script
// (deploy/local/cluster.sh) in a state directory and on ports of the
// soak's, on the soak's private Redis and without a database (pets in
// memory, keys in the static keys file), so that it cannot meet a
// developer's make cluster or the machine's Redis and PostgreSQL.
type cluster struct {
	script   string
	state    string
	bin      string
	replicas int
	port     int
	env      []string
	log      io.Writer // the script's output
	client   *http.Client
}

func newCluster(script, state, bin string, replicas, port int, redisURL string, log io.Writer) (*cluster, error) {
	if err := os.MkdirAll(state, 0o755); err != nil {
		return nil, err
	}
	// An empty database-url: cluster.sh then keeps pets in memory and keys
	// in its keys file even when a PostgreSQL answers on this machine.
	if err := os.WriteFile(filepath.Join(state, "database-url"), nil, 0o644); err != nil {
		return nil, err
	}
	// The script and the replicas it starts read their settings from the
	// environment: none of the caller's PETSTORE_ or CLUSTER_ settings
	// reach them, only the soak's.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PETSTORE_") && !strings.HasPrefix(kv, "CLUSTER_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"REPLICAS="+strconv.Itoa(replicas), "PORT="+strconv.Itoa(port), "CLUSTER_DIR="+state,
		"CLUSTER_REDIS_URL="+redisURL, "PETSTORE_BIN="+bin,
		"BALANCE=roundrobin", "PROMETHEUS=0", "FINALIZE=1",
		// The goroutine profile, on the ops port only (ownGoroutines).
		"PETSTORE_PPROF=true")
	return &cluster{
		script: script, state: state, bin: bin, replicas: replicas, port: port, env: env, log: log,
		client: &http.Client{Timeout: 2 * time.Second},
	}, nil
}

// up runs `cluster.sh up`: it starts whatever of the fleet is not
// running, waits for each replica's /readyz and finalizes the fleet in
// Redis (nothing when it already is).
func (c *cluster) up(ctx context.Context) error {
	return c.run(ctx, "up")
}

// down runs `cluster.sh down`, which stops exactly what up started.
func (c *cluster) down() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.run(ctx, "down")
}

func (c *cluster) run(ctx context.Context, arg string) error {
	cmd := exec.CommandContext(ctx, "bash", c.script, arg)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cluster.sh %s: %w (its output is in %s/../cluster.log)", arg, err, c.state)
	}
	return nil
}

// url is HAProxy's.
func (c *cluster) url() string { return fmt.Sprintf("http://127.0.0.1:%d", c.port) }

// The ports cluster.sh gives replica i (from 1).
func (c *cluster) apiURL(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", c.port+i) }
func (c *cluster) opsURL(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", c.port+1000+i) }

// targets returns where the sampler reads each replica.
func (c *cluster) targets() []replicaTarget {
	var out []replicaTarget
	for i := 1; i <= c.replicas; i++ {
		pid, _ := c.pid(fmt.Sprintf("replica-%d", i)) // 0 while it is not running
		out = append(out, replicaTarget{opsURL: c.opsURL(i), pid: pid, api: c.port + i, ops: c.port + 1000 + i})
	}
	return out
}

// pid returns the process of name's PID file (replica-1, haproxy),
// checking, as cluster.sh does, that it is still the one the script
// started: its command line names the state directory.
func (c *cluster) pid(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(c.state, name+".pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s.pid: %w", name, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(c.state)) {
		return 0, fmt.Errorf("%s (pid %d) is not running", name, pid)
	}
	return pid, nil
}

// stopReplica sends replica i SIGTERM, as Kubernetes stops a pod in a
// rolling update, and waits for it to exit: it turns unready, HAProxy
// takes it out of rotation, it drains and ends.
func (c *cluster) stopReplica(ctx context.Context, i int) error {
	name := fmt.Sprintf("replica-%d", i)
	pid, err := c.pid(name)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM to %s (pid %d): %w", name, pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !exited(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) still runs 30 s after SIGTERM", name, pid)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// exited reports whether process pid has ended: it is gone, or a zombie
// (the script's processes are orphans, and the init of some containers
// reaps orphans only now and then).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	rest := b[bytes.LastIndexByte(b, ')')+1:]
	f := bytes.Fields(rest)
	return len(f) > 0 && (f[0][0] == 'Z' || f[0][0] == 'X')
}

// inRotation returns the replicas HAProxy has up, from its stats socket.
func (c *cluster) inRotation() ([]string, error) {
	conn, err := net.DialTimeout("unix", filepath.Join(c.state, "haproxy.sock"), time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(conn, "show stat\n"); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return nil, err
	}
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("# "))))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("haproxy stats: %v: %.200q", err, b)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	var up []string
	for _, row := range rows[1:] {
		if len(row) > col["status"] && row[col["pxname"]] == "replicas" && row[col["svname"]] != "BACKEND" &&
			strings.HasPrefix(row[col["status"]], "UP") {
			up = append(up, row[col["svname"]])
		}
	}
	return up, nil
}

// health returns what keeps the fleet from being as it was before a
// fault: Redis not answering, a replica out of HAProxy's rotation or
// unready, one still limiting on its own, one without blocks in force;
// nil when nothing does.
func (c *cluster) health(ctx context.Context, redisAddr string) error {
	if reply, err := redisDo(redisAddr, "PING"); err != nil || reply != "PONG" {
		return fmt.Errorf("redis: %q %v", reply, err)
	}
	up, err := c.inRotation()
	if err != nil {
		return fmt.Errorf("haproxy: %w", err)
	}
	if len(up) != c.replicas {
		return fmt.Errorf("haproxy has %v in rotation, want %d replicas", up, c.replicas)
	}
	for i := 1; i <= c.replicas; i++ {
		m, err := scrape(ctx, c.client, c.opsURL(i))
		if err != nil {
			return fmt.Errorf("r%d: %w", i, err)
		}
		// Shared limiting again (no replica left deciding alone because
		// Redis failed), and blocks in force: the fleet as it was before.
		if v := m["petstore_ratelimit_fallback_active"]; v != 0 {
			return fmt.Errorf("r%d: still limiting on its own (petstore_ratelimit_fallback_active %v)", i, v)
		}
		if v := m["petstore_ratelimit_blocks_in_force"]; v != 1 {
			return fmt.Errorf("r%d: petstore_ratelimit_blocks_in_force %v, want 1", i, v)
		}
		resp, err := c.client.Get(c.opsURL(i) + "/readyz")
		if err != nil {
			return fmt.Errorf("r%d: %w", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("r%d: /readyz %s", i, resp.Status)
		}
	}
	return nil
}

// waitHealthy waits until health finds nothing wanting.
func (c *cluster) waitHealthy(ctx context.Context, redisAddr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.health(ctx, redisAddr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the fleet is not ready %s after the fault: %w", timeout, err)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// keyMix is the share of the soak's keys (in percent) on each built-in
// plan. The enterprise plan has no quotas of its own: its keys get
// theirs, as a contract would set them.
var keyMix = []struct {
	plan   string
	share  int
	quotas []string
}{
	{"free", 40, nil},
	{"pro", 30, nil},
	{"business", 20, nil},
	{"enterprise", 5, []string{"6000/1m", "1000000/24h"}},
	{"loadtest", 5, nil},
}

// mixCounts splits n keys by keyMix's shares, the first plan taking
// what rounding leaves.
func mixCounts(n int) []int {
	out := make([]int, len(keyMix))
	out[0] = n
	for i := 1; i < len(keyMix); i++ {
		out[i] = n * keyMix[i].share / 100
		out[0] -= out[i]
	}
	return out
}

// addKeys issues n keys on keyMix's plans with `petstore keys create`
// (no database: it only generates them), adds them to the fleet's
// static keys file beside the script's own, and waits until every
// replica accepts a key of every plan (they reload the file every 2 s).
// It returns the keys shuffled, so that no plan's keys sit together in
// the list, and how many each plan got.
func (c *cluster) addKeys(ctx context.Context, n int) ([]string, map[string]int, error) {
	path := filepath.Join(c.state, "keys.yaml")
	file, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var keys []string
	counts := map[string]int{}
	var probes []string // one key of each plan
	mix := mixCounts(n)
	for i, m := range keyMix {
		count := mix[i]
		args := []string{"keys", "create", "--plan", m.plan, "--count", strconv.Itoa(count), "--format", "yaml", "--label", "soak"}
		for _, q := range m.quotas {
			args = append(args, "--quota", q)
		}
		cmd := exec.CommandContext(ctx, c.bin, args...)
		cmd.Env = c.env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, nil, fmt.Errorf("petstore %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		entries, got := keyEntries(out)
		if len(got) != count {
			return nil, nil, fmt.Errorf("petstore keys create --plan %s printed %d keys, want %d", m.plan, len(got), count)
		}
		file = append(file, entries...)
		keys = append(keys, got...)
		counts[m.plan] = count
		probes = append(probes, got[0])
	}
	tmp := path + ".soak"
	if err := os.WriteFile(tmp, file, 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; i <= c.replicas; i++ {
		for _, k := range probes {
			for {
				status, err := c.get(ctx, c.apiURL(i)+"/v1/pets?limit=1", k)
				if err == nil && status == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					return nil, nil, fmt.Errorf("r%d still refuses a soak key 30 s after the keys file changed: %d %v", i, status, err)
				}
				if err := sleep(ctx, 200*time.Millisecond); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys, counts, nil
}

// keyEntries splits `keys create --format yaml` output into the entries
// to append to a keys file (without its `keys:` line) and the keys.
func keyEntries(out []byte) ([]byte, []string) {
	var entries bytes.Buffer
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line == "keys:" {
			continue
		}
		if k, ok := strings.CutPrefix(strings.TrimSpace(line), "- key: "); ok {
			keys = append(keys, k)
		}
		entries.WriteString(line + "\n")
	}
	return entries.Bytes(), keys
}

func (c *cluster) get(ctx context.Context, url, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// pickPort returns a base port for cluster.sh (PORT) whose derived ports
// are free now: HAProxy's, each replica's API (PORT+i) and ops
// (PORT+1000+i) port, and redisPort's. They lie below the kernel's
// ephemeral range, from which outgoing connections take their ports.
func pickPort(replicas int) (int, error) {
	hi := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if lo, err := strconv.Atoi(f[0]); err == nil {
				hi = lo
			}
		}
	}
	hi -= 1100
	if hi <= 20000 {
		return 0, fmt.Errorf("no room below the ephemeral ports (%d) for the fleet's ports: pass -port", hi+1100)
	}
	for range 100 {
		base := 20000 + rand.IntN(hi-20000)
		ports := []int{base, redisPort(base)}
		for i := 1; i <= replicas; i++ {
			ports = append(ports, base+i, base+1000+i)
		}
		if !slices.ContainsFunc(ports, taken) {
			return base, nil
		}
	}
	return 0, errors.New("no free range of ports for the fleet: pass -port")
}

// redisPort is where the soak runs its Redis for a fleet on base: not
// PORT+1079, where cluster.sh would start a Redis of its own when given
// that address (and PORT+1090 is Prometheus's).
func redisPort(base int) int { return base + 1100 }

func taken(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return true
	}
	l.Close()
	return false
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
