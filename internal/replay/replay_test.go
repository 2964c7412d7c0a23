package replay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/accesslog"
	"github.com/animal-store/petstore/internal/plan"
)

func TestPercentilesNearestRank(t *testing.T) {
	t.Parallel()
	var hundred []float64
	for i := 100; i >= 1; i-- {
		hundred = append(hundred, float64(i)/100)
	}
	for _, tt := range []struct {
		peaks []float64
		want  Peak
	}{
		{nil, Peak{}},
		{[]float64{0.3}, Peak{P50: 0.3, P95: 0.3, P99: 0.3, Keys: 1}},
		{[]float64{1, 0.2}, Peak{P50: 0.2, P95: 1, P99: 1, Keys: 2}},
		{hundred, Peak{P50: 0.5, P95: 0.95, P99: 0.99, Keys: 100}},
	} {
		if got := percentiles(tt.peaks); got != tt.want {
			t.Errorf("%v: %+v, want %+v", tt.peaks, got, tt.want)
		}
	}
}

func logOf(t *testing.T, lines []string) *accesslog.Log {
	t.Helper()
	b := []byte(strings.Join(lines, "\n"))
	l, err := accesslog.Read(context.Background(), []accesslog.Input{{Name: "x", Open: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func line(at time.Time, key, plan, outcome string) string {
	return fmt.Sprintf(`{"time":%q,"msg":"request","duration_ms":0,"key_id":%q,"plan":%q,"ratelimit":%q}`, at.Format(time.RFC3339Nano), key, plan, outcome)
}

// TestRunTopKeysAndTotals: the most affected keys come by refusals under
// the proposal, then refusals then, then id, untouched keys left out; a
// key on two plans is one key in the totals, and its state (its window of
// the same period) carries over from one plan to the other, as the
// limiter's does.
func TestRunTopKeysAndTotals(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	var lines []string
	burst := func(key, plan string, from time.Duration, n int, outcome string) {
		for i := range n {
			lines = append(lines, line(t0.Add(from+time.Duration(i)*time.Millisecond), key, plan, outcome))
		}
	}
	burst("key_c", "small", 0, 4, "allowed")         // 1 refused under 3/1m
	burst("key_b", "small", 0, 4, "limited")         // 1 refused, refused then too
	burst("key_a", "small", 0, 5, "allowed")         // 2 refused
	burst("key_d", "small", 0, 3, "allowed")         // none
	burst("key_e", "small", 0, 3, "limited")         // none now, refused then
	burst("key_z", "small", 0, 3, "allowed")         // on two plans: 3 of small's 3/1m,
	burst("key_z", "big", time.Second, 2, "allowed") // then 2 more under big's 4/1m: the 2nd refused
	set, err := plan.Parse([]byte("plans:\n  small: {quotas: [{limit: 3, period: 1m}], ban: off}\n  big: {quotas: [{limit: 4, period: 1m}], ban: off}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), logOf(t, lines), Options{Plans: set, Top: 10, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	var small, big Plan
	for _, p := range r.Plans {
		switch p.Name {
		case "small":
			small = p
		case "big":
			big = p
		}
	}
	var order []string
	for _, k := range small.Top {
		order = append(order, fmt.Sprintf("%s:%d/%d", k.KeyID, k.Proposed.Refused(), k.Then.Refused()))
	}
	if want := []string{"key_a:2/0", "key_b:1/4", "key_c:1/0", "key_e:0/3"}; !reflect.DeepEqual(order, want) {
		t.Errorf("top keys %v, want %v", order, want)
	}
	if big.Proposed != (Outcomes{Allowed: 1, Limited: 1, KeysLimited: 1}) {
		t.Errorf("big: %+v", big.Proposed)
	}
	if r.Total.Keys != 6 || r.Total.Proposed.KeysLimited != 4 || r.Total.Then.KeysLimited != 2 || r.Total.Requests != int64(len(lines)) {
		t.Errorf("total %+v", r.Total)
	}
	if small.Peak != (Peak{P50: 1, P95: 1, P99: 1, Keys: 6}) {
		t.Errorf("small's peak %+v", small.Peak)
	}
	// A small limit: only the most affected.
	r, _ = Run(context.Background(), logOf(t, lines), Options{Plans: set, Top: 1})
	if len(r.Plans[1].Top) != 1 || r.Plans[1].Top[0].KeyID != "key_a" {
		t.Errorf("top 1: %+v", r.Plans[1].Top)
	}
}
