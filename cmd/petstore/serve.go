package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/config"
	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/postgres"
	"github.com/animal-store/petstore/ratelimit"
)

// Server timeouts: a slow client cannot hold a connection or a goroutine.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 120 * time.Second
	maxHeaderBytes    = 64 << 10
)

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	// Written as slog's JSON handler writes, with a cheaper access log.
	return slog.New(httpapi.NewJSONLogHandler(w, opts))
}

// runServe runs `petstore serve`.
func runServe(ctx context.Context, c *call) error {
	if err := c.noArgs(); err != nil {
		return err
	}
	cfg, stdout, stderr := c.cfg, c.stdout, c.stderr
	log := newLogger(cfg, stderr)
	log.Info("starting petstore", "version", version, "settings", c.settings.Redacted())
	switch limit, source := memoryLimit(c.getenv, os.DirFS("/")); {
	case limit > 0:
		debug.SetMemoryLimit(limit)
		log.Info("go memory limit set", "bytes", limit, "from", source, "share", memoryLimitShare)
	case source != "":
		log.Info("go memory limit set", "bytes", debug.SetMemoryLimit(-1), "from", source)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(),
	)

	// Storage: pets in memory or PostgreSQL; API keys additionally in
	// PostgreSQL whenever a database is configured.
	var (
		store  httpapi.PetStore
		lookup apikey.KeyLookup
		checks []httpapi.Check
	)
	if cfg.DatabaseURL != "" {
		pool, err := postgres.Open(ctx, cfg.DatabaseURL, int32(cfg.DBMaxConns))
		if err != nil {
			return err
		}
		defer pool.Close()
		if cfg.Migrate {
			if err := migrateAtStart(ctx, pool, log); err != nil {
				return err
			}
		}
		pg := postgres.New(pool)
		lookup = pg
		checks = append(checks, newDatabaseCheck(pool, cfg.Store == "postgres", log, reg))
		if cfg.Store == "postgres" {
			store = pg
		}
	}
	if store == nil {
		store = memstore.New()
	}

	// Keys and plans: a development key when nothing else can authenticate.
	var devKey string
	if cfg.KeysFile == "" && lookup == nil {
		var err error
		if devKey, lookup, err = newDevKey(); err != nil {
			return err
		}
	}
	cacheTTL := cfg.KeyCacheTTL
	if cacheTTL == 0 {
		cacheTTL = -1 // 0 means no cache: every database key is looked up
	}
	auth, err := apikey.NewAuthenticator(apikey.Options{Lookup: lookup, CacheTTL: cacheTTL})
	if err != nil {
		return err
	}
	watcher, err := apikey.NewWatcher(apikey.WatcherOptions{
		PlansFile:  cfg.PlansFile,
		KeysFile:   cfg.KeysFile,
		Interval:   cfg.ReloadInterval,
		Apply:      auth.Update,
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	if err := watcher.Load(); err != nil {
		return err
	}

	// Rate limiting: shared through Redis when configured, else in-process.
	rdb, err := cfg.Redis.NewRedisClient()
	if err != nil {
		return err
	}
	if rdb != nil {
		defer rdb.Close()
	} else {
		log.Warn("no Redis configured: rate limits are kept in this process only; set PETSTORE_REDIS_URL when running more than one replica")
	}
	mode, err := ratelimit.ParseFailureMode(cfg.FailureMode)
	if err != nil {
		return err
	}
	rlOpts := ratelimit.Options{
		Timeout:       cfg.Redis.Timeout,
		FailureMode:   mode,
		Replicas:      cfg.Replicas,
		TripAfter:     cfg.TripAfter,
		MaxLease:      cfg.MaxLease,
		FinalizeAfter: finalizeAfter(cfg.FinalizeAfter),
		Pipelines:     cfg.Pipelines,
		PipelineHold:  pipelineHold(cfg.PipelineHold),
		Registerer:    reg,
		Logger:        log,
	}
	limiter, err := ratelimit.New(rdb, rlOpts)
	if err != nil {
		return err
	}
	defer limiter.Close()
	throttle, err := ratelimit.NewThrottle(rdb, ratelimit.ThrottleLimit{
		Rate:   int(cfg.AuthFailureLimit.Limit),
		Burst:  int(cfg.AuthFailureLimit.Limit),
		Period: cfg.AuthFailureLimit.Period,
	}, rlOpts)
	if err != nil {
		return err
	}
	defer throttle.Close()
	// GET /v1/rate_limit reads a key's counts without spending them; a
	// throttle of its own per key keeps the asking from flooding Redis.
	usageThrottle, err := ratelimit.NewNamedThrottle(rdb, "rate_limit", httpapi.UsageThrottleLimit(), rlOpts)
	if err != nil {
		return err
	}
	defer usageThrottle.Close()

	api := httpapi.NewServer(httpapi.Config{
		Store:          store,
		Auth:           auth,
		Limiter:        limiter,
		Throttle:       throttle,
		Usage:          limiter,
		UsageThrottle:  usageThrottle,
		Logger:         log,
		Metrics:        httpapi.NewMetrics(reg),
		TrustedProxies: cfg.TrustedProxies,
		MaxBodyBytes:   cfg.MaxBodyBytes,

		DraftLimitFields: cfg.DraftFields,
	})
	// Where the replica stands is known, and logged, before it listens.
	readiness := httpapi.NewReadiness(httpapi.ReadinessConfig{Checks: checks, Logger: log})
	readiness.CheckNow(ctx)
	ops := httpapi.NewOpsHandler(httpapi.OpsConfig{Readiness: readiness, Gatherer: reg, Logger: log, Pprof: cfg.Pprof})

	apiLn, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	opsLn, err := net.Listen("tcp", cfg.OpsAddr)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("listen on %s: %w", cfg.OpsAddr, err)
	}
	apiSrv := newHTTPServer(api, log)
	opsSrv := newHTTPServer(ops, log)

	errc := make(chan error, 2)
	go func() { errc <- serveOn(apiSrv, apiLn) }()
	go func() { errc <- serveOn(opsSrv, opsLn) }()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watcher.Run(watchCtx)
	go readiness.Run(watchCtx)

	// The development key is printed before the "listening" line, so that
	// whoever waits for that line (a script, the tests) finds the key too.
	if devKey != "" {
		printDevKey(stdout, devKey, apiLn.Addr())
	}
	log.Info("listening", "api", apiLn.Addr().String(), "ops", opsLn.Addr().String())

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}

	// Drain: stop being ready, give load balancers time to notice, then let
	// in-flight requests finish within the grace period.
	log.Info("shutting down: draining", "drain_delay", cfg.DrainDelay, "grace", cfg.ShutdownGrace)
	readiness.SetDraining(true)
	time.Sleep(cfg.DrainDelay)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	err = apiSrv.Shutdown(sctx)
	if oerr := opsSrv.Shutdown(sctx); err == nil {
		err = oerr
	}
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

func serveOn(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func buildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "petstore",
		Name:      "build_info",
		Help:      "Always 1; the labels say which build is running.",
	}, []string{"version", "goversion"})
	g.WithLabelValues(version, runtime.Version()).Set(1)
	return g
}

