package ratelimit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FailureMode says what the limiter does when Redis cannot be reached.
type FailureMode int

const (
	// FailOpen enforces limits per replica, in memory, until Redis is back.
	FailOpen FailureMode = iota
	// FailClosed refuses decisions with ErrUnavailable until Redis is back.
	FailClosed
)

func (m FailureMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// ParseFailureMode parses "open" or "closed".
func ParseFailureMode(s string) (FailureMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return FailOpen, fmt.Errorf("ratelimit: failure mode %q: want open or closed", s)
}

// Options tune a Limiter. The zero value is usable: every field has a
// default.
type Options struct {
	// Prefix starts every Redis key and channel name (default "petstore:rl:").
	Prefix string
	// Timeout bounds each wait on Redis (default 50ms). A decision whose
	// round trip fails before the breaker trips is sent once more
	// (sendAgain), so a request waits at most two Timeouts for Redis.
	Timeout time.Duration
	// FailureMode applies when Redis fails or times out (default FailOpen).
	FailureMode FailureMode
	// Replicas is the number of replicas assumed until the first heartbeat
	// through Redis counts the live ones (default 1). Without Redis, each
	// replica enforces its share of every limit: see fallback.go.
	Replicas int
	// Registerer receives the metrics; nil exports none.
	Registerer prometheus.Registerer
	// Logger receives one line per change of Redis reachability, and one at
	// Close when leases or blocks are let go (default: discard).
	Logger *slog.Logger

	// Buckets is the number of buckets a window is split into (default 200):
	// requests slide out of a window of period W in steps of W/Buckets.
	Buckets int
	// StrikeBuckets is the number of buckets of a ban's strike window (default 20).
	StrikeBuckets int
	// Pipelines is the number of pipelines in flight at once (default 4).
	Pipelines int
	// PipelineHold is how long a decision may wait for the pipelines in
	// flight to be answered before another one carries it (default
	// 200µs; negative: none, every free pipeline sends at once). Near
	// Redis the calls are answered within it, and decisions gather into
	// fewer, larger calls; far from Redis, calls start this far apart.
	PipelineHold time.Duration
	// ProbeInterval is how often an unreachable Redis is retried (default 100ms).
	ProbeInterval time.Duration
	// TripAfter is how long round trips must keep failing, with no success
	// in between (and at least 3 of them), before the replica stops asking
	// Redis (default 1s). Until then only the requests whose own round trip
	// failed are decided without it.
	TripAfter time.Duration
	// CacheSize caps the keys remembered as limited or banned (default
	// 65536); negative disables the cache.
	CacheSize int
	// MaxLease caps the admissions a replica counts for a busy key in one
	// round trip and then grants in process (a lease, default 64), and
	// those of a slow key's block (blocks.go); 1 (or less) disables both:
	// one round trip per request.
	MaxLease int
	// FinalizeAfter is how long this replica's heartbeats must count no
	// live replica of an older release, and no operator's hold, before it
	// finalizes the records by itself (finalize.go; default 1m, by Redis
	// time; negative: never, only 'petstore limits finalize').
	FinalizeAfter time.Duration
	// Admin marks a Limiter that administers limits rather than deciding
	// requests (the limits commands: Usage, Reset, Unban, Finalize): it
	// sends no heartbeats, so it never counts among the live replicas,
	// whose count sizes every replica's leases, blocks and share of
	// a limit without Redis, and marks no periods in the registry.
	Admin bool
}

// hooks are what tests change of a Limiter's or a Throttle's
// surroundings; New and NewThrottle set none.
type hooks struct {
	// clock replaces time.Now.
	clock func() time.Time
	// noHeartbeat keeps the live replica count at Options.Replicas.
	noHeartbeat bool
	// blocks puts blocks in force (blocks.go) without finalizing.
	blocks bool
	// inStep does no work in the background on real time (tests that
	// replay a seed): no sweep loop (the test sweeps), and a give-back is
	// sent on the goroutine that lets its block go, before it goes on, so
	// that it reaches Redis in the same place among decisions every run.
	inStep bool
	// sendOnce sends no decision again (sendAgain): tests of the batcher
	// that count its calls and waits.
	sendOnce bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = "petstore:rl:"
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return o, errors.New("ratelimit: key prefix must not contain braces")
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&o.Timeout, 50*time.Millisecond)
	def(&o.Replicas, 1)
	def(&o.Buckets, DefaultBuckets)
	def(&o.StrikeBuckets, DefaultStrikeBuckets)
	def(&o.Pipelines, 4)
	if o.PipelineHold == 0 {
		o.PipelineHold = 200 * time.Microsecond
	}
	defd(&o.ProbeInterval, 100*time.Millisecond)
	defd(&o.TripAfter, time.Second)
	if o.CacheSize == 0 {
		o.CacheSize = 65536
	}
	if o.FinalizeAfter == 0 {
		o.FinalizeAfter = time.Minute
	}
	if o.MaxLease == 0 {
		o.MaxLease = 64
	}
	o.MaxLease = max(o.MaxLease, 1)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.FailureMode != FailOpen && o.FailureMode != FailClosed {
		return o, fmt.Errorf("ratelimit: unknown failure mode %d", o.FailureMode)
	}
	return o, nil
}
