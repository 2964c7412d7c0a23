package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// The promises of candidate windows, checked over generated policies and
// traffic, by Redis time, on miniredis, a real Redis and in process:
//
//   - they never change enforcement: the same requests, decided under the
//     policy with and without its candidates, get the same outcomes,
//     Retry-After and enforced windows;
//   - they are strict like enforced windows: the requests a candidate
//     window would have admitted (this request and the rejections
//     answered locally before it, which reach it as extras) never number
//     more than its limit in any interval of its period.

// genCandidates draws 1-3 candidate windows.
func genCandidates(rng *rand.Rand, maxPeriod time.Duration) []Window {
	var ws []Window
	for range 1 + rng.IntN(3) {
		p := genPeriod(rng, maxPeriod)
		if !slices.ContainsFunc(ws, func(w Window) bool { return w.Period == p }) {
			// Small limits half the time, so that they bind.
			l := genLimit(rng)
			if rng.IntN(2) == 0 {
				l = 1 + rng.Int64N(20)
			}
			ws = append(ws, Window{Limit: l, Period: p})
		}
	}
	return ws
}

// candidateCase decides the same traffic under a policy with candidates
// (key "c") and without (key "e") through decide, and checks both promises.
type candidateCase struct {
	t        *testing.T
	with     *plan
	without  *plan
	adm      []struct{ at, k int64 } // what the candidates admitted
	what     string
	limited  int
	admitted int
}

func (c *candidateCase) check(vc, ve verdict) {
	t := c.t
	t.Helper()
	if vc.outcome != ve.outcome || vc.retry != ve.retry || !slices.Equal(vc.win, ve.win) || vc.granted != ve.granted {
		t.Fatalf("%s\nwith candidates %+v\nwithout          %+v", c.what, vc, ve)
	}
	if vc.cAdm > 0 {
		c.adm = append(c.adm, struct{ at, k int64 }{vc.now, vc.cAdm})
	}
	c.admitted += int(vc.cAdm)
	c.limited += int(vc.cLim)
	for _, r := range c.with.candidates {
		var n int64
		for _, a := range c.adm {
			if a.at > vc.now-r.period && a.at <= vc.now {
				n += a.k
			}
		}
		if n > r.limit {
			t.Fatalf("%s\ncandidate %d/%dµs admitted %d within one period ending at %d", c.what, r.limit, r.period, n, vc.now)
		}
	}
}

// candidateTraffic draws the next gap and the extras (rejections answered
// locally) the request carries.
func candidateTraffic(rng *rand.Rand, pl *plan) (int64, int64) {
	rs := append(slices.Clone(pl.windows), pl.candidates...)
	w := rs[rng.IntN(len(rs))]
	var dt int64
	switch rng.IntN(6) {
	case 0, 1:
	case 2:
		dt = 1 + rng.Int64N(w.gran)
	case 3:
		dt = w.period + rng.Int64N(3) - 1
	default:
		dt = rng.Int64N(w.period / 3)
	}
	var extra int64
	if rng.IntN(5) == 0 {
		extra = 1 + rng.Int64N(5)
	}
	return dt, extra
}

func newCandidateCase(t *testing.T, rng *rand.Rand, maxPeriod time.Duration) *candidateCase {
	p := genPolicies(rng, maxPeriod)[0]
	p.Candidate = genCandidates(rng, maxPeriod)
	without := p
	without.Candidate = nil
	return &candidateCase{t: t, with: compile(p, DefaultBuckets, DefaultStrikeBuckets), without: compile(without, DefaultBuckets, DefaultStrikeBuckets),
		what: fmt.Sprintf("%v ban %+v, candidates %v", p.Windows, p.Ban, p.Candidate)}
}

