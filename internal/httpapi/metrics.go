package httpapi

import (
	"errors"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/apikey"
)

// Metrics are the HTTP layer's Prometheus metrics.
type Metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	inFlight     prometheus.Gauge
	storeErrors  *prometheus.CounterVec
	authFailures *prometheus.CounterVec

	// series caches what seriesFor found (see there); the map is
	// never changed once published, so reading it takes no lock.
	series   atomic.Pointer[map[seriesKey]requestSeries]
	seriesMu sync.Mutex // held to publish a larger map
}

// seriesKey names a request's series: route, method and status code.
type seriesKey struct {
	route, method string
	code          int
}

// requestSeries are the series a request is counted in.
type requestSeries struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// seriesFor returns the series of requests to route with method
// answered with code. WithLabelValues checks and hashes its label values
// and takes a read lock on every call; the handles it returns stay valid
// (the vectors are never reset), so each is looked up once. The labels
// are bounded (route patterns, standard methods, status codes), and so is
// the cache.
func (m *Metrics) seriesFor(route, method string, code int) requestSeries {
	k := seriesKey{route: route, method: method, code: code}
	if cache := m.series.Load(); cache != nil {
		if s, ok := (*cache)[k]; ok {
			return s
		}
	}
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	cache := make(map[seriesKey]requestSeries)
	if old := m.series.Load(); old != nil {
		if s, ok := (*old)[k]; ok { // published while this waited
			return s
		}
		cache = maps.Clone(*old)
	}
	s := requestSeries{
		requests: m.requests.WithLabelValues(route, method, strconv.Itoa(code)),
		duration: m.duration.WithLabelValues(route, method),
	}
	cache[k] = s
	m.series.Store(&cache)
	return s
}

// NewMetrics creates the HTTP metrics and registers them with reg (unless
// reg is nil). Like promauto it panics if they are already registered: that
// is a wiring mistake, found at startup.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "http", Name: "requests_total",
			Help: "HTTP requests answered, by route pattern (\"unmatched\" for unknown paths), method and status code (499: client went away).",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "petstore", Subsystem: "http", Name: "request_duration_seconds",
			Help:    "Time to answer HTTP requests, by route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "petstore", Subsystem: "http", Name: "requests_in_flight",
			Help: "HTTP requests being served.",
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "store", Name: "errors_total",
			Help: "Pet store calls that failed for reasons other than the request (not found, idempotency conflicts), by operation.",
		}, []string{"operation"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore", Subsystem: "auth", Name: "failures_total",
			Help: "Requests to /v1 without a usable API key, by reason (missing, malformed, unknown, revoked, unavailable, error).",
		}, []string{"reason"}),
	}
	// Start every known series at zero so that rate() sees the first event.
	for _, err := range []error{apikey.ErrMissing, apikey.ErrMalformed, apikey.ErrUnknown, apikey.ErrRevoked, apikey.ErrUnavailable, errors.New("other")} {
		m.authFailures.WithLabelValues(apikey.Reason(err))
	}
	for _, op := range []string{opCreate, opGet, opList} {
		m.storeErrors.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.inFlight, m.storeErrors, m.authFailures)
	}
	return m
}
