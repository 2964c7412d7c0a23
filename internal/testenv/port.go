package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// process the test starts to listen on. It is taken below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), from which Linux picks
// the local ports of outgoing connections and of listeners on port 0: a
// port from that range, free when checked, can be taken by any new
// connection before the child binds it (seen as "address already in use"
// while a fleet test's load generator opened connections). Below the
// range only an explicit bind can take it. No port is handed out twice in
// one test process (claim): parallel tests drawing at random would
// otherwise meet on one port now and then, one of their children then
// failing to bind it.
func FreePort(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	if lo > 12000 {
		for range 200 {
			if port := 10000 + rand.IntN(lo-10000); portFree(port) && claim(port) {
				return port
			}
		}
	}
	for range 200 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if claim(port) {
			return port
		}
	}
	t.Fatal("no free port that this process has not handed out already")
	return 0
}

// handedOut holds the ports FreePort and FreeClusterPort have returned in
// this process.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// claim marks port as handed out, reporting whether it was not already.
func claim(port int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports[port] {
		return false
	}
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]bool)
	}
	handedOut.ports[port] = true
	return true
}

// FreeClusterPort returns a port for a Redis Cluster node, which also
// listens on its cluster bus port, port+10000: both were free a moment
// ago, and both lie below the ephemeral range when the range allows it
// (a bus port inside it can be taken by an outgoing connection first, and
// the node then exits at start).
func FreeClusterPort(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	if lo > 22000 {
		for range 200 {
			port := 10000 + rand.IntN(lo-20000)
			if portFree(port) && portFree(port+10000) && claim(port) && claim(port+10000) {
				return port
			}
		}
	}
	for range 200 {
		if port := FreePort(t); port+10000 <= 65535 && portFree(port+10000) && claim(port+10000) {
			return port
		}
	}
	t.Fatal("no free pair of ports for a Redis Cluster node")
	return 0
}

// portFree reports whether a loopback listener can take port now.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range
// (0 when unknown).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	lo, _ := strconv.Atoi(f[0])
	return lo
}
