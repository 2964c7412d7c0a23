package ratelimit

import "context"

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
//
// The limiter's batcher (batch.go) sends every round trip through decide.
type decider interface {
	// decide decides reqs into out in order. errs[i] is request i's own
	// error, nil when out[i] was decided; the error returned is the
	// decider's (Redis failed or timed out), which the breaker hears.
	decide(ctx context.Context, reqs []request, out []verdict, errs []error) error
}

// request is one decision asked of a decider: key under pl, asking in.
type request struct {
	key string
	pl  *plan
	in  input
	// cp is the plan whose records the call reads, pl with coarse records
	// when blocks are in force (replicas.callPlan); nil: pl. names are
	// key's record names under it when the caller keeps them (lease.go).
	cp    *plan
	names []string
}
