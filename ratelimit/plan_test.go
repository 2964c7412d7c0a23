package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// genCachePolicies draws n policies for the plan cache: whole new ones,
// and near twins of earlier ones that differ in a single field (a limit,
// a period, one number of a ban rule, the shadow flag, a candidate
// window), which a hash or a comparison that skipped that field would
// confuse.
func genCachePolicies(rng *rand.Rand, n int) []Policy {
	var out []Policy
	for len(out) < n {
		if len(out) == 0 || rng.IntN(3) == 0 {
			p := genPolicies(rng, MaxPeriod)[0]
			p.Name = fmt.Sprint("plan-", rng.IntN(8))
			out = append(out, p)
			continue
		}
		p := out[rng.IntN(len(out))].clone()
		switch rng.IntN(9) {
		case 0:
			p.Windows[rng.IntN(len(p.Windows))].Limit = genLimit(rng)
		case 1:
			w := &p.Windows[rng.IntN(len(p.Windows))]
			if q := genPeriod(rng, MaxPeriod); !slices.ContainsFunc(p.Windows, func(w Window) bool { return w.Period == q }) {
				w.Period = q
			}
		case 2:
			p.Ban = BanPolicy{Threshold: 1 + rng.Int64N(5), StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Memory: time.Hour}
		case 3:
			if p.Ban.Enabled() {
				p.Ban.Multiplier += 0.5
			}
		case 4:
			if p.Ban.Enabled() {
				p.Ban.Max = time.Duration(1+rng.IntN(100)) * time.Hour
			}
		case 5:
			p.Shadow = !p.Shadow
		case 6:
			p.Candidate = genCandidates(rng, MaxPeriod)
		case 7:
			if len(p.Candidate) > 0 {
				p.CandidateBan = BanPolicy{Threshold: 2, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 1, Memory: time.Hour}
			}
		case 8:
			p.Name = fmt.Sprint("plan-", rng.IntN(8))
		}
		if p.Validate() == nil {
			out = append(out, p)
		}
	}
	return out
}

// newCacheCase returns an empty plan cache with the default options and
// n policies drawn for it from the invariant tests' seed.
func newCacheCase(t *testing.T, stream uint64, n int) (*planCache, *Options, *metrics, []Policy) {
	rng := invariantRNG(t, stream)
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newPlanCache()
	return &c, &Options{Buckets: DefaultBuckets, StrikeBuckets: DefaultStrikeBuckets}, met, genCachePolicies(rng, n)
}

// TestPlanCacheReturnsThePolicysPlan checks the plan cache's promises over
// generated policies, more of them than the cache holds (so it starts over
// several times) and than its front has slots (so policies share slots):
// get returns a plan compiled from the very policy asked for; while the
// cache is not starting over, one policy always gets the same plan; and
// every plan returned is among those recent reports, which the registry
// announces.
func TestPlanCacheReturnsThePolicysPlan(t *testing.T) {
	t.Parallel()
	c, opts, met, policies := newCacheCase(t, 31, maxPlans+maxPlans/2)
	rng := invariantRNG(t, 33)
	seen := map[string]*plan{}
	now := time.Now()
	for i := range 6 * maxPlans {
		// Mostly the policies drawn recently, as a fleet's traffic is.
		j := rng.IntN(len(policies))
		if rng.IntN(4) != 0 {
			j = min(len(policies)-1, i%len(policies)+rng.IntN(64))
		}
		p := policies[j]
		before := c.n
		pl, err := c.get(&p, opts, met)
		if err != nil {
			t.Fatalf("get %+v: %v", p, err)
		}
		pl.touch(now)
		if c.n < before {
			clear(seen) // the cache started over
		}
		if !samePolicy(&pl.given, &p) || pl.name != p.Name || len(pl.windows) != len(p.Windows) || pl.policy.Shadow != p.Shadow {
			t.Fatalf("get %+v returned the plan of %+v", p, pl.given)
		}
		for _, w := range p.Windows {
			if !planHasWindow(pl, w) {
				t.Fatalf("get %+v: the plan lacks window %s", p, w)
			}
		}
		key := policyKey(p)
		if prev, ok := seen[key]; ok && prev != pl {
			t.Fatalf("get %+v: a second plan for one policy while the cache holds the first (%+v)", p, prev.given)
		}
		seen[key] = pl
		if i%97 == 0 {
			if !slices.Contains(c.recent(now), pl) {
				t.Fatalf("get %+v returned a plan recent does not report", p)
			}
		}
	}
}

// policyKey spells p out exactly (a Window's String rounds its period).
func policyKey(p Policy) string {
	var ws, cs []int64
	for _, w := range p.Windows {
		ws = append(ws, w.Limit, int64(w.Period))
	}
	for _, w := range p.Candidate {
		cs = append(cs, w.Limit, int64(w.Period))
	}
	return fmt.Sprintf("%q %v %#v %v %#v %v", p.Name, ws, p.Ban, cs, p.CandidateBan, p.Shadow)
}

func planHasWindow(pl *plan, w Window) bool {
	for _, r := range pl.windows {
		if r.limit == w.Limit && r.period == w.Period.Microseconds() {
			return true
		}
	}
	return false
}

// TestPlanCacheConcurrent runs gets from several goroutines while the
// cache starts over (run with -race): each still returns its own policy's
// plan.
func TestPlanCacheConcurrent(t *testing.T) {
	t.Parallel()
	c, opts, met, policies := newCacheCase(t, 32, maxPlans+512)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 3 * len(policies) / 2 {
				p := policies[(i*7+g*len(policies)/4)%len(policies)]
				pl, err := c.get(&p, opts, met)
				if err != nil {
					t.Errorf("get %+v: %v", p, err)
					return
				}
				if !samePolicy(&pl.given, &p) {
					t.Errorf("get %+v returned the plan of %+v", p, pl.given)
					return
				}
			}
		})
	}
	wg.Wait()
}
