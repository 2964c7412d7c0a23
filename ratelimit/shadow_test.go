package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/testenv"
)

// shadowPolicy is a small plan with bans, in shadow mode.
func shadowPolicy() Policy {
	return Policy{Name: "trial", Shadow: true, Windows: []Window{{Limit: 3, Period: time.Minute}},
		Ban: BanPolicy{Threshold: 2, StrikeWindow: time.Minute, Base: 5 * time.Minute, Memory: time.Hour}}
}

// checkShadow sends 8 requests under shadowPolicy through allow and checks
// that every decision says what enforcement would have decided (3
// admitted, 2 limited, then banned), is marked Shadow, and that the
// refusals it would have made were not counted in the window: usage shows
// the 3 admissions, as under enforcement.
func checkShadow(t *testing.T, l *Limiter, reg *prometheus.Registry) {
	t.Helper()
	ctx := context.Background()
	p := shadowPolicy()
	want := []Outcome{Allowed, Allowed, Allowed, Limited, Limited, Banned, Banned, Banned}
	for i, o := range want {
		d, err := l.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != o || !d.Shadow {
			t.Fatalf("request %d: %+v, want outcome %s marked shadow", i+1, d, o)
		}
	}
	u, err := l.Usage(ctx, "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if u.Windows[0].Used != 3 || u.BannedUntil.IsZero() {
		t.Fatalf("usage %+v: want the 3 admissions counted and the ban recorded", u)
	}
	// The same plan enforced shares the records: the key is banned.
	enforced := p
	enforced.Shadow = false
	if d, _ := l.Allow(ctx, "k", enforced); d.Outcome != Banned || d.Shadow {
		t.Fatalf("enforced after shadow: %+v, want banned, not shadow", d)
	}
	for _, c := range []struct {
		name   string
		labels prometheus.Labels
		want   float64
	}{
		{"petstore_ratelimit_shadow_decisions_total", prometheus.Labels{"plan": "trial", "outcome": "allowed"}, 3},
		{"petstore_ratelimit_shadow_decisions_total", prometheus.Labels{"plan": "trial", "outcome": "limited"}, 2},
		{"petstore_ratelimit_shadow_decisions_total", prometheus.Labels{"plan": "trial", "outcome": "banned"}, 3},
		{"petstore_ratelimit_shadow_bans_total", prometheus.Labels{"plan": "trial"}, 1},
		// Enforcement's own figures hold only the one enforced decision.
		{"petstore_ratelimit_decisions_total", prometheus.Labels{"plan": "trial"}, 1},
		{"petstore_ratelimit_bans_total", prometheus.Labels{"plan": "trial"}, 0},
	} {
		if got := testenv.CounterSum(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestShadowModeRecordsWithoutEnforcing: a shadow policy is decided and
// recorded exactly as an enforced one, on miniredis, on a real Redis and
// in process, and only marked.
func TestShadowModeRecordsWithoutEnforcing(t *testing.T) {
	t.Parallel()
	onEveryStore(t, Options{}, checkShadow)
}
