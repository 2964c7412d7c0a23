package fleettest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/internal/testenv"
)

// The limiter's promises on timing and plan changes, each in a test of its
// own: no request held past the Redis timeout, shared limiting resuming
// within 1 s of a restarted Redis answering, and a plan change spreading
// over the replicas without exceeding a window or starting a count over.

// TestRedisCrashResumesWithinASecond kills Redis twice under load through
// HAProxy and restarts it 2 s later, in both failure modes: within 1 s of
// Redis answering, every replica is back on shared limiting (fail-open)
// and no request gets 503 any more (fail-closed).
func TestRedisCrashResumesWithinASecond(t *testing.T) {
	testenv.Long(t)
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			f := newFleet(t, fleetOptions{keys: map[string]int{"loadtest": 8}, redisTimeout: 50 * time.Millisecond, failureMode: mode})
			l := f.startLoad(loadSpec{rate: 200, workers: 32, targets: []string{f.lb.url}, keys: f.keys["loadtest"]})
			time.Sleep(time.Second)
			var backs, kills []time.Time
			for range 2 {
				kills = append(kills, time.Now())
				back := crashFor(2 * time.Second).do(f.redis)
				backs = append(backs, back)
				if mode == "open" {
					resumed := f.waitShared(t, back)
					t.Logf("every replica back on shared limiting %s after Redis answered", resumed.Round(time.Millisecond))
					if resumed > time.Second {
						t.Errorf("shared limiting resumed %s after Redis answered, want within 1s", resumed)
					}
				}
				time.Sleep(2 * time.Second)
			}
			rs := l.stop()
			t.Logf("whole run: %s", summarize(rs, time.Since(l.start)))
			for i, back := range backs {
				// Judged until the next crash, less the round trip a
				// request sent just before the kill still needs (its
				// call may reach Redis after it).
				end := back.Add(2 * time.Second)
				if i+1 < len(kills) {
					end = kills[i+1].Add(-100 * time.Millisecond)
				}
				var last time.Time
				for _, r := range rs {
					if r.status == 503 && r.send.Before(end) && r.send.After(last) {
						last = r.send
					}
				}
				if mode == "closed" {
					t.Logf("the last 503 was sent %s after Redis answered", last.Sub(back).Round(time.Millisecond))
					if last.Sub(back) > time.Second {
						t.Errorf("a request got 503 %s after Redis answered, want none after 1s", last.Sub(back))
					}
				}
			}
			for _, r := range failures(rs) {
				if mode == "open" {
					t.Errorf("failed request (fail-open must answer): %s", describe(r))
					break
				}
			}
		})
	}
}

// TestRedisFaultsHoldNoRequestPastTimeout runs shortFaults and a 3 s pause
// under the same load and checks, by the replicas' access logs, how long
// requests were held against --redis-timeout (checkHeld).
func TestRedisFaultsHoldNoRequestPastTimeout(t *testing.T) {
	testenv.Long(t)
	sprayThroughFaults(t, append(shortFaults(), pauseFor(3*time.Second)), checkHeldTime)
}

