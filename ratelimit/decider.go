package ratelimit

import (
	"context"
	"time"
)

// A decider decides a batch of requests against the shared records: the
// one seam between the limiter's policy and where its counts live. Its
// promise, which the property tests (invariant_test.go) check through
// this interface on each implementation: the requests of a batch are
// decided in order, each seeing the ones before it (up to scriptBatch of
// them at one reading of the decider's clock), and for every window of a
// request's plan
//
//   - no interval of the window's period admits more than its limit,
//     leases counted whole when granted;
//   - a refusal's Retry-After is the earliest time the request would be
//     admitted, were nothing else to arrive;
//   - bans begin at the ban rule's threshold of strikes and last as it
//     says.
//
// Two implement it: redisDecider (redisdecider.go), the decision code in
// Redis, shared by every replica; and localDecider (below), the same
// algorithm in process (state.go), for a limiter without Redis, the
// simulator, and the tests.
type decider interface {
	// decide decides reqs into out (len(reqs)), in order. An error means
	// some request went undecided: out holds the verdicts that were made.
	decide(ctx context.Context, reqs []request, out []verdict) error
}

// request is one request for a decider: its key, its plan, and what it
// asks beyond deciding one request (input).
type request struct {
	key string
	pl  *plan
	in  input
}

// localDecider decides in this process (state.go), at now's reading.
type localDecider struct {
	store *memStore
	now   func() time.Time
}

func newLocalDecider(now func() time.Time) *localDecider {
	return &localDecider{store: newMemStore(), now: now}
}

func (d *localDecider) decide(_ context.Context, reqs []request, out []verdict) error {
	now := d.now().UnixMicro()
	for i, q := range reqs {
		out[i] = d.store.decide(q.key, q.pl, now, q.in)
	}
	return nil
}

// one decides a batch of one request, with nothing to allocate for it.
func (d *localDecider) one(q request) verdict {
	return d.store.decide(q.key, q.pl, d.now().UnixMicro(), q.in)
}
