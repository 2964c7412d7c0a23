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

// Options tune a Limiter. The zero value is usable: all fields default.
type Options struct {
	// Prefix starts every Redis key and channel name (default "petstore:rl:").
	Prefix string
	// Timeout bounds each wait on Redis (default 50ms); a request waits at most
	// two, as a failed round trip is sent once more (sendAgain).
	Timeout time.Duration
	// FailureMode applies when Redis fails or times out (default FailOpen).
	FailureMode FailureMode
	// Replicas is the count assumed until heartbeats count the live replicas
	// (default 1); without Redis each enforces its share of a limit.
	Replicas int
	// Registerer receives the metrics; nil exports none.
	Registerer prometheus.Registerer
	// Logger gets a line per change of Redis reachability (default: discard).
	Logger *slog.Logger

	// Buckets splits a window of period W in steps of W/Buckets (default 200).
	Buckets int
	// StrikeBuckets splits a ban's strike window (default 20).
	StrikeBuckets int
	// Pipelines is the number of pipelines in flight at once (default 4).
	Pipelines int
	// PipelineHold is how long a decision may wait for the pipelines in flight
	// before another carries it (default 200µs; negative: none): near Redis,
	// calls gather more decisions; far from it, calls start this far apart.
	PipelineHold time.Duration
	// ProbeInterval is how often an unreachable Redis is retried (default 100ms).
	ProbeInterval time.Duration
	// TripAfter is how long round trips must keep failing (at least 3, no
	// success between) before the replica stops asking Redis (default 1s).
	TripAfter time.Duration
	// CacheSize caps keys cached as limited or banned (default 65536; <0: off).
	CacheSize int
	// MaxLease caps a busy key's lease and a slow key's block: admissions
	// counted in one round trip, spent in process (default 64; 1 or less:
	// none).
	MaxLease int
	// FinalizeAfter is how long heartbeats must see no older replica and no
	// hold before this one finalizes (default 1m; negative: never).
	FinalizeAfter time.Duration
	// Admin marks a Limiter for the limits commands: no heartbeats, so it is
	// not a live replica, and no periods marked in the registry.
	Admin bool
}

// hooks are what tests change of a Limiter or Throttle; constructors set none.
type hooks struct {
	// clock replaces time.Now.
	clock func() time.Time
	// noHeartbeat keeps the live replica count at Options.Replicas.
	noHeartbeat bool
	// blocks puts blocks in force (lease.go) without finalizing.
	blocks bool
	// inStep does nothing in the background on real time (seed replays): the
	// test sweeps, and a give-back is sent on the goroutine letting its block
	// go, before it goes on, to reach Redis at the same place every run.
	inStep bool
	// sendOnce disables sendAgain: batcher tests count its calls and waits.
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
