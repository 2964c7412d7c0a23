package main

import (
	"net"
	"testing"
	"time"
)

// startDelayProxy forwards TCP connections to target, handing on every
// chunk of bytes, in each direction and in order, delay after it arrived:
// target as if it were a round trip of 2*delay away. It returns the
// proxy's address; it stops with the benchmark.
func startDelayProxy(b *testing.B, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", target)
				if err != nil {
					_ = c.Close()
					return
				}
				go forwardDelayed(u, c, delay)
				forwardDelayed(c, u, delay)
			}()
		}
	}()
	return ln.Addr().String()
}

// forwardDelayed copies src to dst, each chunk delay after it was read,
// and closes both when either side ends.
func forwardDelayed(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(delay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
}
