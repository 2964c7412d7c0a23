package fleettest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// petstoreBin is the binary every replica runs, built once by TestMain
// without the race detector: replicas are the system under test, not the
// test's own code.
var petstoreBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	var missing []string
	for _, tool := range []string{"redis-server", "haproxy"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("fleettest: %s not found on PATH; run .ci/services (or install Debian's redis-server and haproxy) to run the fleet system tests", strings.Join(missing, " and "))
		if testenv.InCI() {
			fmt.Fprintln(os.Stderr, msg+" (CI must provide them)")
			return 1
		}
		fmt.Fprintln(os.Stderr, msg+"; skipping")
		return 0
	}
	dir, err := os.MkdirTemp("", "petstore-fleettest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	petstoreBin = filepath.Join(dir, "petstore")
	if err := goBuild(petstoreBin, "../..", "./cmd/petstore"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// goBuild builds pkg in module directory dir into out.
func goBuild(out, dir, pkg string) error {
	// go test puts the go command that runs it first in PATH.
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// proc is one child process the test owns.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc starts bin with args, its output going to a log file in dir.
// The process is killed when the test ends if it is still running.
func startProc(t testing.TB, dir, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	testenv.EndWithTest(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.running() {
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s (pid %d): %v", sig, p.name, p.cmd.Process.Pid, err)
	}
}

// wait waits for the process to exit and returns its error.
func (p *proc) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		t.Fatalf("%s (pid %d) did not exit within %s", p.name, p.cmd.Process.Pid, d)
		return nil
	}
}

func (p *proc) logs() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// redisServer is a private redis-server: the one process a test may pause
// and kill.
type redisServer struct {
	t    testing.TB
	dir  string
	port int
	p    *proc
	gen  int
}

func startRedis(t testing.TB, dir string) *redisServer {
	t.Helper()
	r := &redisServer{t: t, dir: dir, port: testenv.FreePort(t)}
	r.start()
	return r
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *redisServer) start() {
	r.t.Helper()
	r.gen++
	r.p = startProc(r.t, r.dir, fmt.Sprintf("redis-%d", r.gen), "redis-server",
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir)
	deadline := time.Now().Add(10 * time.Second)
	for !r.answers() {
		if time.Now().After(deadline) || !r.p.running() {
			r.t.Fatalf("redis-server did not start on %s:\n%s", r.addr(), r.p.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answers reports whether Redis answers PING within 100 ms.
func (r *redisServer) answers() bool {
	c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// pause stops Redis for d and returns when it was continued.
func (r *redisServer) pause(d time.Duration) time.Time {
	r.t.Helper()
	r.p.signal(r.t, syscall.SIGSTOP)
	time.Sleep(d)
	r.p.signal(r.t, syscall.SIGCONT)
	return time.Now()
}

// fill sets Redis's maxmemory to half of what it uses, under noeviction, so
// that it refuses every write (OOM) for d, as a Redis full of records does
// while it still answers PING; then it lifts the limit and returns when.
func (r *redisServer) fill(d time.Duration) time.Time {
	r.t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.addr()})
	defer c.Close()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	var used int64
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used == 0 {
		r.t.Fatalf("INFO memory without used_memory:\n%s", info)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", strconv.FormatInt(used/2, 10)}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			r.t.Fatal(err)
		}
	}
	time.Sleep(d)
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		r.t.Fatal(err)
	}
	return time.Now()
}

// crash kills Redis, keeps it down for d, starts a fresh one on the same
// port (its data gone, as after a crash without persistence) and returns
// when it answered again.
func (r *redisServer) crash(d time.Duration) time.Time {
	r.t.Helper()
	r.p.signal(r.t, syscall.SIGKILL)
	r.p.wait(r.t, 5*time.Second)
	time.Sleep(d)
	r.start()
	return time.Now()
}

// apiKey is one API key of the fleet's static keys file.
type apiKey struct {
	ID, Key, Plan string
}

// fleetOptions describes a fleet.
type fleetOptions struct {
	replicas       int
	plans          string         // the plans file's YAML
	keys           map[string]int // plan -> how many keys
	redisTimeout   time.Duration  // --redis-timeout (default 1s; see newFleet)
	failureMode    string         // --ratelimit-failure-mode (default open)
	reloadInterval time.Duration  // --reload-interval (default 1s)
	drainDelay     time.Duration  // --drain-delay (default 1s)
	accessLog      bool           // log every request (for server-side durations)
	perReplicaPlan bool           // each replica reads its own copy of the plans file
	binaries       map[int]string // replica index -> a petstore binary other than this tree's
	maxLease       int            // --ratelimit-max-lease (0: the default)
	balance        string         // HAProxy's balancing lines (default balanceRoundRobin; make cluster BALANCE=...)
	draftFields    bool           // --ratelimit-draft-fields: RateLimit-Policy shows the plan a replica applies (fleet.policy)
	finalizeAfter  string         // --ratelimit-finalize-after for this tree's replicas ("": the default, 1m; "0": never by itself)
}

// fleet is N replicas of one build sharing a private Redis, behind
// HAProxy checking each replica's /readyz.
type fleet struct {
	t        testing.TB
	dir      string
	opts     fleetOptions
	redis    *redisServer
	replicas []*replica
	lb       *haproxy
	keys     map[string][]apiKey // by plan
	client   *http.Client
}

type replica struct {
	name         string
	bin          string // the petstore binary it runs
	apiPort, ops int
	plansFile    string
	p            *proc
	restarts     int
	fleet        *fleet
	api, opsURL  string
}

// HAProxy health checks: a replica leaves rotation after one failed check
// and returns after one good one; with checks every 300 ms, a draining
// replica (1 s drain delay) is out of rotation well before it stops
// listening.
const checkInterval = 300 * time.Millisecond

func newFleet(t testing.TB, o fleetOptions) *fleet {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 3
	}
	if o.redisTimeout == 0 {
		// Only the Redis fault tests use the production default (50 ms):
		// on a loaded 2-core machine a Redis round trip sometimes takes
		// longer, and each replica then leaves shared limiting for its
		// local share of every limit, which the other scenarios are not
		// about (the fault tests are).
		o.redisTimeout = time.Second
	}
	if o.failureMode == "" {
		o.failureMode = "open"
	}
	if o.reloadInterval == 0 {
		o.reloadInterval = time.Second
	}
	if o.drainDelay == 0 {
		o.drainDelay = time.Second
	}
	dir := t.TempDir()
	f := &fleet{t: t, dir: dir, opts: o, keys: map[string][]apiKey{}}
	f.client = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        512,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
	}
	t.Cleanup(f.client.CloseIdleConnections)
	f.redis = startRedis(t, dir)
	if o.plans == "" {
		// An empty plans file is refused: this one keeps the built-in plans.
		o.plans = "plans: {}\n"
	}
	f.writeFile("plans.yaml", o.plans)
	f.writeKeys()
	for i := range o.replicas {
		r := &replica{name: fmt.Sprintf("r%d", i+1), bin: petstoreBin, apiPort: testenv.FreePort(t), ops: testenv.FreePort(t), fleet: f, plansFile: filepath.Join(dir, "plans.yaml")}
		if b := o.binaries[i]; b != "" {
			r.bin = b
		}
		if o.perReplicaPlan {
			r.plansFile = filepath.Join(dir, fmt.Sprintf("plans-%s.yaml", r.name))
			f.writeFile(filepath.Base(r.plansFile), o.plans)
		}
		r.api = fmt.Sprintf("http://127.0.0.1:%d", r.apiPort)
		r.opsURL = fmt.Sprintf("http://127.0.0.1:%d", r.ops)
		f.replicas = append(f.replicas, r)
	}
	for _, r := range f.replicas {
		r.start()
	}
	f.lb = startHAProxy(t, dir, f.replicas, cmp.Or(o.balance, balanceRoundRobin))
	return f
}

func (f *fleet) writeFile(name, content string) string {
	f.t.Helper()
	path := filepath.Join(f.dir, name)
	// Write and rename, as a deploy tool or a ConfigMap would, so a replica
	// never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// writeKeys generates the fleet's keys with `petstore keys create --count
// --format csv` (no database: a pure generator), keeps each plan's CSV as
// keys-PLAN.csv and lists them all in a static keys file.
func (f *fleet) writeKeys() {
	f.t.Helper()
	var file strings.Builder
	file.WriteString("keys:\n")
	for planName, n := range f.opts.keys {
		out := f.petstore("keys", "create", "--plan", planName, "--count", strconv.Itoa(n), "--format", "csv", "--label", "fleettest")
		rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
		if err != nil || len(rows) != n+1 {
			f.t.Fatalf("keys create printed %d rows (%v):\n%s", len(rows), err, out)
		}
		f.writeFile("keys-"+planName+".csv", out)
		for _, row := range rows[1:] {
			f.keys[planName] = append(f.keys[planName], apiKey{ID: row[0], Key: row[1], Plan: row[2]})
			fmt.Fprintf(&file, "  - {key: %s, plan: %s}\n", row[1], row[2])
		}
	}
	f.writeFile("keys.yaml", file.String())
}

// petstore runs a petstore command against the fleet's files and Redis and
// returns its standard output.
func (f *fleet) petstore(args ...string) string {
	f.t.Helper()
	out, errOut, err := f.tryPetstore(args...)
	if err != nil {
		f.t.Fatalf("petstore %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// tryPetstore runs this tree's petstore command as petstore does, and
// returns its output, its errors' and how it ended.
func (f *fleet) tryPetstore(args ...string) (string, string, error) {
	f.t.Helper()
	cmd := exec.Command(petstoreBin, args...)
	cmd.Env = append(os.Environ(),
		"PETSTORE_PLANS_FILE="+filepath.Join(f.dir, "plans.yaml"),
		"PETSTORE_REDIS_ADDRS="+f.redis.addr(),
	)
	if _, err := os.Stat(filepath.Join(f.dir, "keys.yaml")); err == nil {
		cmd.Env = append(cmd.Env, "PETSTORE_KEYS_FILE="+filepath.Join(f.dir, "keys.yaml"))
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func (r *replica) start() {
	f := r.fleet
	f.t.Helper()
	r.restarts++
	level := "warn"
	if f.opts.accessLog {
		level = "info"
	}
	args := []string{"serve",
		"--addr", fmt.Sprintf("127.0.0.1:%d", r.apiPort),
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", r.ops),
		"--redis-addrs", f.redis.addr(),
		"--redis-timeout", f.opts.redisTimeout.String(),
		"--ratelimit-failure-mode", f.opts.failureMode,
		"--ratelimit-replicas", strconv.Itoa(f.opts.replicas),
		"--plans-file", r.plansFile,
		"--keys-file", filepath.Join(f.dir, "keys.yaml"),
		"--reload-interval", f.opts.reloadInterval.String(),
		"--drain-delay", f.opts.drainDelay.String(),
		"--shutdown-grace", "10s",
		"--trusted-proxies", "127.0.0.1",
		"--log-level", level,
	}
	if f.opts.maxLease > 0 {
		args = append(args, "--ratelimit-max-lease", strconv.Itoa(f.opts.maxLease))
	}
	if f.opts.draftFields {
		args = append(args, "--ratelimit-draft-fields")
	}
	if f.opts.finalizeAfter != "" && r.bin == petstoreBin {
		args = append(args, "--ratelimit-finalize-after", f.opts.finalizeAfter)
	}
	r.p = startProc(f.t, f.dir, fmt.Sprintf("%s-%d", r.name, r.restarts), r.bin, args...)
	deadline := time.Now().Add(20 * time.Second)
	for !r.ready() {
		if time.Now().After(deadline) || !r.p.running() {
			f.t.Fatalf("replica %s did not become ready:\n%s", r.name, r.p.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *replica) ready() bool {
	resp, err := http.Get(r.opsURL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop sends SIGTERM and waits for a clean exit.
func (r *replica) stop() {
	t := r.fleet.t
	t.Helper()
	r.p.signal(t, syscall.SIGTERM)
	if err := r.p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("replica %s exited with %v after SIGTERM:\n%s", r.name, err, r.p.logs())
	}
}

// metric reads one sample of an unlabelled metric from the replica's
// /metrics.
func (r *replica) metric(name string) (float64, error) {
	v, err := scrape(r.opsURL, name)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", r.name, err)
	}
	return v, nil
}

// scrape reads one sample (name with its labels, as exposed) from the
// /metrics of the ops listener at opsURL.
func scrape(opsURL, name string) (float64, error) {
	resp, err := http.Get(opsURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("%w: %s", errNoSample, name)
}

// errNoSample: /metrics has no such series (a counter never incremented).
var errNoSample = errors.New("no such sample in /metrics")

// localAdmissions sums, over the replicas, the requests on plan that were
// admitted without Redis (petstore_ratelimit_local_decisions_total).
func (f *fleet) localAdmissions(t *testing.T, plan string) float64 {
	t.Helper()
	var sum float64
	for _, r := range f.replicas {
		v, err := r.metric(`petstore_ratelimit_local_decisions_total{outcome="allowed",plan="` + plan + `"}`)
		if err != nil && !errors.Is(err, errNoSample) {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// leasedAdmissions sums, over the replicas, the requests on plan that
// were admitted from a lease, without a round trip
// (petstore_ratelimit_leased_total).
func (f *fleet) leasedAdmissions(t *testing.T, plan string) float64 {
	t.Helper()
	var sum float64
	for _, r := range f.replicas {
		v, err := r.metric(`petstore_ratelimit_leased_total{plan="` + plan + `"}`)
		if err != nil && !errors.Is(err, errNoSample) {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// served is one access log line: when a replica finished a request and
// how long it held it.
type served struct {
	replica string
	end     time.Time
	held    time.Duration
	keyID   string
	status  int
}

// accessLog returns every request the replicas' access logs recorded, in
// all their runs.
func (f *fleet) accessLog() []served {
	f.t.Helper()
	var out []served
	matches, _ := filepath.Glob(filepath.Join(f.dir, "r[0-9]*-*.log"))
	for _, path := range matches {
		b, err := os.ReadFile(path)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if !bytes.Contains(line, []byte(`"msg":"request"`)) {
				continue
			}
			var rec struct {
				Time       time.Time `json:"time"`
				DurationMS float64   `json:"duration_ms"`
				KeyID      string    `json:"key_id"`
				Status     int       `json:"status"`
			}
			if err := json.Unmarshal(line, &rec); err != nil {
				f.t.Fatalf("%s: access log line %q: %v", path, line, err)
			}
			out = append(out, served{
				replica: strings.TrimSuffix(filepath.Base(path), ".log"),
				end:     rec.Time,
				held:    time.Duration(rec.DurationMS * float64(time.Millisecond)),
				keyID:   rec.KeyID,
				status:  rec.Status,
			})
		}
	}
	return out
}

// fallbacks returns the log lines in which a replica left shared limiting
// because a Redis call failed or timed out, in all its runs.
func (f *fleet) fallbacks() []string {
	f.t.Helper()
	var out []string
	matches, _ := filepath.Glob(filepath.Join(f.dir, "r[0-9]*-*.log"))
	for _, path := range matches {
		b, err := os.ReadFile(path)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "ratelimit: redis unreachable") {
				out = append(out, filepath.Base(path)+": "+line)
			}
		}
	}
	return out
}

// haproxy is the load balancer in front of the replicas.
type haproxy struct {
	url    string
	socket string
	p      *proc
}

func startHAProxy(t testing.TB, dir string, replicas []*replica, balance string) *haproxy {
	t.Helper()
	port := testenv.FreePort(t)
	h := &haproxy{url: fmt.Sprintf("http://127.0.0.1:%d", port), socket: filepath.Join(dir, "haproxy.sock")}
	var servers strings.Builder
	for _, r := range replicas {
		fmt.Fprintf(&servers, "  server %s 127.0.0.1:%d check port %d\n", r.name, r.apiPort, r.ops)
	}
	cfg := fmt.Sprintf(haproxyConfig, h.socket, port, balance, checkInterval.Milliseconds(), servers.String())
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.p = startProc(t, dir, "haproxy", "haproxy", "-db", "-f", path)
	deadline := time.Now().Add(10 * time.Second)
	for {
		up, err := h.serversUp()
		if err == nil && len(up) == len(replicas) {
			return h
		}
		if time.Now().After(deadline) || !h.p.running() {
			t.Fatalf("haproxy: servers up %v (%v):\n%s", up, err, h.p.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// haproxyConfig is the load balancer of the fleet, the same as
// deploy/local's: round robin (or by key), /readyz checked on each replica's ops port,
// and a failed connection or an empty answer (a replica that died with the
// request) retried once on another replica for idempotent requests.
const haproxyConfig = `global
  maxconn 4096
  stats socket %s mode 600 level admin

defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response

frontend api
  bind 127.0.0.1:%d
  default_backend replicas

backend replicas
%s
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter %dms fall 1 rise 1
%s`

// The balancing of deploy/local's BALANCE=roundrobin, BALANCE=key and
// BALANCE=key-bounded (cluster.sh's balance_lines).
const (
	balanceRoundRobin = "  balance roundrobin"
	balanceByKey      = "  balance hdr(Authorization)\n  hash-type consistent"
	// By key, no replica holding more than 1.5 times the fleet's average
	// of requests in flight: past it, requests go on to the next replica
	// on the hash ring (HAProxy's consistent hashing with bounded loads).
	balanceByKeyBounded = balanceByKey + "\n  hash-balance-factor 150"
)

// serversUp returns the names of the servers HAProxy has in rotation.
func (h *haproxy) serversUp() ([]string, error) {
	c, err := net.DialTimeout("unix", h.socket, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("show stat\n")); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return nil, err
	}
	rows, err := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("# ")))).ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("haproxy stats: %v: %q", err, b)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	var up []string
	for _, row := range rows[1:] {
		if row[col["pxname"]] == "replicas" && row[col["svname"]] != "BACKEND" && strings.HasPrefix(row[col["status"]], "UP") {
			up = append(up, row[col["svname"]])
		}
	}
	return up, nil
}

// waitInRotation waits until HAProxy has every replica up.
func (f *fleet) waitInRotation() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		up, err := f.lb.serversUp()
		if err == nil && len(up) == len(f.replicas) {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("haproxy has %v in rotation (%v), want all %d replicas", up, err, len(f.replicas))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result is one request as the client saw it. send and recv are wall
// clock readings without their monotonic part: Redis decides by its TIME,
// which on this host is the wall clock, so windows are judged on it even
// if the clock is stepped mid-run. took is the latency, by the monotonic
// clock.
type result struct {
	send, recv time.Time
	took       time.Duration
	target     string
	key        int
	status     int
	code       string // the error body's code, for 4xx and 5xx
	retryAfter string
	err        error
}

func (r result) latency() time.Duration { return r.took }

// stamp sets res's send and recv from monotonic readings sent and received.
func (res *result) stamp(sent, received time.Time) {
	res.send, res.recv, res.took = sent.Round(0), received.Round(0), received.Sub(sent)
}

// get sends GET /v1/pets with key to base and records what came back.
func (f *fleet) get(ctx context.Context, base, key string) result {
	req, err := newGet(ctx, base, key)
	if err != nil {
		f.t.Fatal(err)
	}
	res := result{target: base}
	sent := time.Now()
	resp, err := f.client.Do(req)
	if err != nil {
		res.stamp(sent, time.Now())
		res.err = err
		return res
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	res.stamp(sent, time.Now())
	res.status, res.err = resp.StatusCode, err
	res.retryAfter = resp.Header.Get("Retry-After")
	if resp.StatusCode >= 400 {
		var e struct {
			Code string `json:"code"`
		}
		json.Unmarshal(body, &e)
		res.code = e.Code
	}
	return res
}

func newGet(ctx context.Context, base, key string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/pets?limit=1", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	return req, nil
}

// loadSpec is an open-model load: requests start at a constant rate
// whatever the answers' latency, as real traffic does.
type loadSpec struct {
	rate    float64  // requests per second
	workers int      // concurrent requests at most
	targets []string // base URLs, used in turn
	keys    []apiKey // used in turn
}

// load is a running loadSpec.
type load struct {
	spec    loadSpec
	f       *fleet
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	results []result
	missed  int // starts skipped because every worker was busy
	start   time.Time
}

func (f *fleet) startLoad(s loadSpec) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{spec: s, f: f, cancel: cancel, done: make(chan struct{}), start: time.Now()}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				k := i % len(s.keys)
				r := f.get(context.Background(), s.targets[i%len(s.targets)], s.keys[k].Key)
				r.key = k
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}
		}()
	}
	go func() {
		defer close(l.done)
		defer wg.Wait()
		defer close(jobs)
		interval := time.Duration(float64(time.Second) / s.rate)
		next := l.start
		for i := 0; ; i++ {
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			select {
			case <-ctx.Done():
				return
			case jobs <- i:
			default:
				l.missed++
			}
		}
	}()
	return l
}

// stop ends the load, waits for requests in flight and returns every
// result.
func (l *load) stop() []result {
	l.cancel()
	<-l.done
	return l.results
}

// summary is what a load saw.
type summary struct {
	total, ok, failed int
	codes             map[int]int
	p50, p99, max     time.Duration
	rate              float64
}

func summarize(rs []result, elapsed time.Duration) summary {
	s := summary{codes: map[int]int{}, total: len(rs)}
	lat := make([]time.Duration, 0, len(rs))
	for _, r := range rs {
		lat = append(lat, r.latency())
		switch {
		case r.err != nil:
			s.failed++
		case r.status >= 500:
			s.failed++
			s.codes[r.status]++
		default:
			s.codes[r.status]++
			if r.status < 300 {
				s.ok++
			}
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[len(lat)*99/100]
		s.max = lat[len(lat)-1]
	}
	s.rate = float64(len(rs)) / elapsed.Seconds()
	return s
}

func (s summary) String() string {
	return fmt.Sprintf("%d requests (%.0f/s), %d ok, %d failed (5xx or connection error), statuses %v, latency p50 %s p99 %s max %s",
		s.total, s.rate, s.ok, s.failed, s.codes, s.p50.Round(10*time.Microsecond), s.p99.Round(10*time.Microsecond), s.max.Round(10*time.Microsecond))
}

// failures returns the failed results: 5xx or no answer.
func failures(rs []result) []result {
	var out []result
	for _, r := range rs {
		if r.err != nil || r.status >= 500 {
			out = append(out, r)
		}
	}
	return out
}

func describe(r result) string {
	if r.err != nil {
		return fmt.Sprintf("%s sent %s: %v", r.target, r.send.Format("15:04:05.000"), r.err)
	}
	return fmt.Sprintf("%s sent %s: %d %s", r.target, r.send.Format("15:04:05.000"), r.status, r.code)
}