// devKeys authenticates the single development key generated when the
// service starts with no keys file and no database.
type devKeys struct{ rec apikey.Record }

func (d devKeys) KeyByHash(_ context.Context, hash string) (apikey.Record, error) {
	if hash == d.rec.Hash {
		return d.rec, nil
	}
	return apikey.Record{}, apikey.ErrUnknown
}

func newDevKey() (string, apikey.KeyLookup, error) {
	key, err := apikey.Generate()
	if err != nil {
		return "", nil, err
	}
	h := apikey.Hash(key)
	return key, devKeys{apikey.Record{
		ID:        apikey.IDFromHash(h),
		Hash:      h,
		Label:     "development",
		Plan:      plan.Free,
		CreatedAt: time.Now(),
	}}, nil
}

func printDevKey(w io.Writer, key string, addr net.Addr) {
	host := addr.String()
	if tcp, ok := addr.(*net.TCPAddr); ok && (tcp.IP.IsUnspecified() || tcp.IP == nil) {
		host = fmt.Sprintf("localhost:%d", tcp.Port)
	}
	base := "http://" + host
	fmt.Fprintf(w, `
No keys file and no database: this is a development API key on the free plan,
valid until the process exits. It is shown only once.

  %s

Try it:

  curl -i -H 'Authorization: Bearer %s' %s/v1/pets

  curl -i -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \
       -d '{"name":"Rex","categoryId":1}' %s/v1/pets

The API's documentation: %s/docs

`, key, key, base, key, base, base)
}

// pipelineHold turns --ratelimit-pipeline-hold (0: none) into
// ratelimit.Options.PipelineHold (0: the default, negative: none).
func pipelineHold(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// finalizeAfter maps --ratelimit-finalize-after to
// ratelimit.Options.FinalizeAfter: 0 (never by itself) is negative there.
func finalizeAfter(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
