package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// The promise of a plan edit that changes periods: the windows of the
// new plan start from the counts the key's records of other periods hold
// (registry.go), so no key gets a fresh quota. For each window (L, W) of
// the new plan, decided from the moment S of the edit on:
//
//   - a period the old plan also had keeps its record: every interval of
//     length W ending at an admission under the new plan holds at most L
//     admissions, those of the old plan included;
//   - a new period takes its past from the key's best other record, of
//     period Ws, at the key's first decision under the new plan, at T:
//     every such interval holds at most L admissions plus those made
//     before T-Ws, which no record of period Ws still held then (none at
//     all when Ws >= W).
//
// Checked by Redis time over generated plans and traffic, on miniredis
// and on a real Redis, and in process (state.go).

// genPeriodEdit draws an old plan and an edit of it that changes at least
// one window's period (and maybe its limit), maybe adds one, maybe drops
// one.
func genPeriodEdit(rng *rand.Rand, maxPeriod time.Duration) (Policy, Policy) {
	old := genPolicies(rng, maxPeriod)[0]
	old.Ban = BanPolicy{} // bans would hide the windows' refusals
	ws := slices.Clone(old.Windows)
	has := func(p time.Duration) bool {
		return slices.ContainsFunc(ws, func(w Window) bool { return w.Period == p }) ||
			slices.ContainsFunc(old.Windows, func(w Window) bool { return w.Period == p })
	}
	newPeriod := func() time.Duration {
		for {
			if p := genPeriod(rng, maxPeriod); !has(p) {
				return p
			}
		}
	}
	k := rng.IntN(len(ws))
	ws[k].Period = newPeriod()
	if rng.IntN(2) == 0 {
		ws[k].Limit = genLimit(rng)
	}
	if len(ws) < 4 && rng.IntN(3) == 0 {
		ws = append(ws, Window{Limit: genLimit(rng), Period: newPeriod()})
	}
	if len(ws) > 1 && rng.IntN(4) == 0 {
		j := rng.IntN(len(ws))
		ws = append(ws[:j], ws[j+1:]...)
	}
	return old, Policy{Name: old.Name, Windows: ws}
}

// knownSince returns, for window r of the new plan, the time from which
// the key's records at s (its first decision under the new plan) hold
// every admission: s less the period of the record r starts from (its own
// period if the old plan had it).
func knownSince(r *ring, old *plan, s int64) int64 {
	var best int64 = -1
	for _, o := range old.windows {
		if o.period == r.period {
			return s - r.period
		}
		if best < 0 || betterSource(r, o.period, best) {
			best = o.period
		}
	}
	return s - best
}

// periodChecker holds admissions (one per decision, by decision time) to
// the promise above.
type periodChecker struct {
	t        *testing.T
	old, new *plan
	edit     int64 // T: the first decision under the new plan; 0 before it
	adm      []int64
	what     string
}

// decided notes a decision at x; admitted, one at x.
func (c *periodChecker) decided(x int64, underNew bool) {
	if underNew && c.edit == 0 {
		c.edit = x
	}
}

func (c *periodChecker) admitted(x int64, underNew bool) {
	c.adm = append(c.adm, x)
	if !underNew {
		return
	}
	for i := range c.new.windows {
		r := &c.new.windows[i]
		known := knownSince(r, c.old, c.edit)
		var in, unknown int64
		for _, a := range c.adm {
			if a > x-r.period && a <= x {
				in++
				if a <= known {
					unknown++
				}
			}
		}
		if in > r.limit+unknown {
			for _, a := range c.adm {
				if a > x-r.period && a <= x {
					c.t.Logf("admission at %d (%d after the edit)", a, a-c.edit)
				}
			}
			c.t.Fatalf("%s\nafter the edit at %d: %d admissions within %s ending at %d, limit %d (%d of them older than the records knew)",
				c.what, c.edit, in, time.Duration(r.period)*time.Microsecond, x, r.limit, unknown)
		}
	}
}

// periodTraffic draws the time to the next request and a burst size, for
// window-sized gaps under plan pl.
func periodTraffic(rng *rand.Rand, pl *plan) (int64, int) {
	w := pl.windows[rng.IntN(len(pl.windows))]
	var dt int64
	switch rng.IntN(8) {
	case 0, 1:
	case 2, 3:
		dt = 1 + rng.Int64N(w.gran)
	case 4:
		dt = w.period + rng.Int64N(3) - 1
	case 5:
		dt = rng.Int64N(w.period)
	default:
		dt = rng.Int64N(w.period / 4)
	}
	burst := 1
	if rng.IntN(4) == 0 {
		minLimit := w.limit
		for _, r := range pl.windows {
			minLimit = min(minLimit, r.limit)
		}
		burst = 1 + rng.IntN(int(min(minLimit+3, 30)))
	}
	return dt, burst
}

