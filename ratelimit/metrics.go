package ratelimit

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the limiter's collectors. Without a registerer they are
// still created, just never exported, so callers need no nil checks.
type metrics struct {
	decisions       *prometheus.CounterVec
	bans            *prometheus.CounterVec
	shadowDecisions *prometheus.CounterVec
	shadowBans      *prometheus.CounterVec
	candidates      *prometheus.CounterVec
	candidateBans   *prometheus.CounterVec
	nearLimit       *prometheus.CounterVec
	leased          *prometheus.CounterVec
	unspent         *prometheus.CounterVec
	givenBack       *prometheus.CounterVec
	redisDuration   prometheus.Histogram
	queueWait       prometheus.Histogram
	redisErrors     prometheus.Counter
	sentAgain       prometheus.Counter
	fallbackActive  prometheus.Gauge
	fallbackSeconds prometheus.Counter
	breakerTrips    prometheus.Counter
	local           *prometheus.CounterVec
	replicasLive    prometheus.Gauge
	olderReplicas   prometheus.Gauge
	finalizeMark    prometheus.Gauge
	finalizeHold    prometheus.Gauge
	finalized       prometheus.Gauge
	blocksInForce   prometheus.Gauge
	trackedKeys     prometheus.Gauge
	untracked       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: counterVec("decisions_total",
			"Rate-limit decisions by plan and outcome (allowed, limited, banned).", "plan", "outcome"),
		bans: counterVec("bans_total", "Temporary bans issued, by plan.", "plan"),
		shadowDecisions: counterVec("shadow_decisions_total",
			"Decisions under plans in shadow mode, by plan and the outcome enforcement would have had; none was enforced.", "plan", "outcome"),
		shadowBans: counterVec("shadow_bans_total",
			"Temporary bans plans in shadow mode would have issued, by plan; none was enforced.", "plan"),
		candidates: counterVec("candidate_decisions_total",
			"Requests the plans' candidate windows (and candidate ban policies) would have admitted (allowed), limited or refused as banned, by plan; candidates never refuse.", "plan", "outcome"),
		candidateBans: counterVec("candidate_bans_total",
			"Temporary bans the plans' candidate ban policies would have issued, by plan; none was enforced.", "plan"),
		leased: counterVec("leased_total",
			"Admissions granted in process from a lease, without a round trip to Redis (also in decisions_total), by plan.", "plan"),
		unspent: counterVec("unspent_total",
			"Admissions a replica counted in Redis ahead of requests (a lease's, kind=\"lease\"; a block's, kind=\"block\") and let go without granting: the lease or block ended, was dropped by a Reset, or its plan changed. They count in their windows until they slide out. By plan and kind.", "plan", "kind"),
		givenBack: counterVec("given_back_total",
			"Admissions of unspent_total that Redis took back off the counts of the windows they were counted in, where their bucket was still stored: they no longer count against the key. By plan and kind.", "plan", "kind"),
		nearLimit: counterVec("near_limit_total",
			"Admissions that left some window of the key with less than a tenth of its limit remaining, by plan (plans in shadow mode are not counted).", "plan"),
		redisDuration: histogram("redis_duration_seconds",
			"Duration of rate-limit round trips to Redis (one pipeline of decisions).", prometheus.ExponentialBuckets(25e-6, 2, 14)),
		queueWait: histogram("queue_wait_seconds",
			"How long decisions waited for a pipeline to send them to Redis (queued to sent; up to 200µs of it gathering behind a call in flight): far above that, every pipeline was busy (see --ratelimit-pipelines).", prometheus.ExponentialBuckets(25e-6, 2, 14)),
		redisErrors: counter("redis_errors_total", "Rate-limit round trips to Redis that failed or timed out."),
		sentAgain: counter("sent_again_total",
			"Decisions sent to Redis a second time because their round trip failed before the breaker tripped (a blip): each may count twice there, which only makes its windows stricter."),
		fallbackActive:  gauge("fallback_active", "1 while this replica enforces limits locally because Redis is unreachable."),
		fallbackSeconds: counter("fallback_seconds_total", "Time this replica spent enforcing limits locally."),
		breakerTrips:    counter("breaker_trips_total", "Times this replica stopped asking Redis after round trips kept failing."),
		local: counterVec("local_decisions_total",
			"Decisions made without Redis (its round trip failed, or the breaker is open), by plan and outcome.", "plan", "outcome"),
		replicasLive: gauge("replicas_live",
			"Live replicas last counted through Redis heartbeats; the fallback divides limits by it."),
		olderReplicas: gauge("older_replicas",
			"Live replicas, last counted through Redis heartbeats, of a release before finalizing was possible; 'petstore limits finalize' refuses while any run, and finalized records are not in force."),
		finalizeMark: gauge("finalize_mark",
			"1 while the finalize mark is set in Redis ('petstore limits finalize'), as this replica's last heartbeat read it, in force or not."),
		finalizeHold: gauge("finalize_hold",
			"1 while an operator holds finalizing back ('petstore limits finalize --hold' or --undo), as this replica's last heartbeat read it: the fleet does not finalize by itself."),
		finalized: gauge("records_finalized",
			"1 while this replica writes window records as finalized ('petstore limits finalize'): new records compact, growing with their keys' activity."),
		blocksInForce: gauge("blocks_in_force",
			"1 while this replica takes blocks of every window for slow keys and spends them in process ('petstore limits finalize' with no replica of an older release live)."),
		trackedKeys: gauge("tracked_keys",
			"Keys this replica tracks for leases and blocks after its last sweep (at most 65536)."),
		untracked: counter("untracked_total",
			"Requests of keys this replica had no room to track: each decided by its own Redis round trip, never leased."),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	register(reg, &err, &m.decisions)
	register(reg, &err, &m.bans)
	register(reg, &err, &m.shadowDecisions)
	register(reg, &err, &m.shadowBans)
	register(reg, &err, &m.candidates)
	register(reg, &err, &m.candidateBans)
	register(reg, &err, &m.leased)
	register(reg, &err, &m.unspent)
	register(reg, &err, &m.givenBack)
	register(reg, &err, &m.nearLimit)
	register(reg, &err, &m.redisDuration)
	register(reg, &err, &m.queueWait)
	register(reg, &err, &m.sentAgain)
	register(reg, &err, &m.redisErrors)
	register(reg, &err, &m.fallbackActive)
	register(reg, &err, &m.fallbackSeconds)
	register(reg, &err, &m.breakerTrips)
	register(reg, &err, &m.local)
	register(reg, &err, &m.replicasLive)
	register(reg, &err, &m.olderReplicas)
	register(reg, &err, &m.finalizeMark)
	register(reg, &err, &m.finalizeHold)
	register(reg, &err, &m.finalized)
	register(reg, &err, &m.blocksInForce)
	register(reg, &err, &m.trackedKeys)
	register(reg, &err, &m.untracked)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// metricOpts names a collector petstore_ratelimit_<name>; counter, counterVec,
// gauge and histogram build the collectors newMetrics registers.
func metricOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "petstore", Subsystem: "ratelimit", Name: name, Help: help}
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts(metricOpts(name, help)))
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts(name, help)), labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts(metricOpts(name, help)))
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "petstore", Subsystem: "ratelimit", Name: name, Help: help, Buckets: buckets,
	})
}