func runScriptCandidates(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, maxPeriod time.Duration) *candidateCase {
	c := newCandidateCase(t, rng, maxPeriod)
	prefix := randomPrefix(t)
	eval := func(pl *plan, key string, in input) verdict {
		reply, err := evalDecision(context.Background(), rdb, stateKeys(prefix, key, pl), pl, in)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		v, err := decode(pl, reply)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
	for range 80 {
		dt, extra := candidateTraffic(rng, c.with)
		now += dt
		if mini != nil {
			mini.SetTime(time.UnixMicro(now))
		} else {
			sleepShort(nil, dt)
		}
		in := input{lease: noLease, extra: extra}
		vc := eval(c.with, "c", in)
		ve := eval(c.without, "e", in)
		if mini == nil {
			// Real time moves between the two calls: the enforced
			// outcomes may differ at a window's edge; strictness holds.
			ve = vc
		}
		c.check(vc, ve)
		if rng.IntN(10) == 0 {
			// A peek changes nothing.
			p := eval(c.with, "c", input{peek: true, lease: noLease})
			if p.cAdm != 0 || p.cLim != 0 || len(p.cwin) != len(c.with.candidates) {
				t.Fatalf("%s\npeek %+v", c.what, p)
			}
		}
	}
	return c
}

func TestCandidateWindowsMiniredis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 21)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	admitted, limited := 0, 0
	for i := range max(*invariantCases/2, 10) {
		t.Run(fmt.Sprint("case", i), func(t *testing.T) {
			c := runScriptCandidates(t, rng, rdb, m, MaxPeriod)
			admitted, limited = admitted+c.admitted, limited+c.limited
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("candidates would have admitted %d and limited %d", admitted, limited)
	if limited == 0 || admitted == 0 {
		t.Fatal("the generated traffic never reached a candidate's limit")
	}
}

func TestCandidateWindowsRedis(t *testing.T) {
	t.Parallel()
	onRealRedis(t, 22, func(t *testing.T, rdb *redis.Client, rng *rand.Rand, maxPeriod time.Duration) {
		runScriptCandidates(t, rng, rdb, nil, maxPeriod)
	})
}

func TestCandidateWindowsInProcess(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 24)
	for range *invariantCases {
		c := newCandidateCase(t, rng, MaxPeriod)
		sc, se := &keyState{}, &keyState{}
		now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
		for range 80 {
			dt, extra := candidateTraffic(rng, c.with)
			now += dt
			in := input{lease: noLease, extra: extra}
			c.check(sc.decide(c.with, now, in), se.decide(c.without, now, in))
		}
	}
}

// TestCandidateThroughTheLimiter: a candidate tighter than the enforced
// window is measured and never enforced, through Allow and Usage, with
// its metric, on miniredis, a real Redis and in process; its keys get no
// leases; and its record expires with its period once it is dropped.
func TestCandidateThroughTheLimiter(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "cand", Windows: []Window{{Limit: 5, Period: time.Minute}}, Candidate: []Window{{Limit: 2, Period: time.Minute}}}
	onEveryStore(t, Options{MaxLease: 64}, func(t *testing.T, l *Limiter, reg *prometheus.Registry) {
		ctx := context.Background()
		for i := range 6 {
			d, err := l.Allow(ctx, "k", p)
			if err != nil {
				t.Fatal(err)
			}
			wantOut, wantCand := Allowed, Allowed
			if i >= 5 {
				wantOut = Limited
			}
			if i >= 2 {
				wantCand = Limited
			}
			if d.Outcome != wantOut || d.CandidateOutcome != wantCand || d.Leased || len(d.Candidate) != 1 {
				t.Fatalf("request %d: %+v; want %s, candidate %s, not leased", i+1, d, wantOut, wantCand)
			}
		}
		u, err := l.Usage(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if u.Windows[0].Used != 5 || len(u.Candidate) != 1 || u.Candidate[0].Used != 2 || u.Candidate[0].Remaining != 0 {
			t.Fatalf("usage %+v: want 5 used, candidate 2 of 2", u)
		}
		for o, want := range map[string]float64{"allowed": 2, "limited": 4} {
			if got := testenv.CounterSum(t, reg, "petstore_ratelimit_candidate_decisions_total", map[string]string{"plan": "cand", "outcome": o}); got != want {
				t.Errorf("candidate_decisions_total{outcome=%q} = %v, want %v", o, got, want)
			}
		}
		if l.rdb == nil {
			return
		}
		// Dropped from the plan, the candidate's record expires with its
		// period: by the end of its head's epoch (a quarter of a period)
		// and a period and two buckets.
		cpl := compile(p, DefaultBuckets, DefaultStrikeBuckets)
		key, r := stateKeys(l.opts.Prefix, "k", cpl)[2], cpl.candidates[0]
		most := time.Duration(r.n/4*r.gran+r.ttlMS*1000) * time.Microsecond
		if ttl, err := l.rdb.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > most {
			t.Fatalf("candidate record %s TTL %s %v", key, ttl, err)
		}
	})
}

// A candidate is what enforcement would have been: with no locally
// answered rejections in between, the requests of a key under a policy
// with candidate windows and a candidate ban policy get, from the
// candidate, exactly the outcomes, window counts, strikes and bans a key
// under a policy enforcing those windows and that ban policy (on the
// candidate's coarser geometry) gets for the same requests at the same
// times; extras (the rejections a replica answered locally before a
// request) reach the candidate as requests in turn before it, so they
// equal as many decisions of the enforcing key. Checked over generated
// policies and traffic, by Redis time (both keys decided in one batch), on
// miniredis, a real Redis and in process.

// candidateBanCase is one generated case: with, a policy with candidate
// windows and a candidate ban policy; enforcing, a policy enforcing them.
type candidateBanCase struct {
	t               *testing.T
	with, enforcing *plan
	what            string
	bans, banned    int
}

func newCandidateBanCase(t *testing.T, rng *rand.Rand, maxPeriod time.Duration) *candidateBanCase {
	p := genPolicies(rng, maxPeriod)[0]
	p.Candidate = genCandidates(rng, maxPeriod)
	sw := genPeriod(rng, min(maxPeriod, time.Hour))
	p.CandidateBan = BanPolicy{Threshold: 1 + rng.Int64N(4), StrikeWindow: sw, Base: time.Duration(1+rng.Int64N(int64(2*sw))) + time.Microsecond,
		Multiplier: 1 + rng.Float64()*2, Memory: 3 * sw}
	if rng.IntN(3) == 0 {
		p.CandidateBan.Max = p.CandidateBan.Base * 2
	}
	q := Policy{Name: "enforcing", Windows: p.Candidate, Ban: p.CandidateBan}
	return &candidateBanCase{t: t, with: compile(p, DefaultBuckets, DefaultStrikeBuckets), enforcing: compile(q, CandidateBuckets, DefaultStrikeBuckets),
		what: fmt.Sprintf("%v ban %+v, candidates %v, candidate ban %+v", p.Windows, p.Ban, p.Candidate, p.CandidateBan)}
}

// decideAt decides, at one instant, key "c" under c.with with extra
// rejections answered before it, and the extra+1 requests they stand for
// for key "x" under c.enforcing, and checks that they agree.
func (c *candidateBanCase) check(vc verdict, vx []verdict, extra int64) {
	t := c.t
	t.Helper()
	var adm, lim, ban int64
	newBan := false
	for _, v := range vx {
		switch v.outcome {
		case Allowed:
			adm++
		case Limited:
			lim++
		case Banned:
			ban++
		}
		newBan = newBan || v.newBan
	}
	last := vx[len(vx)-1]
	if vc.cAdm != adm || vc.cLim != lim || vc.cBan != ban || vc.cOutcome != last.outcome || vc.cNewBan != newBan ||
		vc.cStrikes != last.strikes || vc.cBanUntil != last.banUntil || vc.cOffences != last.offences {
		t.Fatalf("%s\nextra %d: candidate %v (admitted %d, limited %d, banned %d, new ban %v, strikes %d, ban until %d, offences %d)\nenforcing: %v (%d, %d, %d, %v, %d, %d, %d)",
			c.what, extra, vc.cOutcome, vc.cAdm, vc.cLim, vc.cBan, vc.cNewBan, vc.cStrikes, vc.cBanUntil, vc.cOffences,
			last.outcome, adm, lim, ban, newBan, last.strikes, last.banUntil, last.offences)
	}
	for i := range vc.cwin {
		if vc.cwin[i] != last.win[i] {
			t.Fatalf("%s\nextra %d: candidate window %d %+v, enforced %+v", c.what, extra, i, vc.cwin[i], last.win[i])
		}
	}
	if newBan {
		c.bans++
	}
	c.banned += int(ban)
}

// run drives 100 requests through decide, which decides the requests it
// is given in order at one instant and returns their verdicts.
func (c *candidateBanCase) run(rng *rand.Rand, decide func(dt int64, reqs []candidateReq) []verdict) {
	for range 100 {
		dt, _ := candidateTraffic(rng, c.with)
		var extra int64
		if rng.IntN(4) == 0 {
			extra = 1 + rng.Int64N(6)
		}
		reqs := []candidateReq{{"c", c.with, input{lease: noLease, extra: extra}}}
		for range extra + 1 {
			reqs = append(reqs, candidateReq{"x", c.enforcing, input{lease: noLease}})
		}
		vs := decide(dt, reqs)
		c.check(vs[0], vs[1:], extra)
	}
}

// candidateReq is one request of candidateBanCase.run.
type candidateReq struct {
	key string
	pl  *plan
	in  input
}

func TestCandidateIsEnforcementMeasured(t *testing.T) {
	t.Parallel()
	// The subtests run in parallel, so the tally is shared under a lock.
	var mu sync.Mutex
	bans, banned := 0, 0
	count := func(c *candidateBanCase) {
		mu.Lock()
		defer mu.Unlock()
		bans, banned = bans+c.bans, banned+c.banned
	}
	script := func(t *testing.T, rdb *redis.Client, mini *miniredis.Miniredis, rng *rand.Rand, maxPeriod time.Duration) *candidateBanCase {
		c := newCandidateBanCase(t, rng, maxPeriod)
		c.t = t
		prefix := randomPrefix(t)
		now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
		c.run(rng, func(dt int64, reqs []candidateReq) []verdict {
			now += dt
			if mini != nil {
				mini.SetTime(time.UnixMicro(now))
			} else {
				sleepShort(nil, dt)
			}
			ds := make([]decision, len(reqs))
			for i, r := range reqs {
				ds[i] = decision{keys: stateKeys(prefix, r.key, r.pl), pl: r.pl, nums: scriptNums(r.pl, r.in)}
			}
			replies, err := evalBatch(context.Background(), rdb, ds)
			if err != nil {
				t.Fatalf("%s: %v", c.what, err)
			}
			vs := make([]verdict, len(reqs))
			for i, r := range reqs {
				if vs[i], err = decode(r.pl, replies[i]); err != nil {
					t.Fatal(err)
				}
			}
			return vs
		})
		return c
	}
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		rng := invariantRNG(t, 25)
		m := miniredis.RunT(t)
		m.ClockTTL(true)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: time.Minute})
		t.Cleanup(func() { _ = rdb.Close() })
		for i := range max(*invariantCases/2, 10) {
			t.Run(fmt.Sprint("case", i), func(t *testing.T) { count(script(t, rdb, m, rng, MaxPeriod)) })
			if t.Failed() {
				return
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		onRealRedis(t, 26, func(t *testing.T, rdb *redis.Client, rng *rand.Rand, maxPeriod time.Duration) {
			script(t, rdb, nil, rng, maxPeriod)
		})
	})
	t.Run("in process", func(t *testing.T) {
		t.Parallel()
		rng := invariantRNG(t, 27)
		for range *invariantCases {
			c := newCandidateBanCase(t, rng, MaxPeriod)
			states := map[string]*keyState{"c": {}, "x": {}}
			now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
			c.run(rng, func(dt int64, reqs []candidateReq) []verdict {
				now += dt
				vs := make([]verdict, len(reqs))
				for i, r := range reqs {
					vs[i] = states[r.key].decide(r.pl, now, r.in)
				}
				return vs
			})
			count(c)
		}
	})
	t.Cleanup(func() {
		t.Logf("candidate bans begun %d, requests refused by them %d", bans, banned)
		if !t.Failed() && (bans == 0 || banned == 0) {
			t.Error("the generated traffic never had a candidate ban")
		}
	})
}

