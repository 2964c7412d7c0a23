package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// redisServer is the soak's private redis-server, without persistence:
// a restart loses every record, as a crash of an unpersisted Redis or a
// replacement node would.
type redisServer struct {
	port int
	dir  string
	log  *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(port int, dir string, log *os.File) (*redisServer, error) {
	r := &redisServer{port: port, dir: dir, log: log}
	return r, r.start()
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *redisServer) start() error {
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	endWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if reply, err := redisDo(r.addr(), "PING"); err == nil && reply == "PONG" {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited at start (see %s)", r.addr(), r.log.Name())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not answer on %s within 10 s (see %s)", r.addr(), r.log.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restart kills Redis (SIGKILL: no chance to save anything) and starts a
// fresh one on the same port.
func (r *redisServer) restart() error {
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL to redis-server (pid %d): %w", r.cmd.Process.Pid, err)
	}
	<-r.done
	return r.start()
}

// stop ends Redis for good.
func (r *redisServer) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}
