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
type decider interface {
	// decide decides reqs into out in order; on an error, out holds those made.
	decide(ctx context.Context, reqs []request, out []verdict) error
}

// request is one decision asked of a decider: key under pl, asking in.
type request struct {
	key string
	pl  *plan
	in  input
}