// TestPlanChangeKeepsWindows changes a plan's limit while a key is sprayed
// over the replicas, one replica at a time (each reads its own copy of the
// plans file, as during a staggered ConfigMap roll), so the fleet runs on
// two plans for about three seconds: from 10 to 20 per 4 s, then back to
// 10. Judged by client send and receive times, no 4 s window ever holds
// more than 20 (so no replica started the key's count over when its limit
// changed: that would admit 10 or 20 more on top of the window's count),
// and once every replica is back on 10, no 4 s window holds more than 10.
// (A changed period: TestPeriodChangeKeepsCounts.)
func TestPlanChangeKeepsWindows(t *testing.T) {
	testenv.Long(t)
	const (
		period   = 4 * time.Second
		interval = 500 * time.Millisecond
	)
	plans := func(limit int, period string) string {
		return fmt.Sprintf("plans:\n  spread: {quotas: [{limit: %d, period: %s}], ban: off}\n", limit, period)
	}
	f := newFleet(t, fleetOptions{plans: plans(10, "4s"), keys: map[string]int{"spread": 1}, perReplicaPlan: true, reloadInterval: interval})
	l := f.startLoad(loadSpec{rate: 20, workers: 8, targets: f.replicaURLs(), keys: f.keys["spread"]})
	time.Sleep(period)
	// roll returns when it wrote the first replica's file and when every
	// replica has applied the last.
	roll := func(limit int, period string) (began, applied time.Time) {
		began = time.Now()
		for i, r := range f.replicas {
			if i > 0 {
				time.Sleep(1500 * time.Millisecond)
			}
			f.writeFile(strings.TrimPrefix(r.plansFile, f.dir+"/"), plans(limit, period))
		}
		return began, time.Now().Add(interval + 250*time.Millisecond)
	}
	_, up := roll(20, "4s")
	time.Sleep(2 * period)
	downBegan, down := roll(10, "4s")
	time.Sleep(2 * period)
	rs := l.stop()
	end := time.Now()
	t.Logf("sprayed key: %s", summarize(rs, time.Since(l.start)))
	for _, r := range failures(rs) {
		t.Errorf("failed request: %s", describe(r))
	}

	n, at := windowCount(admissions(rs, -1, time.Time{}, end), period)
	t.Logf("through both changes: at most %d admissions certainly within one %s window (larger limit 20), from %s", n, period, at.Format("15:04:05.000"))
	if n > 20 {
		t.Errorf("%d admissions within one %s window while the plan changed between 10 and 20: a window was exceeded or a count started over", n, period)
	}
	n, at = windowCount(admissions(rs, -1, down, end), period)
	t.Logf("after every replica went back to 10: at most %d within one window, from %s", n, at.Format("15:04:05.000"))
	if n > 10 {
		t.Errorf("%d admissions within one %s window after every replica applied the limit of 10", n, period)
	}
	// The larger limit was actually granted once every replica had it, so
	// the judge saw a fleet that admits what the plan allows.
	if n, _ := windowCount(admissions(rs, -1, up.Add(period), downBegan), period); n < 15 {
		t.Errorf("only %d admissions in one window on the plan of 20: the change did not take effect", n)
	}
}

