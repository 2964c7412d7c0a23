package main

import (
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/postgres"
	"github.com/animal-store/petstore/internal/testenv"
)

// dbProxy forwards a loopback port to the test PostgreSQL. cut makes the
// database vanish for whoever connects through the proxy (connections
// dropped, new ones refused), as a network partition or a database restart
// would, without touching the shared server.
type dbProxy struct {
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

// newDBProxy starts a proxy to the server of dbURL and returns it with
// dbURL rewritten to go through it.
func newDBProxy(t *testing.T, dbURL string) (*dbProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &dbProxy{target: u.Host, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.listen(ln)
	t.Cleanup(p.cut)
	u.Host = p.addr
	return p, u.String()
}

func (p *dbProxy) listen(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
}

func (p *dbProxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut while dialing
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns[c], p.conns[s] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(s, c); s.Close() }()
	_, _ = io.Copy(c, s)
	c.Close()
}

// cut closes the listener and every forwarded connection.
func (p *dbProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// restore listens again on the same address.
func (p *dbProxy) restore(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("relisten on %s: %v", p.addr, err)
	}
	p.listen(ln)
}

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestDatabaseCheckOutage runs the real database check on a real pool whose
// database goes away: with pets in PostgreSQL the replica stays ready for
// databaseOutageTolerance and then turns unready; with pets in memory it
// stays ready throughout; both come back by themselves.
func TestDatabaseCheckOutage(t *testing.T) {
	t.Parallel()
	for _, petsInDatabase := range []bool{true, false} {
		proxy, dbURL := newDBProxy(t, withSchema(t))
		pool, err := postgres.Open(t.Context(), dbURL, 2)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if _, err := postgres.Migrate(t.Context(), pool); err != nil {
			t.Fatal(err)
		}
		clock := &testClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
		var logs testenv.Buffer
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		ready := httpapi.NewReadiness(httpapi.ReadinessConfig{
			Checks: []httpapi.Check{newDatabaseCheck(pool, petsInDatabase, log, prometheus.NewRegistry())},
			Logger: log,
			Now:    clock.Now,
		})
		expect := func(step string, want bool, reason string) {
			t.Helper()
			ok, _, msg := ready.Ready()
			if ok != want || !strings.Contains(msg, reason) {
				t.Errorf("pets in database %v: %s: ready %v %q, want %v %q", petsInDatabase, step, ok, msg, want, reason)
			}
		}

		ready.CheckNow(t.Context())
		expect("migrated", true, "")
		proxy.cut()
		ready.CheckNow(t.Context())
		expect("database gone", true, "")
		clock.advance(databaseOutageTolerance - time.Second)
		ready.CheckNow(t.Context())
		expect("gone just under the tolerance", true, "")
		clock.advance(time.Second)
		ready.CheckNow(t.Context())
		if petsInDatabase {
			expect("gone for the tolerance", false, "unreachable since")
		} else {
			expect("gone for the tolerance, pets in memory", true, "")
		}
		if !strings.Contains(logs.String(), `"msg":"readiness check cannot reach its dependency"`) {
			t.Errorf("the outage was not logged:\n%s", logs.String())
		}

		proxy.restore(t)
		// The pool finds its dropped connections broken on use; a round
		// or two later it has new ones.
		for round := 1; ; round++ {
			ready.CheckNow(t.Context())
			if ok, _, _ := ready.Ready(); ok {
				break
			}
			if round == 10 {
				t.Fatalf("pets in database %v: not ready 10 rounds after the database came back:\n%s", petsInDatabase, logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestServeThroughDatabaseBlip cuts the database from under a running
// replica whose pets live in it: it stays ready (a blip must not empty the
// load balancer), pet requests meanwhile are 503 with Retry-After (never
// 500), and they succeed again once the database is back.
func TestServeThroughDatabaseBlip(t *testing.T) {
	t.Parallel()
	proxy, dbURL := newDBProxy(t, withSchema(t))
	env, key := staticKeyEnv(t, dbURL)
	in := start(t, env, "--migrate")
	if resp, body := do(t, "POST", in.api+"/v1/pets", key, `{"name":"Rex","categoryId":1}`); resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}

	proxy.cut()
	blip := time.Now()
	for time.Since(blip) < 3*httpapi.DefaultCheckInterval {
		if code, st := readyz(t, in); code != 200 {
			t.Fatalf("unready %v into a database blip: %d %v", time.Since(blip), code, st)
		}
		resp, body := do(t, "GET", in.api+"/v1/pets", key, "")
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("list during the blip: %d %v %s, want 503 with Retry-After", resp.StatusCode, resp.Header, body)
		}
		time.Sleep(200 * time.Millisecond)
	}

	proxy.restore(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := do(t, "GET", in.api+"/v1/pets", key, "")
		if resp.StatusCode == 200 && strings.Contains(string(body), "Rex") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list after the blip: %d %s", resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Contains(in.stderr.String(), `"msg":"internal error"`) {
		t.Errorf("an internal error was logged:\n%s", in.stderr.String())
	}
}
