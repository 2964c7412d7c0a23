package ratelimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// fallback decides for a key without Redis (fail-open): for a request
// whose own round trip failed, and for every request while the breaker is
// open. It keeps the bound stated in the README ("Failure modes"):
//
// Local state for a key starts from the last shared verdict this replica
// received for it, not from zero. For each window that verdict's
// remaining R is split over the N live replicas: this replica admits at
// most ⌊R/N⌋ more until the window's period has passed since that
// verdict (what was counted then has slid out by then). After that, and
// for a key it has not decided within the window, each replica admits at
// most max(1, ⌊L/N⌋) per window. A ban known from the last verdict holds
// until its end, and strikes are counted locally as usual. Every local
// admission is remembered and added to the shared windows by the key's
// next round trip (input.add), so the windows that follow a failure know
// about them. An admission reports Remaining counted down from the last
// shared verdict, not from this replica's share of it (countDown).
type fallback struct {
	seed        maphash.Seed
	shards      [memShards]fallbackShard
	maxPerShard int
	live        func() int64 // live replica count

	// pendingKeys counts the kept entries with pending admissions. It is
	// raised before an entry's pending count leaves zero and lowered after
	// it returns to zero (or the entry is dropped), both under the entry's
	// shard lock, so it is never lower than the number of such entries:
	// read as zero, there is nothing to add, and takePending, on every
	// round trip, skips its lock and lookup. Outside an outage it is zero.
	pendingKeys atomic.Int64
}

type fallbackShard struct {
	mu   sync.Mutex
	keys map[string]*fallbackEntry
}

// fallbackEntry is what the replica knows of one key.
type fallbackEntry struct {
	pl        *plan   // the plan of the last shared verdict
	at        int64   // when that verdict's round trip began (local µs); 0: none
	remaining []int64 // per window of pl, what the verdict left (leases counted whole)
	banUntil  int64   // local µs
	pending   int64   // local admissions not yet added to the shared windows
	expires   int64   // local µs: nothing here matters after it

	state  *keyState // local decisions since seeded
	seeded int64     // the at the state was seeded from
	taken  []taken   // what seeding took, at seeded, to stand for others' admissions
}

// taken is the part of a window's local limit that seeding took.
type taken struct {
	ring string
	n    int64
}

func newFallback(size int, live func() int64) *fallback {
	f := &fallback{seed: maphash.MakeSeed(), maxPerShard: max(size/memShards, 1), live: live}
	for i := range f.shards {
		f.shards[i].keys = make(map[string]*fallbackEntry)
	}
	return f
}

func (f *fallback) shard(key string) *fallbackShard {
	return &f.shards[maphash.String(f.seed, key)%memShards]
}

// remember records the shared verdict v for key under pl, whose round
// trip began at start (local µs).
// v's remaining counts must be Redis's own (a lease counted whole), as the
// script returned them.
func (f *fallback) remember(key string, pl *plan, start int64, v *verdict) {
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil {
		if len(sh.keys) >= f.maxPerShard {
			return
		}
		e = &fallbackEntry{}
		sh.keys[key] = e
	}
	e.pl, e.at = pl, start
	e.remaining = e.remaining[:0]
	for _, w := range v.win {
		e.remaining = append(e.remaining, w.remaining)
	}
	e.banUntil = 0
	if v.banUntil > 0 {
		e.banUntil = start + v.banUntil - v.now
	}
	longest := pl.windows[len(pl.windows)-1].period
	e.expires = max(e.expires, start+longest, e.banUntil)
}

// takePending returns, per window of pl, the admissions this replica made
// without Redis that the window still counts at now (local µs), to add to
// the shared windows with the key's next round trip, and how many local
// admissions that covers (for restorePending). A window is not sent what
// has slid out of it: after a long outage a minute window gets the last
// minute's admissions, a day window all of them.
func (f *fallback) takePending(key string, pl *plan, now int64) ([]int64, int64) {
	if f.pendingKeys.Load() == 0 {
		return nil, 0
	}
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys[key]
	if e == nil || e.pending == 0 || e.state == nil {
		return nil, 0
	}
	adds := make([]int64, len(pl.windows))
	for i := range pl.windows {
		r := &pl.windows[i]
		s := e.state.windows[r.name]
		if s == nil {
			continue
		}
		b := s.bucket(r, now)
		s.advance(r, b)
		used, from := s.used(r, now, b)
		for _, tk := range e.taken {
			if tk.ring == r.name && e.seeded/r.gran >= from {
				used -= tk.n // seeding's stand-in for others, still counted
			}
		}
		adds[i] = min(max(used, 0), e.pending)
	}
	p := e.pending
	e.pending = 0
	f.pendingKeys.Add(-1)
	return adds, p
}

// restorePending gives back admissions whose round trip failed.
func (f *fallback) restorePending(key string, n int64) {
	if n == 0 {
		return
	}
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.keys[key]; e != nil {
		if e.pending == 0 {
			f.pendingKeys.Add(1)
		}
		e.pending += n
	}
}