// TestPeriodChangeKeepsCounts changes a plan's period, from 10 per 4 s to
// 12 per 8 s, through the plans file while one key is sprayed over the
// replicas. The spray pauses while the change spreads (so that no decision
// is made while replicas disagree) and resumes once every replica answers
// with the new plan. The new window has a new record; each replica starts
// it from the key's record of the old period, which the registry of
// periods names even to a replica that never decided the key under the old
// plan. Judged by client send and receive times, every 8 s window holds at
// most 12 admissions plus those possibly made more than 4 s before the
// first decision under the new plan (the old record no longer held them);
// a count that started over would admit 12 on top of the old window's.
func TestPeriodChangeKeepsCounts(t *testing.T) {
	testenv.Long(t)
	const (
		interval = 500 * time.Millisecond
		newLimit = 12
		oldW     = 4 * time.Second
		newW     = 8 * time.Second
	)
	plans := func(quota string) string { return "plans:\n  edit: {quotas: [" + quota + "], ban: off}\n" }
	f := newFleet(t, fleetOptions{plans: plans("{limit: 10, period: 4s}"), keys: map[string]int{"edit": 2}, reloadInterval: interval, draftFields: true})
	sprayed, probe := f.keys["edit"][:1], f.keys["edit"][1]
	first := f.startLoad(loadSpec{rate: 20, workers: 8, targets: f.targets(), keys: sprayed})
	time.Sleep(6 * time.Second)
	rs := first.stop()
	f.writeFile("plans.yaml", plans(fmt.Sprintf("{limit: %d, period: 8s}", newLimit)))
	changed := time.Now()
	ctx := context.Background()
	for _, r := range f.replicas {
		for {
			// The probe key is on the same plan: its answers show the plan
			// without touching the sprayed key's counts.
			if res, policy := f.policy(ctx, r.api, probe.Key); strings.Contains(policy, `"8s"`) {
				break
			} else if time.Since(changed) > 5*time.Second {
				t.Fatalf("%s still answers with %q (%s) 5s after the change", r.name, policy, describe(res))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	resume := time.Now()
	t.Logf("every replica on the new plan %s after the change; the spray paused %s", resume.Sub(changed).Round(time.Millisecond), resume.Sub(rs[len(rs)-1].recv).Round(time.Millisecond))
	second := f.startLoad(loadSpec{rate: 20, workers: 8, targets: f.targets(), keys: sprayed})
	time.Sleep(2 * newW)
	after := second.stop()
	for _, r := range failures(append(slices.Clone(rs), after...)) {
		t.Errorf("failed request: %s", describe(r))
	}
	// The first decision under the new plan was made by the time the
	// first answer of the resumed spray came back.
	firstNew := after[0].recv
	for _, r := range after {
		firstNew = earliest(firstNew, r.recv)
	}
	cutoff := firstNew.Add(-oldW) // admissions sent before it may be unknown to the old record
	adm := admissions(append(rs, after...), -1, time.Time{}, time.Now())
	slices.SortFunc(adm, func(a, b span) int { return a.send.Compare(b.send) })
	worst, worstAt, worstUnknown := 0, time.Time{}, 0
	for i, a := range adm {
		n, unknown, late := 0, 0, false
		end := a.send.Add(newW)
		for _, b := range adm[i:] {
			if !b.send.Before(end) {
				break
			}
			if b.recv.Before(end) {
				n++
				late = late || !b.send.Before(resume)
				if b.send.Before(cutoff) {
					unknown++
				}
			}
		}
		if late && n-unknown > worst-worstUnknown {
			worst, worstAt, worstUnknown = n, a.send, unknown
		}
	}
	t.Logf("sprayed key: before the change %s; after it %s", summarize(rs, 6*time.Second), summarize(after, 2*newW))
	t.Logf("at most %d admissions certainly within one %s window ending under the new plan, %d of them possibly older than the old record knew (bound %d + those), from %s",
		worst, newW, worstUnknown, newLimit, worstAt.Format("15:04:05.000"))
	if worst > newLimit+worstUnknown {
		t.Errorf("%d admissions within one %s window, more than %d plus the %d the old record could not know: the new window did not start from the old one's count",
			worst, newW, newLimit, worstUnknown)
	}
	if n, _ := windowCount(admissions(after, -1, resume.Add(newW), time.Now()), newW); n < newLimit-2 {
		t.Errorf("only %d admissions in one window once the old counts had slid out: the new limit did not take effect", n)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// TestPeriodChangeSpreads changes a plan's period, from 10 per 4 s to 12
// per 8 s, one replica at a time (each reads its own copy of the plans
// file, 1.5 s apart, as during a staggered ConfigMap roll) while one key
// is sprayed over the replicas without a pause. Replicas still on the old
// plan and those on the new one each enforce the other's period where the
// key has a record of it (the registry lists the periods in use), so,
// judged by client send and receive times, no 4 s window holds more than
// 10 from the first change until the old plan has been out of use for
// registryRecent (3 s): replicas that each counted only their own plan's
// window would admit up to 10 more on the new plan's side.
func TestPeriodChangeSpreads(t *testing.T) {
	testenv.Long(t)
	const (
		interval = 500 * time.Millisecond
		oldW     = 4 * time.Second
	)
	plans := func(quota string) string { return "plans:\n  edit: {quotas: [" + quota + "], ban: off}\n" }
	f := newFleet(t, fleetOptions{plans: plans("{limit: 10, period: 4s}"), keys: map[string]int{"edit": 1}, perReplicaPlan: true, reloadInterval: interval})
	l := f.startLoad(loadSpec{rate: 20, workers: 8, targets: f.targets(), keys: f.keys["edit"]})
	time.Sleep(oldW + time.Second)
	began := time.Now()
	for i, r := range f.replicas {
		if i > 0 {
			time.Sleep(1500 * time.Millisecond)
		}
		f.writeFile(strings.TrimPrefix(r.plansFile, f.dir+"/"), plans("{limit: 12, period: 8s}"))
	}
	applied := time.Now().Add(interval + 250*time.Millisecond)
	time.Sleep(3 * oldW)
	rs := l.stop()
	t.Logf("sprayed key: %s", summarize(rs, time.Since(l.start)))
	for _, r := range failures(rs) {
		t.Errorf("failed request: %s", describe(r))
	}
	// The old plan is in use until the last replica applied the edit,
	// and its period enforced by the others for registryRecent (3 s)
	// after that.
	until := applied.Add(3 * time.Second)
	n, at := windowCount(admissions(rs, -1, began.Add(-oldW), until), oldW)
	t.Logf("from %s before the first change to 3s after the last was applied: at most %d admissions certainly within one %s window (old limit 10), from %s",
		oldW, n, oldW, at.Format("15:04:05.000"))
	if n > 10 {
		t.Errorf("%d admissions within one %s window while the edit spread: the old plan's window was exceeded", n, oldW)
	}
}