// register registers *c, or points *c at the identical collector registered
// before, so that a Limiter and a Throttle can share one registry. Once *err
// is set it does nothing: registration stops at the first failure.
func register[T prometheus.Collector](reg prometheus.Registerer, err *error, c *T) {
	if *err != nil {
		return
	}
	*err = reg.Register(*c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(*err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			*c, *err = existing, nil
		}
	}
}

// counters are one plan's metric handles, resolved once per plan.
type counters struct {
	outcome   [3]prometheus.Counter
	banned    prometheus.Counter
	candidate [3]prometheus.Counter // by outcome
	// candidateBanned counts bans the candidate ban policy would issue.
	candidateBanned prometheus.Counter
	// nearLimit is nil for a shadow plan: its admissions are not ones.
	nearLimit prometheus.Counter
	// leased counts admissions granted from a lease.
	leased prometheus.Counter
	// unspent counts leases' (0) and blocks' (1) admissions let go unspent.
	unspent [2]prometheus.Counter
	// givenBack counts those given back off their windows (giveback.go).
	givenBack [2]prometheus.Counter
	// local counts decisions made without Redis, by outcome.
	localOutcome [3]prometheus.Counter
}

// forPlan resolves plan name's counters; a shadow plan's decisions and bans
// count apart, so enforcement's figures stay true. Every series exists, at
// zero, from a plan's first decision: dashboards and alerts find it before the
// first outage, and a plan switched between modes keeps its series.
func (m *metrics) forPlan(name string, shadow bool) counters {
	var c counters
	for o := Allowed; o <= Banned; o++ {
		c.outcome[o] = m.decisions.WithLabelValues(name, o.String())
		if s := m.shadowDecisions.WithLabelValues(name, o.String()); shadow {
			c.outcome[o] = s
		}
		c.candidate[o] = m.candidates.WithLabelValues(name, o.String())
		c.localOutcome[o] = m.local.WithLabelValues(name, o.String())
	}
	c.banned = m.bans.WithLabelValues(name)
	if s := m.shadowBans.WithLabelValues(name); shadow {
		c.banned = s
	}
	c.candidateBanned = m.candidateBans.WithLabelValues(name)
	if !shadow {
		c.nearLimit = m.nearLimit.WithLabelValues(name)
	}
	c.leased = m.leased.WithLabelValues(name)
	c.unspent = [2]prometheus.Counter{m.unspent.WithLabelValues(name, "lease"), m.unspent.WithLabelValues(name, "block")}
	c.givenBack = [2]prometheus.Counter{m.givenBack.WithLabelValues(name, "lease"), m.givenBack.WithLabelValues(name, "block")}
	return c
}

// countNearLimit counts d once if it admitted a request and left some window
// under a tenth of its limit, a sign the plan may be too tight. Comparing
// remaining*10 with limit neither rounds nor overflows up to MaxLimit.
func (c *counters) countNearLimit(d *Decision) {
	if d.Outcome != Allowed || c.nearLimit == nil {
		return
	}
	for _, w := range d.Windows {
		if w.Remaining*10 < w.Limit {
			c.nearLimit.Inc()
			return
		}
	}
}

func (m *metrics) observeRedis(d time.Duration, err error) {
	m.redisDuration.Observe(d.Seconds())
	if err != nil {
		m.redisErrors.Inc()
	}
}
