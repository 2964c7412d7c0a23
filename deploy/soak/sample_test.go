package main

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	m, err := parseMetrics(strings.NewReader(`# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 29
go_memstats_next_gc_bytes 5.292818e+06
petstore_http_requests_total{code="200",method="GET",route="/v1/pets"} 12
process_open_fds 17
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"go_goroutines": 29, "go_memstats_next_gc_bytes": 5292818, "process_open_fds": 17}
	if len(m) != len(want) {
		t.Errorf("parsed %v, want %v (labelled samples left out)", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
}

func TestParseProcNetTCP(t *testing.T) {
	t.Parallel()
	// Port 0x5461 = 21601 (a replica's API); 0x9C40 = 40000.
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5461 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 100 0 0 10 0
   1: 0100007F:5461 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:9C41 0100007F:5461 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
`
	got := parseProcNetTCP([]byte(table))
	want := map[string]tcpConn{"101": {21601, 0, "0A"}, "102": {21601, 40000, tcpEstablished}}
	if len(got) != len(want) || got["101"] != want["101"] || got["102"] != want["102"] {
		t.Errorf("parsed %v, want %v (no socket: no inode)", got, want)
	}
}

// TestCensus counts this process's own descriptors: a connection it
// accepted and one it opened, both ends here.
func TestCensus(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	before, err := census(os.Getpid(), []int{port}, port)
	if err != nil {
		t.Fatal(err)
	}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	after, err := census(os.Getpid(), []int{port}, port)
	if err != nil {
		t.Fatal(err)
	}
	if after.accepted != before.accepted+1 || after.redis != before.redis+1 || after.total != before.total+2 {
		t.Errorf("census before %+v, after a connection %+v: want one more accepted, one more to the port, two more descriptors", before, after)
	}
}

func TestKeyEntries(t *testing.T) {
	t.Parallel()
	out := []byte(`keys:
  - key: pst_a
    plan: enterprise
    label: soak
    quotas: [{limit: 6000, period: 1m}, {limit: 1000000, period: 24h}]
  - key: pst_b
    plan: enterprise
    label: soak
    quotas: [{limit: 6000, period: 1m}, {limit: 1000000, period: 24h}]
`)
	entries, keys := keyEntries(out)
	if strings.Join(keys, " ") != "pst_a pst_b" {
		t.Errorf("keys %q", keys)
	}
	if !bytes.Equal(entries, bytes.TrimPrefix(out, []byte("keys:\n"))) {
		t.Errorf("entries:\n%s", entries)
	}
}

// fakeRedis answers each command it reads with the next of replies.
func fakeRedis(t *testing.T, replies ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for _, reply := range replies {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			// *N, then $len and the argument for each of N.
			line, _ := r.ReadString('\n')
			var n int
			if _, err := fmt.Sscanf(line, "*%d", &n); err == nil {
				for range 2 * n {
					_, _ = r.ReadString('\n')
				}
			}
			_, _ = io.WriteString(c, reply)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func TestRedisDo(t *testing.T) {
	t.Parallel()
	addr := fakeRedis(t, "+PONG\r\n", ":28258\r\n", "$31\r\n# Memory\r\nused_memory:1048576\r\n\r\n", "-ERR unknown command\r\n")
	if got, err := redisDo(addr, "PING"); got != "PONG" || err != nil {
		t.Errorf("PING: %q %v", got, err)
	}
	if got, err := redisDo(addr, "DBSIZE"); got != "28258" || err != nil {
		t.Errorf("DBSIZE: %q %v", got, err)
	}
	info, err := redisDo(addr, "INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := infoField(info, "used_memory"); v != 1<<20 || err != nil {
		t.Errorf("used_memory: %v %v", v, err)
	}
	if _, err := redisDo(addr, "NOPE"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("an error reply: %v", err)
	}
}

func TestWriteSVG(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var ss []sample
	for i := range 30 {
		p := phaseSteady
		switch {
		case i < 4:
			p = phaseWarmup
		case i >= 14 && i < 16:
			p = phaseFault
		}
		v := map[string]float64{redisMemory: float64(i) * 1e6, redisKeys: 20000, "r1_goroutines": 40}
		if i != 15 { // r2 being restarted
			v["r2_goroutines"] = 42
		}
		ss = append(ss, sample{at: t0.Add(time.Duration(i+1) * 10 * time.Second), phase: p, rps: 2000, values: v})
	}
	var b bytes.Buffer
	if err := writeSVG(&b, ss, t0, t0.Add(300*time.Second), 2); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	polylines, rects := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				polylines++
			case "rect":
				rects++
			}
		}
	}
	// goroutines: r1 one line, r2 two (broken where it has no reading);
	// redis memory, keys, requests/s one each.
	if polylines != 6 {
		t.Errorf("%d polylines, want 6", polylines)
	}
	if rects == 0 {
		t.Error("no phase bands or frames")
	}
}

// TestConnGoroutines counts a goroutine profile's goroutines, and those
// serving a connection by any frame of their stacks, from one snapshot.
func TestConnGoroutines(t *testing.T) {
	profile := `goroutine profile: total 14
6 @ 0x43e0ee 0x4363f7 0x6b3e44 0x473aa1
#	0x6b3e43	net/http.(*conn).serve+0x5e3	/usr/local/go/src/net/http/server.go:2102
#	0x473aa0	runtime.goexit+0x0		/usr/local/go/src/runtime/asm_amd64.s:1700

3 @ 0x43e0ee 0x6a1b2c 0x473aa1
#	0x6a1b2b	net/http.(*connReader).backgroundRead+0x3b	/usr/local/go/src/net/http/server.go:690

4 @ 0x43e0ee 0x40a5d8 0x473aa1
#	0x7c1a10	github.com/animal-store/petstore/ratelimit.(*batcher).run+0x50	/src/ratelimit/batch.go:120
#	0x7c1b00	main.serve.func1+0x20	/src/cmd/petstore/serve.go:200

1 @ 0x43e0ee 0x473aa1
#	0x6b0000	net/http.(*Server).Serve+0x10	/usr/local/go/src/net/http/server.go:3300
`
	total, conn, err := connGoroutines(strings.NewReader(profile))
	if err != nil || total != 14 || conn != 9 {
		t.Fatalf("connGoroutines = %d, %d, %v; want 14, 9", total, conn, err)
	}
	if _, _, err := connGoroutines(strings.NewReader("404 page not found\n")); err == nil {
		t.Fatal("a page that is no profile was read as one")
	}
}
