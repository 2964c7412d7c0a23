package ratelimit

import (
	"fmt"
	"hash/maphash"
	"time"
)

// Simulator decides requests with the limiter's own algorithm, in this
// process, at times the caller gives: for each request, exactly what the
// shared store (the decision script) would decide for it, on the same ring
// geometry, with the same strikes and bans. None of a Limiter's machinery
// stands between: no leases, no rejection cache, no fallback, no metrics.
// It answers "what would these limits have done to this traffic", e.g. to
// replay an access log against proposed plans.
//
// Keys never share state: replay each key's requests in time order (a time
// before the key's previous request is taken as that request's, so a key's
// clock never runs back). A key whose policy changes from one request to
// the next keeps its counts as in a Limiter without Redis: windows of the
// same period share their records, and a new period starts from the key's
// record of another (as the script does from the periods the replicas
// list). A Simulator is not safe for concurrent use;
// disjoint sets of keys can be replayed in parallel on Simulators of their
// own.
type Simulator struct {
	buckets, strikeBuckets int
	seed                   maphash.Seed
	plans                  map[uint64][]*plan
	keys                   map[string]*simKey
	// spare holds the records of forgotten keys, by ring name, to be
	// cleared and used again: a replay of many keys then allocates
	// records for the busiest moment's keys only.
	spare map[string][]*ringState
	// The key of the last decision: a replay decides a key's requests
	// one after the other.
	lastName string
	lastKey  *simKey
}

// simKey is one key's state and the plan of its last decision, reused
// while the key's policy stays the same.
type simKey struct {
	st   keyState
	pl   *plan
	last int64 // µs, the key's latest decision
}

// SimDecision is one simulated decision.
type SimDecision struct {
	Decision
	// NewBan is true when this request began a ban (Outcome is Banned).
	NewBan bool
	// BannedUntil is, while the key is banned, when the ban ends.
	BannedUntil time.Time
}

// NewSimulator returns a Simulator with the geometry of a Limiter made
// with opts: Buckets and StrikeBuckets (default 200 and 20), which every
// replica of a fleet shares. The other options have no meaning here.
func NewSimulator(opts Options) *Simulator {
	if opts.Buckets <= 0 {
		opts.Buckets = DefaultBuckets
	}
	if opts.StrikeBuckets <= 0 {
		opts.StrikeBuckets = DefaultStrikeBuckets
	}
	return &Simulator{
		buckets: opts.Buckets, strikeBuckets: opts.StrikeBuckets,
		seed:  maphash.MakeSeed(),
		plans: make(map[uint64][]*plan),
		keys:  make(map[string]*simKey),
		spare: make(map[string][]*ringState),
	}
}

// Decide decides one request for key under p at time at and records it,
// as the shared store would have. Decision.Time is at (or the key's
// previous request's time, if later), Decision.Shadow is p.Shadow: under a
// shadow policy the outcome is what enforcement would have decided, and
// refusals are not counted, exactly as the limiter does. It returns an
// error only for an invalid policy or a time before the Unix epoch (the
// shared store's clock never reads one).
func (s *Simulator) Decide(key string, p Policy, at time.Time) (SimDecision, error) {
	if at.UnixMicro() < 0 {
		return SimDecision{}, fmt.Errorf("ratelimit: simulated time %s is before the Unix epoch", at.UTC().Format(time.RFC3339Nano))
	}
	k := s.lastKey
	if k == nil || s.lastName != key {
		if k = s.keys[key]; k == nil {
			k = &simKey{}
			s.keys[key] = k
		}
		s.lastName, s.lastKey = key, k
	}
	if k.pl == nil || !samePolicy(&k.pl.given, &p) {
		pl, err := s.plan(p)
		if err != nil {
			return SimDecision{}, err
		}
		if k.pl == nil {
			s.reuse(&k.st, pl)
		}
		k.pl = pl
	}
	k.last = max(k.last, at.UnixMicro())
	v := k.st.decide(k.pl, k.last, input{lease: noLease})
	d := SimDecision{NewBan: v.newBan}
	decisionOf(k.pl, &v, &d.Decision)
	if v.banUntil > 0 {
		d.BannedUntil = time.UnixMicro(v.banUntil)
	}
	return d, nil
}

// Forget drops everything held for key, as if it had never sent a
// request: a replay that is done with a key frees its state.
func (s *Simulator) Forget(key string) {
	k := s.keys[key]
	if k == nil {
		return
	}
	delete(s.keys, key)
	if s.lastKey == k {
		s.lastName, s.lastKey = "", nil
	}
	for name, r := range k.st.windows {
		s.spare[name] = append(s.spare[name], r)
	}
	for name, r := range k.st.candidates {
		s.spare[name] = append(s.spare[name], r)
	}
	if r := k.st.ban.strikes; r != nil {
		s.spare[k.st.ban.strikeRing] = append(s.spare[k.st.ban.strikeRing], r)
	}
}

// reuse gives st, the state of a key before its first decision, spare
// records for pl's rings, empty: exactly what the decision would
// otherwise make (newRingState).
func (s *Simulator) reuse(st *keyState, pl *plan) {
	take := func(r *ring) *ringState {
		free := s.spare[r.name]
		if len(free) == 0 {
			return nil
		}
		rs := free[len(free)-1]
		s.spare[r.name] = free[:len(free)-1]
		clear(rs.count)
		clear(rs.off)
		*rs = ringState{geo: *r, count: rs.count, off: rs.off}
		return rs
	}
	for i := range pl.windows {
		if rs := take(&pl.windows[i]); rs != nil {
			if st.windows == nil {
				st.windows = make(map[string]*ringState, len(pl.windows))
			}
			st.windows[pl.windows[i].name] = rs
		}
	}
	for i := range pl.candidates {
		if rs := take(&pl.candidates[i]); rs != nil {
			if st.candidates == nil {
				st.candidates = make(map[string]*ringState, len(pl.candidates))
			}
			st.candidates[pl.candidates[i].name] = rs
		}
	}
	if pl.ban.on {
		if rs := take(&pl.ban.strikes); rs != nil {
			st.ban.strikeRing, st.ban.strikes = pl.ban.strikes.name, rs
		}
	}
}

// plan returns p compiled, once per distinct policy.
func (s *Simulator) plan(p Policy) (*plan, error) {
	h := hashPolicy(s.seed, &p)
	for _, pl := range s.plans[h] {
		if samePolicy(&pl.given, &p) {
			return pl, nil
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	pl := compile(p, s.buckets, s.strikeBuckets)
	pl.given = p.clone()
	s.plans[h] = append(s.plans[h], pl)
	return pl, nil
}