// runScriptPeriodEdit drives one key under old, then under edited from S
// on, through the script with the seeding the registry would give.
func runScriptPeriodEdit(t *testing.T, rng *rand.Rand, rdb *redis.Client, mini *miniredis.Miniredis, old, edited Policy) (int, int) {
	prefix := randomPrefix(t)
	po, pn := compile(old, DefaultBuckets, DefaultStrikeBuckets), compile(edited, DefaultBuckets, DefaultStrikeBuckets)
	// The registry's view once the edit has reached every replica: the
	// old plan's periods, no longer in use, and the new plan's new ones
	// young.
	sd := newSeeding(pn, otherPeriods(pn, po, false), youngPeriods(pn, po))
	c := &periodChecker{t: t, old: po, new: pn, what: fmt.Sprintf("old %v, new %v", old.Windows, edited.Windows)}
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
	var retry struct {
		at, wait int64
		ok       bool
	}
	call := func(underNew bool) verdict {
		t.Helper()
		if mini != nil {
			mini.SetTime(time.UnixMicro(now))
		}
		pl, keys, in := po, stateKeys(prefix, "k", po), input{lease: noLease}
		if underNew {
			pl, keys, in = pn, seedKeys(prefix, "k", sd, stateKeys(prefix, "k", pn)), input{lease: noLease, seed: sd}
		}
		reply, err := evalDecision(context.Background(), rdb, keys, pl, in)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		v, err := decode(pl, reply)
		if err != nil {
			t.Fatal(err)
		}
		c.decided(v.now, underNew)
		// Only a refusal by the last call can be honoured.
		retry.ok = false
		if v.outcome == Allowed {
			c.admitted(v.now, underNew)
		} else if underNew {
			retry.at, retry.wait, retry.ok = v.now, v.retry, true
		}
		return v
	}
	allowed, refused := 0, 0
	count := func(v verdict) {
		if v.outcome == Allowed {
			allowed++
		} else {
			refused++
		}
	}
	for range 40 {
		dt, burst := periodTraffic(rng, po)
		now += dt
		sleepShort(mini, dt)
		for range burst {
			count(call(false))
		}
	}
	for range 40 {
		// Honour a Retry-After exactly (miniredis): admitted then, not
		// 1 µs before.
		if retry.ok && mini != nil && rng.IntN(3) == 0 {
			now = retry.at + retry.wait - 1
			if v := call(true); v.outcome == Allowed {
				t.Fatalf("%s\nadmitted 1 µs before the Retry-After of a refusal at %d", c.what, retry.at)
			}
			now++
			if v := call(true); v.outcome != Allowed {
				t.Fatalf("%s\nrefused at %d with Retry-After %d, then %+v on the retry exactly then", c.what, retry.at, retry.wait, v)
			}
			retry.ok = false
			continue
		}
		dt, burst := periodTraffic(rng, pn)
		now += dt
		sleepShort(mini, dt)
		for range burst {
			count(call(true))
		}
	}
	return allowed, refused
}

// sleepShort lets real time pass for short gaps on a real Redis.
func sleepShort(mini *miniredis.Miniredis, dt int64) {
	if mini == nil && dt <= int64(20*time.Millisecond/time.Microsecond) {
		time.Sleep(time.Duration(dt) * time.Microsecond)
	}
}

func TestPeriodEditKeepsCountsMiniredis(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 11)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	// miniredis runs Lua interpreted in Go: a call that seeds a record is
	// slow under the race detector.
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	var allowed, refused int
	for c := range testenv.Cases(t, 5, max(*invariantCases/2, 10)) {
		old, edited := genPeriodEdit(rng, MaxPeriod)
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			a, r := runScriptPeriodEdit(t, rng, rdb, m, old, edited)
			allowed, refused = allowed+a, refused+r
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("%d admitted, %d refused", allowed, refused)
	if refused == 0 {
		t.Fatal("the generated traffic never reached a limit")
	}
}

func TestPeriodEditKeepsCountsRedis(t *testing.T) {
	t.Parallel()
	onRealRedis(t, 12, func(t *testing.T, rdb *redis.Client, rng *rand.Rand, maxPeriod time.Duration) {
		old, edited := genPeriodEdit(rng, maxPeriod)
		runScriptPeriodEdit(t, rng, rdb, nil, old, edited)
	})
}

