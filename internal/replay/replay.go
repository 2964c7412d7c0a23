// Package replay replays the requests of the service's access log against
// proposed plans, with the limiter's own decisions (ratelimit.Simulator):
// what would those plans have allowed, limited and banned of the traffic
// the log recorded, per plan and per key.
package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/animal-store/petstore/internal/accesslog"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// Options say what to replay against.
type Options struct {
	// Plans are the proposed plans (a plans file merged over the built-in
	// plans).
	Plans *plan.Set
	// Overrides are keys' own quotas, by key id (from the keys file).
	Overrides map[string][]ratelimit.Window
	// Top is how many of each plan's most affected keys to report.
	Top int
	// Workers replay keys in parallel (0: one per CPU).
	Workers int
}

// Outcomes count decisions, and the keys that got each kind of refusal.
type Outcomes struct {
	Allowed, Limited, Banned int64
	// KeysLimited and KeysBanned count the keys with at least one request
	// limited (banned).
	KeysLimited, KeysBanned int64
}

// Refused is what was not allowed.
func (o Outcomes) Refused() int64 { return o.Limited + o.Banned }

func (o *Outcomes) add(x Outcomes) {
	o.Allowed += x.Allowed
	o.Limited += x.Limited
	o.Banned += x.Banned
	o.KeysLimited += x.KeysLimited
	o.KeysBanned += x.KeysBanned
}

func (o *Outcomes) count(out ratelimit.Outcome) {
	switch out {
	case ratelimit.Allowed:
		o.Allowed++
	case ratelimit.Limited:
		o.Limited++
	case ratelimit.Banned:
		o.Banned++
	}
}

// keyed turns per-request counts of one key into its key counts.
func (o *Outcomes) keyed() {
	o.KeysLimited, o.KeysBanned = min(o.Limited, 1), min(o.Banned, 1)
}

// Peak is the distribution of the keys' peak window use: for each key,
// the highest share of its limit (used/limit) that any of its windows
// reached just after one of its admissions under the proposed plan; 1
// means a window was used to the full. Percentiles are nearest-rank over
// the plan's keys that had an admission.
type Peak struct {
	P50, P95, P99 float64
	// Keys is how many keys they are over.
	Keys int64
}

// Key is one key's replay under one plan.
type Key struct {
	KeyID    string
	Requests int64
	// Then is what the limiter decided, as logged; Proposed what the
	// proposed plan decides (zero when the key's requests are unmatched).
	Then, Proposed Outcomes
	// Shadow counts the decisions made in shadow mode then (not enforced).
	Shadow int64
	// Peak is the key's peak window use under the proposed plan (see Peak).
	Peak float64
	// Bans counts the bans the proposed plan begins.
	Bans int64
}

// Unmatched counts requests that no proposed policy covers, and says why.
type Unmatched struct {
	Requests, Keys int64
	Reason         string
}

// Plan is the replay of the requests the log shows on one plan.
type Plan struct {
	// Name is the plan as the log names it.
	Name     string
	Requests int64
	Keys     int64
	// Then is what the limiter decided, as logged, of every request;
	// Shadow how many of them were decided under a plan in shadow mode
	// (recorded, not enforced).
	Then   Outcomes
	Shadow int64
	// Proposed is what the proposed plan decides, of the requests it
	// covers (all but Unmatched).
	Proposed  Outcomes
	Bans      int64
	Unmatched Unmatched
	Peak      Peak
	// Top are the most affected keys: by requests refused under the
	// proposal, then refused then, then key id; keys refused neither then
	// nor under the proposal are left out.
	Top []Key
}

// Report is the whole replay.
type Report struct {
	// Plans are in name order.
	Plans []Plan
	// Total sums the plans: its key counts count a key once, its Peak is
	// over the keys of every plan, its Top is empty.
	Total Plan
	// From and To are the earliest and latest request.
	From, To time.Time
}

