package ratelimit

import (
	"fmt"
	"hash/maphash"
	"time"
)

// Simulator decides requests through the in-process decider, at times the
// caller gives, exactly as the decision script would, without leases, caches
// or fallback: "what would these limits have done to this traffic" (e.g. a
// replayed log).
//
// Keys never share state. Replay each key's requests in time order (an
// earlier time counts as the previous one's); a key whose policy changes
// keeps its counts as in a Limiter without Redis. A Simulator is not safe
// for concurrent use; replay disjoint keys on Simulators of their own.
type Simulator struct {
	buckets, strikeBuckets int
	seed                   maphash.Seed
	plans                  map[uint64][]*plan
	dec                    *localDecider
	keys                   map[string]*simKey
	// The last decision's key: a replay decides a key's requests in a row.
	lastName string
	lastKey  *simKey
}

// simKey is one key's last decision's plan and time; its counts are the
// local decider's.
type simKey struct {
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

// NewSimulator returns a Simulator with opts' Buckets and StrikeBuckets.
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
		dec:   &localDecider{store: newMemStore()},
		keys:  make(map[string]*simKey),
	}
}

// Decide decides and records one request for key under p at time at (or the
// key's previous time, if later); shadow refusals go uncounted, as in the
// limiter. It fails only for an invalid policy or a time before the epoch.
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
		k.pl = pl
	}
	k.last = max(k.last, at.UnixMicro())
	v := s.dec.at(request{key: key, pl: k.pl, in: input{lease: noLease}}, k.last)
	d := SimDecision{NewBan: v.newBan}
	decisionOf(k.pl, &v, &d.Decision)
	if v.banUntil > 0 {
		d.BannedUntil = time.UnixMicro(v.banUntil)
	}
	return d, nil
}

// Forget drops everything held for key, as if it had sent no request.
func (s *Simulator) Forget(key string) {
	delete(s.keys, key)
	s.dec.store.forget(key)
	s.lastName, s.lastKey = "", nil
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
