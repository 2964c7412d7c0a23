package ratelimit

import (
	"context"
	"time"
)

// A decider decides a batch of requests against the shared records: the
// one seam between policy and where counts live. Its promise, checked on
// each implementation by invariant_test.go: a batch's requests are decided
// in order, each seeing those before it (up to scriptBatch at one reading
// of the decider's clock), and for every window of a request's plan
//
//   - no interval of the window's period admits more than its limit,
//     leases counted whole when granted;
//   - a refusal's Retry-After is the earliest time the request would be
//     admitted, were nothing else to arrive;
//   - bans begin at the rule's threshold of strikes and last as it says.
//
// redisDecider decides in Redis for every replica; localDecider runs the
// same algorithm (state.go) in process, without Redis and in tests.
type decider interface {
	// decide decides reqs into out in order; on an error, out holds those made.
	decide(ctx context.Context, reqs []request, out []verdict) error
}

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
		out[i] = d.at(q, now)
	}
	return nil
}

// one decides a single request without allocating a batch.
func (d *localDecider) one(q request) verdict { return d.at(q, d.now().UnixMicro()) }

// at decides q at now (µs) rather than the decider's clock: the Simulator
// replays a log's times.
func (d *localDecider) at(q request, now int64) verdict {
	return d.store.decide(q.key, q.pl, now, q.in)
}
