package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func simDecide(t *testing.T, s *Simulator, key string, p Policy, at time.Time) SimDecision {
	t.Helper()
	d, err := s.Decide(key, p, at)
	if err != nil {
		t.Fatalf("Decide(%q): %v", key, err)
	}
	return d
}

// TestSimulatorKnownAnswers: L+k requests inside one window leave exactly
// k limited; the window slides; a key that keeps going while limited is
// banned after the threshold for exactly the ban's length, its requests
// meanwhile refused as banned and not counted as strikes.
func TestSimulatorKnownAnswers(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "tiny", Windows: []Window{{Limit: 5, Period: 10 * time.Second}},
		Ban: BanPolicy{Threshold: 3, StrikeWindow: time.Minute, Base: 30 * time.Second, Multiplier: 2, Max: time.Hour, Memory: time.Hour}}
	s := NewSimulator(Options{})
	t0 := epoch

	var got [3]int
	for i := range 5 + 3 {
		d := simDecide(t, s, "a", p, t0.Add(time.Duration(i)*time.Millisecond))
		got[d.Outcome]++
		if !d.Time.Equal(t0.Add(time.Duration(i) * time.Millisecond)) {
			t.Fatalf("decision time %v, want the request's", d.Time)
		}
	}
	if got != [3]int{5, 3, 0} {
		t.Fatalf("8 requests in one window of 5: %v (allowed, limited, banned), want [5 3 0]", got)
	}
	// The fourth refusal is more than the threshold: a ban of 30 s.
	d := simDecide(t, s, "a", p, t0.Add(time.Second))
	if d.Outcome != Banned || !d.NewBan || !d.BannedUntil.Equal(t0.Add(31*time.Second)) {
		t.Fatalf("the 4th refusal: %+v, want a new ban until %v", d, t0.Add(31*time.Second))
	}
	// Banned until the ban ends, though the window has room again; the
	// requests meanwhile are no strikes: the next refusal after the ban
	// is the first of a new count.
	for _, at := range []time.Duration{11 * time.Second, 20 * time.Second, 31*time.Second - time.Microsecond} {
		if d := simDecide(t, s, "a", p, t0.Add(at)); d.Outcome != Banned || d.NewBan {
			t.Fatalf("at +%v: %v (new ban %v), want banned", at, d.Outcome, d.NewBan)
		}
	}
	if d := simDecide(t, s, "a", p, t0.Add(31*time.Second)); d.Outcome != Allowed {
		t.Fatalf("when the ban ends: %v, want allowed", d.Outcome)
	}

	// Paced at its limit, a key is never refused.
	for i := range 100 {
		if d := simDecide(t, s, "b", p, t0.Add(time.Duration(i)*2*time.Second)); d.Outcome != Allowed {
			t.Fatalf("paced request %d: %v", i, d.Outcome)
		}
	}
	// Another key's state is its own.
	if d := simDecide(t, s, "c", p, t0.Add(time.Second)); d.Outcome != Allowed || d.Windows[0].Remaining != 4 {
		t.Fatalf("a fresh key: %+v", d)
	}
}

func TestSimulatorClockNeverRunsBack(t *testing.T) {
	t.Parallel()
	s := NewSimulator(Options{})
	p := perMinute(2)
	simDecide(t, s, "k", p, epoch.Add(time.Minute))
	// Earlier than the key's last request: decided at that request's time,
	// in the same window.
	d := simDecide(t, s, "k", p, epoch)
	if !d.Time.Equal(epoch.Add(time.Minute)) || d.Windows[0].Remaining != 0 {
		t.Fatalf("a request from the past: %+v", d)
	}
	if d := simDecide(t, s, "k", p, epoch.Add(time.Minute)); d.Outcome != Limited {
		t.Fatalf("third request of 2/min: %v", d.Outcome)
	}
	s.Forget("k")
	if d := simDecide(t, s, "k", p, epoch.Add(time.Minute)); d.Outcome != Allowed {
		t.Fatalf("after Forget: %v", d.Outcome)
	}
	if _, err := s.Decide("k", Policy{Name: "none"}, epoch); err == nil {
		t.Fatal("a policy without windows was accepted")
	}
}

// TestSimulatorWindowsInvariant holds the Simulator's admissions to the
// window promise over generated plans and traffic (the invariant tests'
// generators: limits at byte boundaries, periods from MinPeriod to
// MaxPeriod, a key changing plans as replicas disagreeing would): no
// interval of length W holds more than L admissions of a window (L, W).
// One Simulator replays every case, forgetting each key after it, as a
// replay of many keys does: its decisions are a fresh Simulator's.
func TestSimulatorWindowsInvariant(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 11)
	var total [3]int
	shared := NewSimulator(Options{})
	for c := range *invariantCases {
		key := fmt.Sprint("k", c)
		policies := genPolicies(rng, MaxPeriod)
		plans := make([]*plan, len(policies))
		for i, p := range policies {
			plans[i] = compile(p, DefaultBuckets, DefaultStrikeBuckets)
		}
		s := NewSimulator(Options{})
		var log admissionLog
		now := genStart(rng)
		pi := 0
		for range 300 {
			if rng.IntN(8) == 0 {
				pi = rng.IntN(len(policies))
			}
			pl := plans[pi]
			w := pl.windows[rng.IntN(len(pl.windows))]
			switch rng.IntN(10) {
			case 0, 1, 2: // a burst: same instant
			case 3, 4:
				now += 1 + rng.Int64N(w.gran)
			case 5:
				now += w.gran
			case 6, 7:
				now += w.period + rng.Int64N(3) - 1
			default:
				now += rng.Int64N(2 * w.period)
			}
			d := simDecide(t, s, "k", policies[pi], time.UnixMicro(now))
			if e := simDecide(t, shared, key, policies[pi], time.UnixMicro(now)); !reflect.DeepEqual(e, d) {
				t.Fatalf("case %d: a Simulator that replayed other keys decided %+v, a fresh one %+v", c, e, d)
			}
			total[d.Outcome]++
			if d.Outcome != Allowed {
				continue
			}
			x := d.Time.UnixMicro()
			if r, n := log.admit(pl, x); r != nil {
				t.Fatalf("case %d, %v: %d admissions within %s ending at %d µs, limit %d",
					c, policies, n, time.Duration(r.period)*time.Microsecond, x, r.limit)
			}
		}
		shared.Forget(key)
	}
	t.Logf("decisions: %d allowed, %d limited, %d banned", total[0], total[1], total[2])
	if total[Limited] == 0 || total[Banned] == 0 {
		t.Fatalf("the generated traffic did not reach every outcome: %v", total)
	}
}

