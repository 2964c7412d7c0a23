package httpapi

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientAddr returns the address of the client that sent r.
//
// The socket peer is the client unless it is in trusted. A trusted peer is a
// proxy, so the forwarding header is read from right to left (the order in
// which proxies append), skipping trusted hops; the first untrusted address
// is the client. When every hop is trusted the leftmost one is the client;
// an unreadable hop ends the walk at the last address that could be read.
//
// X-Forwarded-For is read when present, Forwarded (RFC 7239) otherwise. A
// proxy that writes only Forwarded must therefore drop any X-Forwarded-For
// its clients send.
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok || !isTrusted(peer, trusted) {
		return peer
	}
	hops := forwardedHops(r.Header)
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			return addr
		}
		addr = a
		if !isTrusted(a, trusted) {
			return a
		}
	}
	return addr
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedHops returns the addresses a chain of proxies recorded, client
// first, as written (unparsed).
func forwardedHops(h http.Header) []string {
	var hops []string
	if xff := h.Values("X-Forwarded-For"); len(xff) > 0 {
		for _, line := range xff {
			for hop := range strings.SplitSeq(line, ",") {
				hops = append(hops, strings.TrimSpace(hop))
			}
		}
		return hops
	}
	for _, line := range h.Values("Forwarded") {
		for element := range strings.SplitSeq(line, ",") {
			hop := "" // an element without for= is an unreadable hop
			for pair := range strings.SplitSeq(element, ";") {
				name, value, _ := strings.Cut(strings.TrimSpace(pair), "=")
				if strings.EqualFold(name, "for") {
					hop = strings.Trim(value, `"`)
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// parsePeer reads the socket peer's address, which net/http writes as
// host:port, as parseHop does. It tries that form first: parseHop tries a
// bare address first, whose failure on every request costs an error value.
// No text is both a bare address and an address with a port, so the order
// changes nothing else.
func parsePeer(remoteAddr string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return parseHop(remoteAddr)
}

// parseHop reads an address written as 192.0.2.1, 192.0.2.1:80,
// 2001:db8::1 or [2001:db8::1]:80, as an unmapped address without zone.
func parseHop(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, err = netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
			if err != nil {
				return netip.Addr{}, false
			}
		} else {
			a = ap.Addr()
		}
	}
	return a.Unmap().WithZone(""), true
}

// throttleKey is the per-IP throttle's key for a client. IPv6 clients are
// counted per /64, the block a single site usually holds, so that one
// client cannot escape the throttle by rotating addresses within it.
func throttleKey(a netip.Addr) string {
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "ip:" + p.String()
	}
	return "ip:" + a.String()
}