// TestCandidateBanThroughTheLimiter: a candidate ban policy bans, in
// measurement only, a key its candidate windows keep limiting: through
// Allow (the candidate outcome), Usage, the metrics and Unban, on
// miniredis, a real Redis and in process; enforcement is untouched.
func TestCandidateBanThroughTheLimiter(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "cban", Windows: []Window{{Limit: 5, Period: time.Minute}}, Candidate: []Window{{Limit: 2, Period: time.Minute}},
		CandidateBan: BanPolicy{Threshold: 1, StrikeWindow: time.Minute, Base: time.Minute, Multiplier: 2, Memory: time.Hour}}
	onEveryStore(t, Options{MaxLease: 64}, func(t *testing.T, l *Limiter, reg *prometheus.Registry) {
		ctx := context.Background()
		// Candidate: two admitted, a strike, a second strike over the
		// threshold of one (banned), then banned; enforced: five of six.
		want := []Outcome{Allowed, Allowed, Limited, Banned, Banned, Banned}
		for i, wc := range want {
			d, err := l.Allow(ctx, "k", p)
			if err != nil {
				t.Fatal(err)
			}
			wo := Allowed
			if i >= 5 {
				wo = Limited
			}
			if d.Outcome != wo || d.CandidateOutcome != wc {
				t.Fatalf("request %d: %s, candidate %s; want %s, candidate %s", i+1, d.Outcome, d.CandidateOutcome, wo, wc)
			}
		}
		u, err := l.Usage(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if u.CandidateBannedUntil.IsZero() || u.CandidateOffences != 1 || u.CandidateStrikes != 0 || !u.BannedUntil.IsZero() || u.Candidate[0].Used != 2 {
			t.Fatalf("usage %+v: want a candidate ban (1 offence, strikes started over), no enforced ban, candidate 2 used", u)
		}
		for o, want := range map[string]float64{"allowed": 2, "limited": 1, "banned": 3} {
			if got := testenv.CounterSum(t, reg, "petstore_ratelimit_candidate_decisions_total", map[string]string{"plan": "cban", "outcome": o}); got != want {
				t.Errorf("candidate_decisions_total{outcome=%q} = %v, want %v", o, got, want)
			}
		}
		if got := testenv.CounterSum(t, reg, "petstore_ratelimit_candidate_bans_total", map[string]string{"plan": "cban"}); got != 1 {
			t.Errorf("candidate_bans_total = %v, want 1", got)
		}
		if got := testenv.CounterSum(t, reg, "petstore_ratelimit_bans_total", map[string]string{"plan": "cban"}); got != 0 {
			t.Errorf("bans_total = %v, want 0: the candidate bans nothing", got)
		}
		// Unban lifts the candidate's ban too.
		if err := l.Unban(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if u, err := l.Usage(ctx, "k", p); err != nil || !u.CandidateBannedUntil.IsZero() || u.CandidateOffences != 0 {
			t.Fatalf("after Unban: %+v %v", u, err)
		}
	})
}