// TestPeriodEditKeepsCountsInProcess holds the in-process decision code
// (state.go, which a limiter without Redis runs) to the same promise.
func TestPeriodEditKeepsCountsInProcess(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 14)
	for c := range *invariantCases {
		old, edited := genPeriodEdit(rng, MaxPeriod)
		po, pn := compile(old, DefaultBuckets, DefaultStrikeBuckets), compile(edited, DefaultBuckets, DefaultStrikeBuckets)
		ck := &periodChecker{t: t, old: po, new: pn, what: fmt.Sprintf("case %d: old %v, new %v", c, old.Windows, edited.Windows)}
		st := &keyState{}
		now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
		for phase, pl := range []*plan{po, pn} {
			for range 60 {
				dt, burst := periodTraffic(rng, pl)
				now += dt
				for range burst {
					v := st.decide(pl, now, input{lease: noLease})
					ck.decided(now, phase == 1)
					if v.outcome == Allowed {
						ck.admitted(now, phase == 1)
					}
				}
			}
		}
	}
}

// TestPeriodEditAcrossReplicas: while some replica still decides under
// the old plan, a replica on the edited plan holds the key to the old
// windows too (the stricter of the two); once none does, a replica
// started after the edit, which never saw the old plan, still takes the
// key's past from the old period's record, which the registry names; and
// Reset forgets that record too.
func TestPeriodEditAcrossReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	ctx := context.Background()
	a := f.l
	b, err := newLimiter(f.rdb, Options{Prefix: a.opts.Prefix, Timeout: a.opts.Timeout, Registerer: prometheus.NewRegistry()}, hooks{clock: f.clk.Now, noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	old := Policy{Name: "p", Windows: []Window{{Limit: 5, Period: time.Minute}}}
	edited := Policy{Name: "p", Windows: []Window{{Limit: 8, Period: 2 * time.Minute}}}
	for _, key := range []string{"k", "k2"} {
		for i := range 5 {
			if d, err := a.Allow(ctx, key, old); err != nil || !d.Allowed() {
				t.Fatalf("%s: request %d under the old plan: %+v %v", key, i, d, err)
			}
		}
	}
	refresh := func(l *Limiter) {
		t.Helper()
		if err := l.reg.refresh(ctx, l.plans.recent(f.clk.Now())); err != nil {
			t.Fatal(err)
		}
	}
	refresh(a)
	refresh(b)
	// a still decides under the old plan: b holds the key to its 5 per
	// minute as well.
	if d, err := b.Allow(ctx, "k", edited); err != nil || d.Outcome != Limited {
		t.Fatalf("under the new plan while the old one is in use: %+v %v; want limited by the old window", d, err)
	}
	// a has taken the edit up (or is gone) for longer than the registry
	// counts a plan in use; the old minute still holds k2's 5. (k's
	// refusal is remembered until the old window frees: stricter, never
	// looser.)
	f.clk.Add(registryRecent + 2*registryEvery)
	refresh(b)
	d, err := b.Allow(ctx, "k2", edited)
	if err != nil || !d.Allowed() || d.Windows[0].Remaining != 2 {
		t.Fatalf("first admission under the new plan: %+v %v; want admitted with 2 of 8 left (the old window's 5 kept)", d, err)
	}
	for range 2 {
		b.Allow(ctx, "k2", edited)
	}
	if d, _ := b.Allow(ctx, "k2", edited); d.Outcome != Limited || d.RetryAfter < 30*time.Second {
		t.Fatalf("9th request within the 2m window: %+v; want limited", d)
	}
	if err := b.Reset(ctx, "k2", edited); err != nil {
		t.Fatal(err)
	}
	for _, k := range stateKeys(a.opts.Prefix, "k2", compile(old, DefaultBuckets, DefaultStrikeBuckets))[1:] {
		if f.mini.Exists(k) {
			t.Fatalf("after Reset, the key's record %s remains", k)
		}
	}
	// Reset made the key start over; a fresh window, not seeded again.
	if d, _ := b.Allow(ctx, "k2", edited); !d.Allowed() || d.Windows[0].Remaining != 7 {
		t.Fatalf("after Reset: %+v; want 7 of 8 left", d)
	}
}

// otherPeriods lists the periods of plan q that pl lacks, as the registry
// gives them to pl: with q's limits when some replica still decides under
// q (inUse), so that pl enforces them beside its own.
func otherPeriods(pl, q *plan, inUse bool) []other {
	var out []other
	for _, r := range q.windows {
		if !slices.ContainsFunc(pl.windows, func(w ring) bool { return w.period == r.period }) {
			o := other{period: r.period}
			if inUse {
				o.limit = r.limit
			}
			out = append(out, o)
		}
	}
	return out
}

// youngPeriods lists pl's periods that q lacks: new with the edit.
func youngPeriods(pl, q *plan) []int64 {
	var out []int64
	for _, r := range pl.windows {
		if !slices.ContainsFunc(q.windows, func(w ring) bool { return w.period == r.period }) {
			out = append(out, r.period)
		}
	}
	return out
}

// TestPeriodEditWhileItSpreads decides one key under an old plan, then
// under the old and the edited plan in turn, as replicas do while an edit
// spreads, each enforcing the other's periods beside its own (the
// registry lists the periods each plan is decided under). The promise:
// every admission fits, and counts in, every window of both plans whose
// record the key has, so no window holds more than its limit of the
// admissions it counted, whichever plan decided them. The test tracks,
// per window, the admissions counted in it: its own plan's, and the other
// plan's while its record existed (on miniredis, whose clock stands
// still between the check and the call).
func TestPeriodEditWhileItSpreads(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 15)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	transitions := 0
	for c := range testenv.Cases(t, 3, max(*invariantCases/2, 10)) {
		old, edited := genPeriodEdit(rng, MaxPeriod)
		po, pn := compile(old, DefaultBuckets, DefaultStrikeBuckets), compile(edited, DefaultBuckets, DefaultStrikeBuckets)
		what := fmt.Sprintf("case %d: old %v, new %v", c, old.Windows, edited.Windows)
		prefix := randomPrefix(t)
		sdOld := newSeeding(po, otherPeriods(po, pn, true), nil)
		sdNew := newSeeding(pn, otherPeriods(pn, po, true), youngPeriods(pn, po))
		type counted struct {
			r   ring
			key string
			at  []int64
		}
		windows := map[int64]*counted{} // by period
		for _, pl := range []*plan{po, pn} {
			for i, r := range pl.windows {
				if windows[r.period] == nil {
					windows[r.period] = &counted{r: r, key: stateKeys(prefix, "k", pl)[1+i]}
				}
			}
		}
		now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro()
		minPeriod := slices.MinFunc(append(slices.Clone(po.windows), pn.windows...), func(a, b ring) int { return cmp.Compare(a.period, b.period) }).period
		decide := func(pl *plan, sd *seeding, spread bool) {
			m.SetTime(time.UnixMicro(now))
			// Which windows this admission would count in: its plan's, and
			// the other plan's whose record the key has.
			var in []*counted
			for _, w := range windows {
				own := slices.ContainsFunc(pl.windows, func(r ring) bool { return r.period == w.r.period })
				if !own && spread {
					n, err := rdb.Exists(ctx, w.key).Result()
					if err != nil {
						t.Fatal(err)
					}
					own = n == 1
					if own {
						transitions++
					}
				}
				if own {
					in = append(in, w)
				}
			}
			reply, err := evalDecision(ctx, rdb, seedKeys(prefix, "k", sd, stateKeys(prefix, "k", pl)), pl, input{lease: noLease, seed: sd})
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			v, err := decode(pl, reply)
			if err != nil {
				t.Fatal(err)
			}
			if v.outcome != Allowed {
				return
			}
			for _, w := range in {
				w.at = append(w.at, now)
			}
			for _, w := range windows {
				var n int64
				for _, a := range w.at {
					if a > now-w.r.period {
						n++
					}
				}
				if n > w.r.limit {
					t.Fatalf("%s\nwindow %d/%dµs counted %d admissions within its period at %d", what, w.r.limit, w.r.period, n, now)
				}
			}
		}
		for range 30 {
			dt, burst := periodTraffic(rng, po)
			now += dt
			for range burst {
				decide(po, nil, false)
			}
		}
		for range 80 {
			now += rng.Int64N(max(minPeriod/4, 1))
			for range 1 + rng.IntN(4) {
				if rng.IntN(2) == 0 {
					decide(po, sdOld, true)
				} else {
					decide(pn, sdNew, true)
				}
			}
		}
	}
	t.Logf("%d admissions counted in the other plan's windows", transitions)
	if transitions == 0 {
		t.Fatal("no admission ever met the other plan's records")
	}
}
