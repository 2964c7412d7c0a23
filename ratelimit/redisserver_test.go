package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os/exec"
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
	addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// startRedisServer starts a private redis-server on a free port. Tests
// that need one (stalls, restarts, cluster) skip when the binary is not
// installed, except under CI.
func startRedisServer(t testing.TB, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testenv.InCI() {
			t.Fatalf("redis-server not installed: %v", err)
		}
		t.Skipf("redis-server not installed: %v", err)
	}
	s := &redisServer{port: testenv.FreePort(t), dir: t.TempDir(), args: args}
	s.addr = "127.0.0.1:" + strconv.Itoa(s.port)
	s.start(t)
	t.Cleanup(s.stop)
	return s
}

func (s *redisServer) start(t testing.TB) {
	t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start", s.addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *redisServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

func (s *redisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", sig, err)
	}
}
