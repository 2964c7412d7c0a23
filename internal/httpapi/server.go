package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/pet"
	"github.com/animal-store/petstore/ratelimit"
)

// PetStore keeps pets. Errors wrap pet.ErrNotFound and
// pet.ErrIdempotencyConflict where those apply.
type PetStore interface {
	// Create stores np (already normalized and validated). With idem set a
	// retry returns the original pet and replayed true.
	Create(ctx context.Context, np pet.NewPet, idem *pet.Idempotency) (p pet.Pet, replayed bool, err error)
	Get(ctx context.Context, id int64) (pet.Pet, error)
	List(ctx context.Context, q pet.ListQuery) ([]pet.Pet, error)
}

// Authenticator resolves a bearer token to the caller. It fails with
// apikey.ErrMalformed, ErrUnknown or ErrRevoked for keys that must be
// refused; any other error means it could not decide (answered with 503).
type Authenticator interface {
	Authenticate(ctx context.Context, token string, beforeLookup func() error) (apikey.Principal, error)
}

// Limiter decides whether an authenticated key may make one more request.
// It fails with ratelimit.ErrUnavailable when it cannot decide in fail-closed
// mode.
type Limiter interface {
	Allow(ctx context.Context, key string, p ratelimit.Policy) (ratelimit.Decision, error)
}

// UsageReader reports a key's standing under its policy without counting a
// request. Usage.Degraded marks figures this process made up alone.
type UsageReader interface {
	Usage(ctx context.Context, key string, p ratelimit.Policy) (ratelimit.Usage, error)
}

// KeyThrottle limits one operation per API key.
type KeyThrottle interface {
	Allow(ctx context.Context, key string) (ratelimit.Decision, error)
}

// Throttle limits requests that carry no valid key, per client address.
// Throttled says, without counting, whether an address is out of budget.
type Throttle interface {
	Allow(ctx context.Context, key string) (ratelimit.Decision, error)
	Throttled(ctx context.Context, key string) (bool, error)
}

// Defaults applied by NewServer to zero Config fields.
const (
	DefaultMaxBodyBytes   = 64 << 10
	DefaultIdempotencyTTL = 24 * time.Hour
)

// UsageThrottleLimit is the per-key limit of GET /v1/rate_limit that the
// OpenAPI document states: one request a second on average, in bursts of
// up to 10. Rate equals Burst so that the throttle's rate-limit fields
// ("10s";q=10;w=10) describe the bucket as it is.
func UsageThrottleLimit() ratelimit.ThrottleLimit {
	return ratelimit.ThrottleLimit{Rate: 10, Burst: 10, Period: 10 * time.Second}
}

// Config holds what the public server needs. Store and Auth are required.
type Config struct {
	Store PetStore
	Auth  Authenticator
	// Limiter limits authenticated requests; nil turns limiting off.
	Limiter Limiter
	// Throttle limits requests without a valid key per client IP; nil turns
	// it off.
	Throttle Throttle
	// Usage answers GET /v1/rate_limit, a key's quota, without spending
	// any of it; nil leaves the operation out (404).
	Usage UsageReader
	// UsageThrottle limits GET /v1/rate_limit per key, so that asking
	// cannot flood Redis; nil leaves it unthrottled.
	UsageThrottle KeyThrottle
	// Logger receives the access log and errors; nil discards them. With
	// a JSONLogHandler the access log costs least.
	Logger *slog.Logger
	// Metrics records request metrics; nil records into an unregistered set.
	Metrics *Metrics
	// TrustedProxies are the networks whose X-Forwarded-For and Forwarded
	// headers are believed when they are the socket peer.
	TrustedProxies []netip.Prefix
	// MaxBodyBytes caps a request body (DefaultMaxBodyBytes when zero).
	MaxBodyBytes int64
	// IdempotencyTTL is how long an Idempotency-Key is remembered
	// (DefaultIdempotencyTTL when zero).
	IdempotencyTTL time.Duration
	// DraftLimitFields adds the two rate-limit fields of
	// draft-ietf-httpapi-ratelimit-headers (RateLimit, RateLimit-Policy)
	// beside the specification's X-RateLimit-Limit, -Remaining and -Reset,
	// which alone are sent by default.
	DraftLimitFields bool

	// now replaces time.Now in tests.
	now func() time.Time
}

// server carries the dependencies every handler and middleware shares.
type server struct {
	store          PetStore
	auth           Authenticator
	limiter        Limiter
	throttle       Throttle
	usage          UsageReader
	usageThrottle  KeyThrottle
	log            *slog.Logger
	accessLog      *JSONLogHandler // log's handler, when it takes the access line directly
	metrics        *Metrics
	proxies        []netip.Prefix
	maxBodyBytes   int64
	idempotencyTTL time.Duration
	draftFields    bool // the draft's rate-limit fields too (setLimitHeaders)
	now            func() time.Time
	openapi        openAPIDocument
	// mux is the finished router, consulted to compute Allow headers and to
	// recognise the deprecated resource before routing completes.
	mux *chi.Mux
}

// NewServer returns the public HTTP handler: /v1 and the OpenAPI document.
func NewServer(cfg Config) http.Handler {
	s := &server{
		store:          cfg.Store,
		auth:           cfg.Auth,
		limiter:        cfg.Limiter,
		throttle:       cfg.Throttle,
		usage:          cfg.Usage,
		usageThrottle:  cfg.UsageThrottle,
		log:            cfg.Logger,
		metrics:        cfg.Metrics,
		proxies:        cfg.TrustedProxies,
		maxBodyBytes:   cfg.MaxBodyBytes,
		idempotencyTTL: cfg.IdempotencyTTL,
		draftFields:    cfg.DraftLimitFields,
		now:            cfg.now,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if h, ok := s.log.Handler().(*JSONLogHandler); ok && h.direct {
		s.accessLog = h
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	if s.maxBodyBytes <= 0 {
		s.maxBodyBytes = DefaultMaxBodyBytes
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.idempotencyTTL <= 0 {
		s.idempotencyTTL = DefaultIdempotencyTTL
	}
	s.openapi = loadOpenAPI()
	s.mux = s.routes()
	return s.mux
}