// Run replays log against opts.Plans.
func Run(ctx context.Context, log *accesslog.Log, opts Options) (*Report, error) {
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	// Each plan's policy for keys without quotas of their own, once.
	base := make([]resolved, len(log.Plans))
	for i, name := range log.Plans {
		base[i] = resolve(opts.Plans, name, nil)
	}
	parts := make([]*tally, workers)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range parts {
		t := newTally(len(log.Plans))
		parts[w] = t
		wg.Go(func() {
			sim := ratelimit.NewSimulator(ratelimit.Options{})
			for {
				k := int(next.Add(1) - 1)
				if k >= len(log.Keys) || ctx.Err() != nil {
					return
				}
				t.replayKey(sim, log, k, base, opts)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &Report{}
	if len(log.Requests) > 0 {
		r.From, r.To = time.UnixMicro(log.From).UTC(), time.UnixMicro(log.To).UTC()
	}
	var allPeaks []float64
	for i, name := range log.Plans {
		p := Plan{Name: name, Unmatched: Unmatched{Reason: base[i].reason}}
		var keys []Key
		var peaks []float64
		for _, t := range parts {
			pt := &t.plans[i]
			p.Requests += pt.Requests
			p.Keys += pt.Keys
			p.Then.add(pt.Then)
			p.Shadow += pt.Shadow
			p.Proposed.add(pt.Proposed)
			p.Bans += pt.Bans
			p.Unmatched.Requests += pt.Unmatched.Requests
			p.Unmatched.Keys += pt.Unmatched.Keys
			if pt.Unmatched.Reason != "" {
				p.Unmatched.Reason = pt.Unmatched.Reason
			}
			keys = append(keys, t.keys[i]...)
			peaks = append(peaks, t.peaks[i]...)
		}
		if p.Unmatched.Requests == 0 {
			p.Unmatched.Reason = ""
		}
		p.Peak = percentiles(peaks)
		allPeaks = append(allPeaks, peaks...)
		p.Top = top(keys, opts.Top)
		r.Plans = append(r.Plans, p)

		tot := &r.Total
		tot.Requests += p.Requests
		tot.Then.add(p.Then)
		tot.Shadow += p.Shadow
		tot.Proposed.add(p.Proposed)
		tot.Bans += p.Bans
		tot.Unmatched.Requests += p.Unmatched.Requests
		tot.Unmatched.Keys += p.Unmatched.Keys
	}
	r.Total.Name = "all"
	r.Total.Keys = int64(len(log.Keys))
	r.Total.Peak = percentiles(allPeaks)
	// A key on two plans counts once in the total's key counts.
	r.Total.Then.KeysLimited, r.Total.Then.KeysBanned = 0, 0
	r.Total.Proposed.KeysLimited, r.Total.Proposed.KeysBanned = 0, 0
	for _, t := range parts {
		r.Total.Then.KeysLimited += t.keysThen.KeysLimited
		r.Total.Then.KeysBanned += t.keysThen.KeysBanned
		r.Total.Proposed.KeysLimited += t.keysProposed.KeysLimited
		r.Total.Proposed.KeysBanned += t.keysProposed.KeysBanned
	}
	return r, nil
}

// resolved is a key's policy under the proposed plans, or why it has none.
type resolved struct {
	policy ratelimit.Policy
	reason string // empty: the policy holds
}

// resolve returns the policy of a key on planName with overrides, as
// authentication would resolve it under the proposed plans.
func resolve(plans *plan.Set, planName string, overrides []ratelimit.Window) resolved {
	pol, err := plans.Policy(planName, plan.Overrides{Quotas: overrides})
	switch {
	case err == nil:
		return resolved{policy: pol}
	case errors.Is(err, plan.ErrUnknownPlan) && slices.Contains(plans.Removed(), plan.Normalize(planName)):
		return resolved{reason: "removed by the proposed plans"}
	case errors.Is(err, plan.ErrUnknownPlan):
		return resolved{reason: "not a proposed plan"}
	}
	if p, ok := plans.Lookup(planName); ok && p.PerKey && len(overrides) == 0 {
		return resolved{reason: "quotas agreed per key, and the keys file has none for these keys"}
	}
	return resolved{reason: err.Error()}
}

// tally is one worker's share of the report.
type tally struct {
	plans []Plan      // by log plan index; Top unused
	keys  [][]Key     // by plan: keys refused then or under the proposal
	peaks [][]float64 // by plan: each key's peak
	// Keys refused then and under the proposal, whatever their plans.
	keysThen, keysProposed Outcomes
	// Per key, reused: its state under each plan it has requests on.
	cur map[uint32]*keyTally
}

type keyTally struct {
	Key
	unmatched bool
	admitted  bool
	reason    string
}

func newTally(plans int) *tally {
	return &tally{plans: make([]Plan, plans), keys: make([][]Key, plans), peaks: make([][]float64, plans), cur: map[uint32]*keyTally{}}
}

// replayKey replays key k's requests in time order.
func (t *tally) replayKey(sim *ratelimit.Simulator, log *accesslog.Log, k int, base []resolved, opts Options) {
	id := log.Keys[k]
	overrides := opts.Overrides[id]
	var own map[uint32]resolved // the key's policies, when it has quotas of its own
	clear(t.cur)
	var kt *keyTally
	var ktPlan uint32
	for _, r := range log.KeyRequests(k) {
		if kt == nil || ktPlan != r.Plan {
			// A key is on one plan nearly always: look it up only when
			// the plan changes.
			if kt = t.cur[r.Plan]; kt == nil {
				kt = &keyTally{Key: Key{KeyID: id}}
				t.cur[r.Plan] = kt
			}
			ktPlan = r.Plan
		}
		kt.Requests++
		kt.Then.count(ratelimit.Outcome(r.Outcome))
		if r.Shadow {
			kt.Shadow++
		}
		res := base[r.Plan]
		if overrides != nil {
			if own == nil {
				own = map[uint32]resolved{}
			}
			var ok bool
			if res, ok = own[r.Plan]; !ok {
				res = resolve(opts.Plans, log.Plans[r.Plan], overrides)
				own[r.Plan] = res
			}
		}
		if res.reason != "" {
			kt.unmatched, kt.reason = true, res.reason
			continue
		}
		d, err := sim.Decide(id, res.policy, time.UnixMicro(r.At))
		if err != nil {
			// Plans the set holds are valid: this is a bug, not a line.
			panic(fmt.Sprintf("replay: key %s, plan %s: %v", id, log.Plans[r.Plan], err))
		}
		kt.Proposed.count(d.Outcome)
		if d.NewBan {
			kt.Bans++
		}
		if d.Outcome == ratelimit.Allowed {
			kt.admitted = true
			for _, w := range d.Windows {
				kt.Peak = max(kt.Peak, float64(w.Limit-w.Remaining)/float64(w.Limit))
			}
		}
	}
	sim.Forget(id)

	var all Key
	for pi, kt := range t.cur {
		kt.Then.keyed()
		kt.Proposed.keyed()
		all.Then.add(kt.Then)
		all.Proposed.add(kt.Proposed)
		p := &t.plans[pi]
		p.Requests += kt.Requests
		p.Keys++
		p.Then.add(kt.Then)
		p.Shadow += kt.Shadow
		p.Bans += kt.Bans
		if kt.unmatched {
			// A key's policy on one plan is resolved once: all of its
			// requests on the plan are unmatched, or none.
			p.Unmatched.Requests += kt.Requests
			p.Unmatched.Keys++
			p.Unmatched.Reason = kt.reason
		}
		p.Proposed.add(kt.Proposed)
		if kt.admitted {
			t.peaks[pi] = append(t.peaks[pi], kt.Peak)
		}
		if kt.Then.Refused() > 0 || kt.Proposed.Refused() > 0 {
			t.keys[pi] = append(t.keys[pi], kt.Key)
		}
	}
	t.keysThen.KeysLimited += min(all.Then.KeysLimited, 1)
	t.keysThen.KeysBanned += min(all.Then.KeysBanned, 1)
	t.keysProposed.KeysLimited += min(all.Proposed.KeysLimited, 1)
	t.keysProposed.KeysBanned += min(all.Proposed.KeysBanned, 1)
}

// percentiles returns the nearest-rank percentiles of peaks.
func percentiles(peaks []float64) Peak {
	if len(peaks) == 0 {
		return Peak{}
	}
	sort.Float64s(peaks)
	rank := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(peaks)))) - 1
		return peaks[min(max(i, 0), len(peaks)-1)]
	}
	return Peak{P50: rank(0.50), P95: rank(0.95), P99: rank(0.99), Keys: int64(len(peaks))}
}

// top returns the n most affected keys.
func top(keys []Key, n int) []Key {
	slices.SortFunc(keys, func(a, b Key) int {
		switch {
		case a.Proposed.Refused() != b.Proposed.Refused():
			return cmpDesc(a.Proposed.Refused(), b.Proposed.Refused())
		case a.Then.Refused() != b.Then.Refused():
			return cmpDesc(a.Then.Refused(), b.Then.Refused())
		}
		return strings.Compare(a.KeyID, b.KeyID)
	})
	return slices.Clip(keys[:min(n, len(keys))])
}

func cmpDesc(a, b int64) int {
	if a > b {
		return -1
	}
	return 1
}
