package main

// The image run as Kubernetes runs it, without a kubelet: runc (the OCI
// runtime containerd uses by default) starts the image's entrypoint from its
// unpacked layers with the chart's security context (uid/gid 65532, fsGroup
// 65532, read-only root filesystem, no capabilities, no privilege
// escalation) and the chart's volumes (an emptyDir at /tmp, the plans
// ConfigMap and the keys Secret as read-only directories), in fresh pid,
// ipc, uts, mount and network namespaces. A TLS Redis runs in the
// container's network namespace, as a sidecar would; the test reaches both
// from inside that namespace. What it cannot show: a kubelet's probes,
// CNI networking, Services, the seccomp RuntimeDefault profile, cgroup
// limits, the kubelet's /etc/hosts and resolv.conf.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"hash/crc32"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
)

// The chart's mount points and file names (helm/petstore/templates/deployment.yaml).
const (
	plansDir = "/etc/petstore/plans"
	keysDir  = "/etc/petstore/keys"
	caDir    = "/etc/petstore/ca" // a private CA, as a user would mount one
)

// requireRuntime skips (fails under CI=true) when this machine cannot run
// containers: the test needs root for runc and network namespaces.
func requireRuntime(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"runc", "nsenter", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("running the image needs %s (make image-test installs runc through .ci/services)", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// testImage is the image make image wrote (PETSTORE_IMAGE), read as an
// OCI layout, or else one built here from a fresh petstore binary.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	if path := os.Getenv("PETSTORE_IMAGE"); path != "" {
		dir := t.TempDir()
		untar(t, path, dir)
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		im, err := idx.IndexManifest()
		if err != nil || len(im.Manifests) != 1 {
			t.Fatalf("%s: want one image, got %v (%v)", path, im, err)
		}
		img, err := idx.Image(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("PETSTORE_IMAGE is not set: make image-test tests the image make image wrote")
	}
	t.Log("PETSTORE_IMAGE is not set: building petstore and an image from it")
	bin := filepath.Join(t.TempDir(), "petstore")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=image-test", "-o", bin, "./cmd/petstore")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return mustBuild(t, buildSpec{Binary: data, Version: "image-test", Revision: "unknown", Created: testCreated})
}

// unpack writes the image's filesystem into dir with its modes and owners.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("layer entry %q escapes the root", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		mode := os.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("layer entry %q has type %c, which the image must not hold", h.Name, h.Typeflag)
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			t.Fatal(err)
		}
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// secretVolume lays files out as the kubelet does for a ConfigMap or Secret
// volume (a timestamped directory, ..data pointing at it, and a symlink per
// file), owned by root and group fsGroup with the given mode.
func secretVolume(t *testing.T, files map[string]string, mode os.FileMode) string {
	t.Helper()
	dir := t.TempDir()
	data := "..2026_11_23_10_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, data), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(dir, data, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, 65532); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(data, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newKey returns a random API key in the service's format: "pst_", 32
// base62 characters and their CRC32 in 6 base62 digits.
func newKey(t *testing.T) string {
	t.Helper()
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	secret := make([]byte, 32)
	for i := range secret {
		n, err := rand.Int(rand.Reader, big.NewInt(62))
		if err != nil {
			t.Fatal(err)
		}
		secret[i] = base62[n.Int64()]
	}
	n := crc32.ChecksumIEEE(secret)
	sum := make([]byte, 6)
	for i := 5; i >= 0; i-- {
		sum[i] = base62[n%62]
		n /= 62
	}
	return "pst_" + string(secret) + string(sum)
}

// testCA is a throwaway CA and a server certificate for 127.0.0.1 it signed.
type testCA struct {
	caPEM, certPEM, keyPEM []byte
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "redis"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
}

// podSpec is what the test varies between containers.
type podSpec struct {
	env    []string          // on top of the chart's
	mounts map[string]string // container path -> host directory, read-only
	probe  string            // host path of the probe binary, mounted at /probe
}

// chartEnv is the environment the chart gives the container with
// store=memory, redis.enabled=true, a keys file (deployment.yaml). The
// Redis timeout is raised from 50ms: this machine is shared and a TLS
// handshake may take longer.
func chartEnv(redisURL string) []string {
	return []string{
		"PETSTORE_ADDR=:8080",
		"PETSTORE_OPS_ADDR=:9090",
		"PETSTORE_STORE=memory",
		"PETSTORE_REDIS_MODE=single",
		"PETSTORE_REDIS_URL=" + redisURL,
		"PETSTORE_REDIS_TIMEOUT=2s",
		"PETSTORE_RATELIMIT_FAILURE_MODE=open",
		"PETSTORE_RATELIMIT_REPLICAS=1",
		"PETSTORE_PLANS_FILE=" + plansDir + "/plans.yaml",
		"PETSTORE_KEYS_FILE=" + keysDir + "/keys.yaml",
		"PETSTORE_KEY_CACHE_TTL=30s",
		"PETSTORE_RELOAD_INTERVAL=5s",
		"PETSTORE_DRAIN_DELAY=5s",
		"PETSTORE_SHUTDOWN_GRACE=20s",
		"PETSTORE_LOG_LEVEL=info",
		"PETSTORE_LOG_FORMAT=json",
	}
}

// ociSpec is the runc configuration of the container: the pod's and the
// container's securityContext translated as containerd does.
func ociSpec(t *testing.T, img v1.Image, pod podSpec) map[string]any {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := userOf(t, cf.Config.User)
	env := append(slices.Clone(cf.Config.Env), pod.env...)
	cwd := cf.Config.WorkingDir
	if cwd == "" {
		cwd = "/"
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc", "options": []string{"nosuid", "noexec", "nodev"}},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
		// The chart's emptyDir: the only writable place (sizeLimit 64Mi).
		{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777", "size=65536k"}},
	}
	var dests []string
	for dest := range pod.mounts {
		dests = append(dests, dest)
	}
	slices.Sort(dests)
	for _, dest := range dests {
		mounts = append(mounts, map[string]any{"destination": dest, "type": "bind", "source": pod.mounts[dest], "options": []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if pod.probe != "" {
		mounts = append(mounts, map[string]any{"destination": "/probe", "type": "bind", "source": pod.probe, "options": []string{"bind", "ro", "nosuid", "nodev"}})
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"hostname":   "petstore-0",
		"root":       map[string]any{"readonly": true}, // path: set by createContainer
		"process": map[string]any{
			"terminal": false,
			// fsGroup 65532 is a supplementary group, as the kubelet sets it.
			"user":            map[string]any{"uid": uid, "gid": gid, "additionalGids": []int{65532}},
			"args":            append(slices.Clone(cf.Config.Entrypoint), cf.Config.Cmd...),
			"env":             env,
			"cwd":             cwd,
			"noNewPrivileges": true,                  // allowPrivilegeEscalation: false
			"capabilities":    map[string][]string{}, // drop: [ALL]
		},
		"mounts": mounts,
		"linux": map[string]any{
			"namespaces": []map[string]string{
				{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"},
			},
			"maskedPaths": []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// userOf parses the image's numeric uid:gid; Kubernetes' runAsNonRoot
// refuses a user name it cannot check, and uid 0.
func userOf(t *testing.T, user string) (int, int) {
	t.Helper()
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid == 0 {
		t.Fatalf("image user %q: runAsNonRoot needs a numeric non-root uid:gid", user)
	}
	return uid, gid
}

// container is one runc container the test started.
type container struct {
	t       *testing.T
	id      string
	root    string // runc's state directory, private to the test
	bundle  string
	pid     int
	logPath string
	client  *http.Client // dials inside the container's network namespace
}

// createContainer creates (but does not start) a container of rootfs with
// spec: its namespaces exist, its entrypoint waits for start.
func createContainer(t *testing.T, rootfs string, spec map[string]any) *container {
	t.Helper()
	base := t.TempDir()
	c := &container{
		t:       t,
		id:      fmt.Sprintf("petstore-image-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
		root:    filepath.Join(base, "runc"),
		bundle:  filepath.Join(base, "bundle"),
		logPath: filepath.Join(base, "petstore.log"),
	}
	if err := os.MkdirAll(c.bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	spec["root"].(map[string]any)["path"] = rootfs
	cfg, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	pidFile := filepath.Join(base, "pid")
	create := exec.Command("runc", "--root", c.root, "create", "--bundle", c.bundle, "--pid-file", pidFile, c.id)
	create.Stdout, create.Stderr = logFile, logFile
	t.Cleanup(c.remove)
	if err := create.Run(); err != nil {
		t.Fatalf("runc create: %v\n%s", err, c.log())
	}
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if c.pid, err = strconv.Atoi(strings.TrimSpace(string(pid))); err != nil {
		t.Fatal(err)
	}
	c.client = &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DialContext: c.dial, DisableKeepAlives: true},
	}
	return c
}

func (c *container) runc(args ...string) error {
	out, err := exec.Command("runc", append([]string{"--root", c.root}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *container) start() {
	if err := c.runc("start", c.id); err != nil {
		c.t.Fatal(err)
	}
}

// remove kills and deletes the container; runc removes its cgroups.
func (c *container) remove() {
	_ = c.runc("kill", c.id, "KILL")
	if err := c.runc("delete", "--force", c.id); err != nil {
		c.t.Log(err)
	}
}

func (c *container) log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// dial connects from inside the container's network namespace: the socket
// is made by a thread that joined it (and is never returned to the Go
// scheduler), and keeps that namespace afterwards.
func (c *container) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with this goroutine
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", c.pid))
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}

// startRedis starts a TLS-only redis-server in the container's network
// namespace, as a sidecar; it is stopped by its PID.
func (c *container) startRedis(ca testCA, port int) {
	t := c.t
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": ca.caPEM, "redis.crt": ca.certPEM, "redis.key": ca.keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(c.pid)+"/ns/net", "--",
		"redis-server", "--bind", "127.0.0.1", "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "redis.crt"), "--tls-key-file", filepath.Join(dir, "redis.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := c.dial(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server did not listen on %d: %v\n%s", port, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisCommand sends one inline command to the sidecar Redis over TLS,
// verified with the test CA, and returns the reply line.
func (c *container) redisCommand(ca testCA, port int, command string) string {
	t := c.t
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.caPEM)
	raw, err := c.dial(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(command + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// waitReady waits for /readyz on the ops port.
func (c *container) waitReady(opsPort string) {
	t := c.t
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.client.Get("http://127.0.0.1:" + opsPort + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 200 (last: %v %v)\n%s", resp, err, c.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// do sends a request and returns the status, headers and body.
func (c *container) do(method, url, key, body string) (int, http.Header, string) {
	t := c.t
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", method, url, err, c.log())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// metric returns the value of an unlabelled series on /metrics.
func (c *container) metric(opsPort, name string) float64 {
	t := c.t
	code, _, body := c.do("GET", "http://127.0.0.1:"+opsPort+"/metrics", "", "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// procStatus reads fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

// portOf returns the number of an exposed port of the image, checking the
// image exposes it.
func portOf(t *testing.T, img v1.Image, port string) string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cf.Config.ExposedPorts[port+"/tcp"]; !ok {
		t.Fatalf("the image does not expose %s/tcp: %v", port, cf.Config.ExposedPorts)
	}
	return port
}

func TestRunsLikeKubernetes(t *testing.T) {
	requireRuntime(t)
	img := testImage(t)
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	unpack(t, img, rootfs)
	apiPort, opsPort := portOf(t, img, "8080"), portOf(t, img, "9090")

	key := newKey(t)
	sum := sha256.Sum256([]byte(key))
	keys := secretVolume(t, map[string]string{
		"keys.yaml": fmt.Sprintf("keys:\n  - {sha256: %s, plan: pro, label: image-test}\n", hex.EncodeToString(sum[:])),
	}, 0o440) // the chart's defaultMode, readable through fsGroup only
	plans := secretVolume(t, map[string]string{
		"plans.yaml": "plans:\n  pro:\n    quotas:\n      - {limit: 300, period: 1m}\n      - {limit: 10000, period: 24h}\n",
	}, 0o644)
	ca := newTestCA(t, "petstore image test CA")
	caVol := secretVolume(t, map[string]string{"ca.crt": string(ca.caPEM)}, 0o644)
	probe := buildProbe(t)
	const redisPort = 6380

	t.Run("serves, trusts its CA bundle plus the mounted CA, writes only to /tmp", func(t *testing.T) {
		c := createContainer(t, rootfs, ociSpec(t, img, podSpec{
			env:    append(chartEnv(fmt.Sprintf("rediss://127.0.0.1:%d/0", redisPort)), "SSL_CERT_DIR="+caDir),
			mounts: map[string]string{plansDir: plans, keysDir: keys, caDir: caVol},
			probe:  probe,
		}))
		c.startRedis(ca, redisPort)
		c.start()
		c.waitReady(opsPort)

		if code, _, body := c.do("GET", "http://127.0.0.1:"+opsPort+"/healthz", "", ""); code != http.StatusOK {
			t.Errorf("/healthz: %d %s", code, body)
		}
		api := "http://127.0.0.1:" + apiPort
		code, h, body := c.do("GET", api+"/v1/pets", key, "")
		if code != http.StatusOK || strings.TrimSpace(body) != "[]" {
			t.Fatalf("list: %d %s\n%s", code, body, c.log())
		}
		if h.Get("X-RateLimit-Limit") != "300" {
			t.Errorf("list: X-RateLimit-Limit %q, want the pro plan's 300 from the mounted plans file", h.Get("X-RateLimit-Limit"))
		}
		code, _, body = c.do("POST", api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`)
		if code != http.StatusCreated || !strings.Contains(body, `"name":"Rex"`) {
			t.Fatalf("create: %d %s", code, body)
		}
		if code, _, body := c.do("GET", api+"/v1/pets", key, ""); code != http.StatusOK || !strings.Contains(body, `"Rex"`) {
			t.Errorf("list after create: %d %s", code, body)
		}
		if code, _, _ := c.do("GET", api+"/v1/pets", newKey(t), ""); code != http.StatusUnauthorized {
			t.Errorf("a key not in the keys file: %d, want 401", code)
		}

		// The limiter reached Redis over TLS: no errors, not in fallback,
		// and its state is in Redis.
		if v := c.metric(opsPort, "petstore_ratelimit_redis_errors_total"); v != 0 {
			t.Errorf("petstore_ratelimit_redis_errors_total %v, want 0\n%s", v, c.log())
		}
		if v := c.metric(opsPort, "petstore_ratelimit_fallback_active"); v != 0 {
			t.Errorf("petstore_ratelimit_fallback_active %v, want 0", v)
		}
		if reply := c.redisCommand(ca, redisPort, "DBSIZE"); reply == ":0" || !strings.HasPrefix(reply, ":") {
			t.Errorf("Redis DBSIZE %q: the limiter kept no state there", reply)
		}

		// The serving process: uid, gid and groups, no capabilities, no
		// privilege escalation.
		st := procStatus(t, c.pid)
		for field, want := range map[string]string{
			"Uid": "65532 65532 65532 65532", "Gid": "65532 65532 65532 65532", "Groups": "65532",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
		} {
			if st[field] != want {
				t.Errorf("petstore process %s: %q, want %q", field, st[field], want)
			}
		}

		// A second process with the same identity in the same container
		// tries to write everywhere.
		r := c.runProbe(ociSpec(t, img, podSpec{env: []string{"SSL_CERT_DIR=" + caDir}})["process"].(map[string]any))
		if r.User != "nonroot" {
			t.Errorf("uid 65532 resolves to %q in the image's /etc/passwd, want nonroot", r.User)
		}
		_, bundled := caCertificates()
		if r.Roots != bundled+1 {
			t.Errorf("the process trusts %d roots, want the image's %d plus the mounted CA", r.Roots, bundled)
		}
		if !r.TrustsTestCA {
			t.Error("the mounted CA is not among the trusted roots")
		}
		var outside []string
		for _, p := range r.Writable {
			if p != "/tmp" && !strings.HasPrefix(p, "/tmp/") {
				outside = append(outside, p)
			}
		}
		if len(outside) > 0 {
			t.Errorf("writable outside /tmp: %v", outside)
		}
		if !slices.Contains(r.Writable, "/tmp") {
			t.Errorf("/tmp is not writable (the probe's own check failed): %v", r.Writable)
		}
		for _, p := range []string{"/", "/petstore", "/etc", "/etc/passwd", "/etc/ssl/certs/ca-certificates.crt", keysDir, plansDir, "/dev", "/probe"} {
			if !slices.Contains(r.Checked, p) {
				t.Errorf("the probe did not check %s", p)
			}
		}
		if len(r.Errors) > 0 {
			t.Errorf("probe: %v", r.Errors)
		}
		t.Logf("probe: checked %v, writable: %v", r.Checked, r.Writable)
	})

	t.Run("refuses a Redis whose CA it does not trust", func(t *testing.T) {
		c := createContainer(t, rootfs, ociSpec(t, img, podSpec{
			env:    chartEnv(fmt.Sprintf("rediss://127.0.0.1:%d/0", redisPort)),
			mounts: map[string]string{plansDir: plans, keysDir: keys},
		}))
		c.startRedis(ca, redisPort)
		c.start()
		c.waitReady(opsPort)
		// Fail-open: the request is served, limited locally.
		if code, _, body := c.do("GET", "http://127.0.0.1:"+apiPort+"/v1/pets", key, ""); code != http.StatusOK {
			t.Fatalf("list: %d %s", code, body)
		}
		if v := c.metric(opsPort, "petstore_ratelimit_redis_errors_total"); v == 0 {
			t.Errorf("no Redis error although Redis's certificate is signed by an unknown CA\n%s", c.log())
		}
		if reply := c.redisCommand(ca, redisPort, "DBSIZE"); reply != ":0" {
			t.Errorf("Redis DBSIZE %q: something was written over an unverified connection", reply)
		}
		if !strings.Contains(c.log(), "x509: certificate signed by unknown authority") {
			t.Errorf("the log does not say why Redis was refused:\n%s", c.log())
		}
	})
}

// probeResult is what the probe reports.
type probeResult struct {
	User         string   `json:"user"`
	Roots        int      `json:"roots"`
	TrustsTestCA bool     `json:"trustsTestCA"`
	Checked      []string `json:"checked"`
	Writable     []string `json:"writable"`
	Errors       []string `json:"errors"`
}

// runProbe runs /probe in the container with the given process settings
// (those of the entrypoint: same user, groups, capabilities).
func (c *container) runProbe(process map[string]any) probeResult {
	t := c.t
	process["args"] = []string{"/probe"}
	process["cwd"] = "/"
	b, err := json.Marshal(process)
	if err != nil {
		t.Fatal(err)
	}
	pf := filepath.Join(t.TempDir(), "process.json")
	if err := os.WriteFile(pf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("runc", "--root", c.root, "exec", "--process", pf, c.id)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var r probeResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("probe output: %v\n%s", err, stdout.String())
	}
	return r
}

// probeSource is the program run inside the container to find what its
// user can write: it tries to create a file and a directory in every
// directory and to open every regular file for writing, outside /proc and
// /sys (kernel interfaces, not storage).
const probeSource = `package main

import (
	"crypto/x509"
	"encoding/json"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"
)

func main() {
	var r struct {
		User         string   ` + "`json:\"user\"`" + `
		Roots        int      ` + "`json:\"roots\"`" + `
		TrustsTestCA bool     ` + "`json:\"trustsTestCA\"`" + `
		Checked      []string ` + "`json:\"checked\"`" + `
		Writable     []string ` + "`json:\"writable\"`" + `
		Errors       []string ` + "`json:\"errors\"`" + `
	}
	if u, err := user.LookupId("65532"); err == nil {
		r.User = u.Username
	} else {
		r.Errors = append(r.Errors, err.Error())
	}
	if pool, err := x509.SystemCertPool(); err == nil {
		subjects := pool.Subjects()
		r.Roots = len(subjects)
		for _, s := range subjects {
			if strings.Contains(string(s), "petstore image test CA") {
				r.TrustsTestCA = true
			}
		}
	} else {
		r.Errors = append(r.Errors, err.Error())
	}
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			return nil
		}
		if p == "/proc" || p == "/sys" {
			return fs.SkipDir
		}
		switch {
		case d.IsDir():
			r.Checked = append(r.Checked, p)
			f := filepath.Join(p, ".probe-write")
			if h, err := os.OpenFile(f, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
				h.Close()
				os.Remove(f)
				r.Writable = append(r.Writable, p)
			} else if err := os.Mkdir(f, 0o700); err == nil {
				os.Remove(f)
				r.Writable = append(r.Writable, p)
			}
		case d.Type().IsRegular():
			r.Checked = append(r.Checked, p)
			if h, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
				h.Close()
				r.Writable = append(r.Writable, p)
			}
		}
		return nil
	})
	json.NewEncoder(os.Stdout).Encode(r)
}
`

// buildProbe builds the probe as a static binary.
func buildProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(probeSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module probe\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", "probe", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "probe")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