// genStart returns when a generated case begins (µs): in a third of the
// cases within MaxPeriod of the Unix epoch, where the oldest buckets an
// interval can touch lie before zero (a replayed log may begin there),
// otherwise in 2031.
func genStart(rng *rand.Rand) int64 {
	if rng.IntN(3) == 0 {
		return rng.Int64N(MaxPeriod.Microseconds())
	}
	return time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC).UnixMicro() + rng.Int64N(int64(time.Hour/time.Microsecond))
}

// TestSimulatorRejectsTimesBeforeTheEpoch: a time the shared store's
// clock never reads is an error, not a decision (nor a panic).
func TestSimulatorRejectsTimesBeforeTheEpoch(t *testing.T) {
	t.Parallel()
	s := NewSimulator(Options{})
	p := Policy{Name: "p", Windows: []Window{{Limit: 5, Period: time.Minute}, {Limit: 100, Period: MaxPeriod}}}
	for _, at := range []time.Time{time.UnixMicro(-1), {}, time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)} {
		if d, err := s.Decide("k", p, at); err == nil || !strings.Contains(err.Error(), "before the Unix epoch") {
			t.Fatalf("at %s: %+v, %v; want an error", at, d, err)
		}
	}
	if d := simDecide(t, s, "k", p, time.UnixMicro(0)); d.Outcome != Allowed || d.Windows[0].Remaining != 4 || d.Windows[1].Remaining != 99 {
		t.Fatalf("at the epoch: %+v", d)
	}
}

// TestSimulatorMatchesScript: over generated plans and traffic, the
// Simulator decides every request as the decision script does on
// miniredis at the same time (outcome, Retry-After, what each window has
// left, bans): a replay is what the shared store would have decided.
func TestSimulatorMatchesScript(t *testing.T) {
	t.Parallel()
	rng := invariantRNG(t, 12)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var outcomes [3]int
	for c := range max(*invariantCases/4, 6) {
		p := genPolicies(rng, MaxPeriod)[0]
		if c%2 == 0 {
			// Bans often, at small limits.
			for i := range p.Windows {
				p.Windows[i].Limit = 1 + rng.Int64N(8)
			}
			sw := genPeriod(rng, time.Hour)
			p.Ban = BanPolicy{Threshold: 1 + rng.Int64N(4), StrikeWindow: sw, Base: sw, Multiplier: 2, Memory: 4 * sw}
		}
		t.Run(fmt.Sprint("case", c), func(t *testing.T) {
			d := newInvariantDriver(t, rng, rdb, m, []Policy{p})
			d.now = genStart(rng)
			s := NewSimulator(Options{})
			w := d.plans[0].windows
			for i := range 150 {
				r := w[rng.IntN(len(w))]
				switch rng.IntN(6) {
				case 0, 1:
				case 2:
					d.now += 1 + rng.Int64N(r.gran)
				case 3:
					d.now += r.period + rng.Int64N(3) - 1
				default:
					d.now += rng.Int64N(2 * r.period)
				}
				v := d.call(0, 1)
				got := simDecide(t, s, "k", p, time.UnixMicro(d.now))
				var want Decision
				decisionOf(d.plans[0], &v, &want)
				var until time.Time
				if v.banUntil > 0 {
					until = time.UnixMicro(v.banUntil)
				}
				outcomes[v.outcome]++
				same := got.Outcome == want.Outcome && got.RetryAfter == want.RetryAfter && got.NewBan == v.newBan && got.BannedUntil.Equal(until)
				for j := range want.Windows {
					same = same && got.Windows[j].Remaining == want.Windows[j].Remaining && got.Windows[j].Reset.Equal(want.Windows[j].Reset)
				}
				if !same {
					t.Fatalf("%v ban %+v, request %d at %d: simulated %+v\nscript %+v (new ban %v, until %d)",
						p.Windows, p.Ban, i, d.now, got, want, v.newBan, v.banUntil)
				}
			}
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("decisions: %d allowed, %d limited, %d banned", outcomes[0], outcomes[1], outcomes[2])
	if outcomes[Limited] == 0 || outcomes[Banned] == 0 {
		t.Fatalf("the generated traffic did not reach every outcome: %v", outcomes)
	}
}
