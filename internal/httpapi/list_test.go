package httpapi

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/pet"
)

var nextLinkPattern = regexp.MustCompile(`^<([^>]+)>; rel="next"$`)

// walk follows rel="next" links from target and returns every pet seen.
func (ts *testServer) walk(target string, pageSize int) []pet.Pet {
	ts.t.Helper()
	var all []pet.Pet
	for pages := 0; target != ""; pages++ {
		if pages > 1000 {
			ts.t.Fatal("pagination does not end")
		}
		resp := ts.get(target, keyFree)
		if resp.StatusCode != http.StatusOK {
			ts.t.Fatalf("GET %s: %d %s", target, resp.StatusCode, resp.body)
		}
		var page []pet.Pet
		decodeJSON(ts.t, resp.body, &page)
		if len(page) > pageSize {
			ts.t.Fatalf("GET %s: %d pets, page size %d", target, len(page), pageSize)
		}
		all = append(all, page...)
		target = ""
		if link := resp.Header.Get("Link"); link != "" {
			m := nextLinkPattern.FindStringSubmatch(link)
			if m == nil {
				ts.t.Fatalf("GET %s: Link %q is not a rel=next link", target, link)
			}
			if len(page) != pageSize {
				ts.t.Fatalf("short page of %d with a next link", len(page))
			}
			target = m[1]
		}
	}
	return all
}

func TestListPaginationWalk(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	var want []pet.Pet
	for i := range 57 {
		want = append(want, ts.create(fmt.Sprintf("pet %d", i), int64(i%4+1), pet.Statuses[i%len(pet.Statuses)]))
	}
	filter := func(s pet.Status) []pet.Pet {
		var out []pet.Pet
		for _, p := range want {
			if s == "" || p.Status == s {
				out = append(out, p)
			}
		}
		return out
	}
	tests := []struct {
		query  string
		size   int
		status pet.Status
	}{
		{"", 20, ""},
		{"?limit=10", 10, ""},
		{"?limit=1", 1, ""},
		{"?limit=57", 57, ""},
		{"?limit=100", 100, ""},
		{"?status=sold&limit=7", 7, pet.StatusSold},
		{"?status=pending&limit=19", 19, pet.StatusPending},
		{"?limit=3&status=available", 3, pet.StatusAvailable},
	}
	for _, tt := range tests {
		got := ts.walk("/v1/pets"+tt.query, tt.size)
		if !slices.Equal(got, filter(tt.status)) {
			t.Errorf("walk %q: got %d pets %v, want %d", tt.query, len(got), ids(got), len(filter(tt.status)))
		}
	}
}

func ids(ps []pet.Pet) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

func TestListNextLinkKeepsFilterAndSize(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for i := range 3 {
		ts.create(fmt.Sprintf("p%d", i), 1, pet.StatusSold)
	}
	resp := ts.get("/v1/pets?status=sold&limit=2", keyFree)
	link := resp.Header.Get("Link")
	if !strings.HasPrefix(link, "</v1/pets?limit=2&status=sold&cursor=") {
		t.Errorf("Link = %q", link)
	}
	// The last page has no link; an empty list is [] not null.
	if last := ts.get("/v1/pets?status=sold&limit=3", keyFree); last.Header.Get("Link") != "" {
		t.Errorf("exactly-full last page has Link %q", last.Header.Get("Link"))
	}
	if empty := ts.get("/v1/pets?status=pending", keyFree); string(empty.body) != "[]\n" {
		t.Errorf("empty page body %q", empty.body)
	}
}

func TestListRejectsBadQueries(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for i := range 3 {
		ts.create(fmt.Sprintf("p%d", i), 1, pet.StatusSold)
	}
	next := nextLinkPattern.FindStringSubmatch(ts.get("/v1/pets?limit=1&status=sold", keyFree).Header.Get("Link"))[1]
	soldCursor := next[strings.Index(next, "cursor=")+len("cursor="):]
	tampered := []byte(soldCursor)
	tampered[2] ^= 1
	plainCursor := encodeCursor(cursor{after: 1})
	tests := []struct {
		name, query, field string
	}{
		{"limit zero", "limit=0", "limit"},
		{"limit over 100", "limit=101", "limit"},
		{"limit negative", "limit=-1", "limit"},
		{"limit plus sign", "limit=+5", "limit"},
		{"limit fraction", "limit=2.5", "limit"},
		{"limit word", "limit=ten", "limit"},
		{"limit empty", "limit=", "limit"},
		{"limit huge", "limit=99999999999999999999", "limit"},
		{"limit repeated", "limit=5&limit=6", "limit"},
		{"status unknown", "status=lost", "status"},
		{"status empty", "status=", "status"},
		{"status repeated", "status=sold&status=sold", "status"},
		{"cursor garbage", "cursor=garbage", "cursor"},
		{"cursor empty", "cursor=", "cursor"},
		{"cursor not base64url", "cursor=a+b/c==", "cursor"},
		{"cursor tampered", "status=sold&cursor=" + string(tampered), "cursor"},
		{"cursor truncated", "status=sold&cursor=" + soldCursor[:len(soldCursor)-2], "cursor"},
		{"cursor for another filter", "status=pending&cursor=" + soldCursor, "cursor"},
		{"filtered cursor unfiltered", "cursor=" + soldCursor, "cursor"},
		{"unfiltered cursor filtered", "status=sold&cursor=" + plainCursor, "cursor"},
		{"unknown parameter", "limt=5", "limt"},
		{"offset is not supported", "offset=5", "offset"},
		{"malformed escape", "limit=%zz", "query"},
	}
	for _, tt := range tests {
		resp := ts.get("/v1/pets?"+tt.query, keyFree)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tt.name, resp.StatusCode)
			continue
		}
		if e := resp.errorBody(t); e.Code != codeInvalidRequest || !strings.HasPrefix(e.Message, tt.field+": ") {
			t.Errorf("%s: %s %q, want invalid_request naming %s", tt.name, e.Code, e.Message, tt.field)
		}
	}
	// The cursor works with the filter it was made for, whatever the limit.
	if resp := ts.get("/v1/pets?status=sold&limit=50&cursor="+soldCursor, keyFree); resp.StatusCode != http.StatusOK {
		t.Errorf("valid cursor: %d %s", resp.StatusCode, resp.body)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []cursor{{after: 1}, {after: 1<<63 - 1, status: pet.StatusPending}, {after: 300, status: pet.StatusSold}} {
		got, err := decodeCursor(encodeCursor(c))
		if err != nil || got != c {
			t.Errorf("round trip %+v: %+v, %v", c, got, err)
		}
	}
}
