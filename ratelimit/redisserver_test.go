package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// randomPrefix isolates a test's keys on a shared Redis.
func randomPrefix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "test:" + hex.EncodeToString(b) + ":"
}

// redisServer is a redis-server process owned by one test.
type redisServer struct {
	addr   string
	port   int
	dir    string
	args   []string
	cmd    *exec.Cmd
	out    *testenv.Buffer // the process's output, for a failure's message
	exited chan struct{}   // closed when the process has exited
}

// startRedisServer starts a private redis-server on a free port. Tests
// that need one (stalls, restarts, cluster) skip when the binary is not
// installed, except under CI. A server that exits at start (its port,
// or a cluster node's bus port, taken between the check and the bind by
// another test's process) is started again on another port.
func startRedisServer(t testing.TB, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testenv.InCI() {
			t.Fatalf("redis-server not installed: %v", err)
		}
		t.Skipf("redis-server not installed: %v", err)
	}
	s := &redisServer{args: args}
	t.Cleanup(s.stop)
	for attempt := 1; ; attempt++ {
		s.dir = t.TempDir() // nothing a failed start wrote (a cluster's nodes.conf)
		if slices.Contains(args, "--cluster-enabled") {
			s.port = testenv.FreeClusterPort(t)
		} else {
			s.port = testenv.FreePort(t)
		}
		s.addr = "127.0.0.1:" + strconv.Itoa(s.port)
		err := s.tryStart()
		if err == nil {
			return s
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("%v; starting it on another port", err)
	}
}

// start starts the server again on its port (after stop).
func (s *redisServer) start(t testing.TB) {
	t.Helper()
	if err := s.tryStart(); err != nil {
		t.Fatal(err)
	}
}

// tryStart starts the process and waits until it answers, at most 10 s;
// it fails at once when the process exits, with what it printed.
func (s *redisServer) tryStart() error {
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir}, s.args...)
	s.out = &testenv.Buffer{}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	testenv.EndWithTest(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start:\n%s", s.addr, s.out.String())
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("redis-server on %s did not answer within 10s:\n%s", s.addr, s.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (s *redisServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

func (s *redisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", sig, err)
	}
}