// decide evaluates one request for key under pl at now (local µs) from
// local state, counting extra earlier rejections as strikes.
func (f *fallback) decide(key string, pl *plan, now int64, in input) verdict {
	n := max(f.live(), 1)
	lp := pl.localFor(n)
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, kept := sh.keys[key]
	if e == nil {
		e = &fallbackEntry{}
		if len(sh.keys) < f.maxPerShard && !in.peek {
			sh.keys[key], kept = e, true
		}
	}
	if e.state == nil || e.seeded != e.at {
		e.state, e.taken = e.seedState(pl, lp, now, n)
		e.seeded = e.at
	}
	v := e.state.decide(lp, now, in)
	if !in.peek {
		if v.outcome == Allowed {
			if e.pending == 0 && kept {
				f.pendingKeys.Add(1)
			}
			e.pending++
		}
		e.expires = max(e.expires, e.state.expires)
	}
	if v.outcome == Allowed {
		e.countDown(pl, now, &v)
	}
	return v
}

// seedState returns the local state that continues from the last shared
// verdict: in each window still within its period of that verdict, the
// part of the local limit that ⌊R/N⌋ leaves is taken at the verdict's time
// (and so slides out a period after it); the known ban holds.
func (e *fallbackEntry) seedState(pl, lp *plan, now, n int64) (*keyState, []taken) {
	st := &keyState{}
	var tk []taken
	if e.at == 0 || e.pl != pl {
		return st, nil
	}
	for i := range lp.windows {
		r := &lp.windows[i]
		if now-e.at >= r.period || i >= len(e.remaining) {
			continue
		}
		share := min(r.limit, e.remaining[i]/n)
		if n := r.limit - share; n > 0 {
			s, _ := st.ringFor(r, true)
			b := s.bucket(r, e.at)
			s.advance(r, b)
			s.add(r, b, e.at, n)
			tk = append(tk, taken{ring: r.name, n: n})
		}
	}
	if lp.ban.on && e.banUntil > now {
		st.ban.until = e.banUntil
	}
	return st, tk
}

// countDown states the Remaining of an admission v, decided at now, as
// the window's rather than this replica's share: in each window still
// within its period of the last shared verdict, what that verdict left,
// R, less what this replica has admitted alone and not yet added to the
// shared windows (pending: each came after that verdict's round trip
// began, which took those before it). So an answer made without Redis
// counts down from the key's last shared count, as a lease's answers do
// (lease.go): short of the window's true figure by what the replicas held
// unspent when that verdict was made, over by what was admitted elsewhere
// since, and never above L. A window the verdict no longer
// covers, or never did, keeps the local figure: this replica knows
// nothing shared of it. So do refusals: the window that refuses reads 0.
func (e *fallbackEntry) countDown(pl *plan, now int64, v *verdict) {
	if e.at == 0 || e.pl != pl {
		return
	}
	for i := range pl.windows {
		if now-e.at >= pl.windows[i].period || i >= len(e.remaining) || i >= len(v.win) {
			continue
		}
		v.win[i].remaining = max(e.remaining[i]-e.pending, 0)
	}
}

// sweep drops what no longer matters.
func (f *fallback) sweep(now int64) {
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			if e.expires <= now {
				f.drop(sh, k, e)
			}
		}
		sh.mu.Unlock()
	}
}

// forget drops key, pending admissions included (Reset).
func (f *fallback) forget(key string) {
	sh := f.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		f.drop(sh, key, e)
	}
	sh.mu.Unlock()
}

// drop deletes key's entry e from sh, whose lock the caller holds.
func (f *fallback) drop(sh *fallbackShard, key string, e *fallbackEntry) {
	delete(sh.keys, key)
	if e.pending > 0 {
		f.pendingKeys.Add(-1)
	}
}

// unban drops the ban the replica knew of for key.
func (f *fallback) unban(key string) {
	sh := f.shard(key)
	sh.mu.Lock()
	if e := sh.keys[key]; e != nil {
		e.banUntil = 0
		if e.state != nil {
			e.state.ban, e.state.cban = banState{}, banState{}
		}
	}
	sh.mu.Unlock()
}

// localPlan is a plan's fallback for one live replica count.
type localPlan struct {
	n  int64
	pl *plan
}

// localFor returns the plan one of n replicas enforces alone: each limit
// max(1, ⌊L/n⌋), the same ban rules and geometry.
func (pl *plan) localFor(n int64) *plan {
	if lp := pl.local.Load(); lp != nil && lp.n == n {
		return lp.pl
	}
	p := pl.policy
	p.Windows = append([]Window(nil), p.Windows...)
	for i, w := range p.Windows {
		p.Windows[i].Limit = max(1, w.Limit/n)
	}
	lp := compile(p, pl.buckets, pl.strikeBuckets)
	lp.counters = pl.counters
	pl.local.Store(&localPlan{n: n, pl: lp})
	return lp
}
