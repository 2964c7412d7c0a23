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
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "decisions_total",
			Help: "Rate-limit decisions by plan and outcome (allowed, limited, banned).",
		}, []string{"plan", "outcome"}),
		bans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "bans_total",
			Help: "Temporary bans issued, by plan.",
		}, []string{"plan"}),
		shadowDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "shadow_decisions_total",
			Help: "Decisions under plans in shadow mode, by plan and the outcome enforcement would have had; none was enforced.",
		}, []string{"plan", "outcome"}),
		shadowBans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "shadow_bans_total",
			Help: "Temporary bans plans in shadow mode would have issued, by plan; none was enforced.",
		}, []string{"plan"}),
		candidates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "candidate_decisions_total",
			Help: "Requests the plans' candidate windows (and candidate ban policies) would have admitted (allowed), limited or refused as banned, by plan; candidates never refuse.",
		}, []string{"plan", "outcome"}),
		candidateBans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "candidate_bans_total",
			Help: "Temporary bans the plans' candidate ban policies would have issued, by plan; none was enforced.",
		}, []string{"plan"}),
		leased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "leased_total",
			Help: "Admissions granted in process from a lease, without a round trip to Redis (also in decisions_total), by plan.",
		}, []string{"plan"}),
		unspent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "unspent_total",
			Help: "Admissions a replica counted in Redis ahead of requests (a lease's, kind=\"lease\"; a block's, kind=\"block\") and let go without granting: the lease or block ended, was dropped by a Reset, or its plan changed. They count in their windows until they slide out. By plan and kind.",
		}, []string{"plan", "kind"}),
		givenBack: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "given_back_total",
			Help: "Admissions of unspent_total that Redis took back off the counts of the windows they were counted in, where their bucket was still stored: they no longer count against the key. By plan and kind.",
		}, []string{"plan", "kind"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "near_limit_total",
			Help: "Admissions that left some window of the key with less than a tenth of its limit remaining, by plan (plans in shadow mode are not counted).",
		}, []string{"plan"}),
		redisDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "redis_duration_seconds",
			Help:    "Duration of rate-limit round trips to Redis (one pipeline of decisions).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14),
		}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "queue_wait_seconds",
			Help:    "How long decisions waited for a pipeline to send them to Redis (queued to sent; up to 200µs of it gathering behind a call in flight): far above that, every pipeline was busy (see --ratelimit-pipelines).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14),
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "redis_errors_total",
			Help: "Rate-limit round trips to Redis that failed or timed out.",
		}),
		sentAgain: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "sent_again_total",
			Help: "Decisions sent to Redis a second time because their round trip failed before the breaker tripped (a blip): each may count twice there, which only makes its windows stricter.",
		}),
		fallbackActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "fallback_active",
			Help: "1 while this replica enforces limits locally because Redis is unreachable.",
		}),
		fallbackSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "fallback_seconds_total",
			Help: "Time this replica spent enforcing limits locally.",
		}),
		breakerTrips: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "breaker_trips_total",
			Help: "Times this replica stopped asking Redis after round trips kept failing.",
		}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "local_decisions_total",
			Help: "Decisions made without Redis (its round trip failed, or the breaker is open), by plan and outcome.",
		}, []string{"plan", "outcome"}),
		replicasLive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "replicas_live",
			Help: "Live replicas last counted through Redis heartbeats; the fallback divides limits by it.",
		}),
		olderReplicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "older_replicas",
			Help: "Live replicas, last counted through Redis heartbeats, of a release before finalizing was possible; 'petstore limits finalize' refuses while any run, and finalized records are not in force.",
		}),
		finalizeMark: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "finalize_mark",
			Help: "1 while the finalize mark is set in Redis ('petstore limits finalize'), as this replica's last heartbeat read it, in force or not.",
		}),
		finalizeHold: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "finalize_hold",
			Help: "1 while an operator holds finalizing back ('petstore limits finalize --hold' or --undo), as this replica's last heartbeat read it: the fleet does not finalize by itself.",
		}),
		finalized: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "records_finalized",
			Help: "1 while this replica writes window records as finalized ('petstore limits finalize'): a record's expiry set once per epoch of a quarter of its period, not on every head move.",
		}),
		blocksInForce: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "blocks_in_force",
			Help: "1 while this replica takes blocks of every window for slow keys and spends them in process ('petstore limits finalize' with no replica of an older release live).",
		}),
		trackedKeys: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "tracked_keys",
			Help: "Keys this replica tracks for leases and blocks after its last sweep (at most 65536).",
		}),
		untracked: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "ratelimit", Name: "untracked_total",
			Help: "Requests of keys this replica had no room to track: each decided by its own Redis round trip, never leased.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.decisions, err = register(reg, m.decisions); err != nil {
		return nil, err
	}
	if m.bans, err = register(reg, m.bans); err != nil {
		return nil, err
	}
	if m.shadowDecisions, err = register(reg, m.shadowDecisions); err != nil {
		return nil, err
	}
	if m.shadowBans, err = register(reg, m.shadowBans); err != nil {
		return nil, err
	}
	if m.candidates, err = register(reg, m.candidates); err != nil {
		return nil, err
	}
	if m.candidateBans, err = register(reg, m.candidateBans); err != nil {
		return nil, err
	}
	if m.leased, err = register(reg, m.leased); err != nil {
		return nil, err
	}
	if m.unspent, err = register(reg, m.unspent); err != nil {
		return nil, err
	}
	if m.givenBack, err = register(reg, m.givenBack); err != nil {
		return nil, err
	}
	if m.nearLimit, err = register(reg, m.nearLimit); err != nil {
		return nil, err
	}
	if m.redisDuration, err = register(reg, m.redisDuration); err != nil {
		return nil, err
	}
	if m.queueWait, err = register(reg, m.queueWait); err != nil {
		return nil, err
	}
	if m.sentAgain, err = register(reg, m.sentAgain); err != nil {
		return nil, err
	}
	if m.redisErrors, err = register(reg, m.redisErrors); err != nil {
		return nil, err
	}
	if m.fallbackActive, err = register(reg, m.fallbackActive); err != nil {
		return nil, err
	}
	if m.fallbackSeconds, err = register(reg, m.fallbackSeconds); err != nil {
		return nil, err
	}
	if m.breakerTrips, err = register(reg, m.breakerTrips); err != nil {
		return nil, err
	}
	if m.local, err = register(reg, m.local); err != nil {
		return nil, err
	}
	if m.replicasLive, err = register(reg, m.replicasLive); err != nil {
		return nil, err
	}
	if m.olderReplicas, err = register(reg, m.olderReplicas); err != nil {
		return nil, err
	}
	if m.finalizeMark, err = register(reg, m.finalizeMark); err != nil {
		return nil, err
	}
	if m.finalizeHold, err = register(reg, m.finalizeHold); err != nil {
		return nil, err
	}
	if m.finalized, err = register(reg, m.finalized); err != nil {
		return nil, err
	}
	if m.blocksInForce, err = register(reg, m.blocksInForce); err != nil {
		return nil, err
	}
	if m.trackedKeys, err = register(reg, m.trackedKeys); err != nil {
		return nil, err
	}
	if m.untracked, err = register(reg, m.untracked); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the identical collector registered
// before, so that a Limiter and a Throttle can share one registry.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
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
	}
	c.banned = m.bans.WithLabelValues(name)
	if s := m.shadowBans.WithLabelValues(name); shadow {
		c.banned = s
	}
	for o := Allowed; o <= Banned; o++ {
		c.candidate[o] = m.candidates.WithLabelValues(name, o.String())
	}
	c.candidateBanned = m.candidateBans.WithLabelValues(name)
	if !shadow {
		c.nearLimit = m.nearLimit.WithLabelValues(name)
	}
	c.leased = m.leased.WithLabelValues(name)
	c.unspent = [2]prometheus.Counter{m.unspent.WithLabelValues(name, "lease"), m.unspent.WithLabelValues(name, "block")}
	c.givenBack = [2]prometheus.Counter{m.givenBack.WithLabelValues(name, "lease"), m.givenBack.WithLabelValues(name, "block")}
	for o := Allowed; o <= Banned; o++ {
		c.localOutcome[o] = m.local.WithLabelValues(name, o.String())
	}
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
