// Package config holds every setting of the petstore binary: one struct,
// defaults in one place, each setting a command-line flag with a PETSTORE_*
// environment variable twin. Flags win over the environment.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"github.com/animal-store/petstore/ratelimit"
)

// Config is the whole configuration of the service.
type Config struct {
	Addr    string
	OpsAddr string

	Store       string
	DatabaseURL string
	DBMaxConns  int
	// Migrate makes serve apply the migrations before it listens.
	Migrate bool

	Redis Redis

	FailureMode string
	Replicas    int
	TripAfter   time.Duration
	MaxLease    int
	// FinalizeAfter is ratelimit.Options.FinalizeAfter, except that 0
	// means never by itself.
	FinalizeAfter time.Duration
	Pipelines     int
	// PipelineHold is ratelimit.Options.PipelineHold, except that 0 means
	// no hold.
	PipelineHold     time.Duration
	AuthFailureLimit ratelimit.Window
	// DraftFields sends the draft-ietf-httpapi-ratelimit-headers fields
	// (RateLimit, RateLimit-Policy) beside the X-RateLimit-* ones; off by
	// default.
	DraftFields bool

	PlansFile      string
	KeysFile       string
	KeyCacheTTL    time.Duration
	ReloadInterval time.Duration

	TrustedProxies []netip.Prefix
	MaxBodyBytes   int64

	ShutdownGrace time.Duration
	DrainDelay    time.Duration

	LogLevel  string
	LogFormat string

	// Pprof serves net/http/pprof on the ops port.
	Pprof bool
}

// Redis says how to reach Redis: a URL, or an address list with a mode.
type Redis struct {
	URL        string
	Mode       string
	Addrs      []string
	MasterName string
	Username   string
	Password   string
	Timeout    time.Duration
}

// Configured reports whether any Redis was configured.
func (r Redis) Configured() bool { return r.URL != "" || len(r.Addrs) > 0 }

// Default returns the embedded defaults: in-memory pets, limits kept in
// this process, public port 8080, ops port 9090.
func Default() Config {
	return Config{
		Addr:             ":8080",
		OpsAddr:          ":9090",
		Store:            "memory",
		DBMaxConns:       10,
		Redis:            Redis{Mode: "single", Timeout: 50 * time.Millisecond},
		FailureMode:      "open",
		Replicas:         1,
		TripAfter:        time.Second,
		MaxLease:         64,
		FinalizeAfter:    time.Minute,
		Pipelines:        4,
		PipelineHold:     200 * time.Microsecond,
		AuthFailureLimit: ratelimit.Window{Limit: 30, Period: time.Minute},
		KeyCacheTTL:      30 * time.Second,
		ReloadInterval:   5 * time.Second,
		MaxBodyBytes:     64 << 10,
		ShutdownGrace:    20 * time.Second,
		DrainDelay:       5 * time.Second,
		LogLevel:         "info",
		LogFormat:        "json",
	}
}

// Setting is one documented flag with its environment twin.
type Setting struct {
	Flag string
	Env  string
	// Arg names the flag's value in help (URL, DURATION, LIMIT/PERIOD);
	// empty for a boolean.
	Arg    string
	Usage  string
	Secret bool
	// Default is the value's text when nothing sets it; empty for none.
	Default string
	value   flag.Value
}

// Set is the settings registered on one flag set.
type Set struct {
	fs       *flag.FlagSet
	settings []Setting
}

// Groups of settings, for the commands that need only some of them.
var (
	// DatabaseSettings reach PostgreSQL.
	DatabaseSettings = []string{"database-url", "db-max-conns"}
	// RedisSettings reach Redis.
	RedisSettings = []string{"redis-url", "redis-mode", "redis-addrs", "redis-master-name", "redis-username", "redis-password", "redis-timeout"}
)

// Register adds every setting of cfg to fs and returns the registration, so
// that Parse can read the arguments and the environment.
func Register(fs *flag.FlagSet, cfg *Config) *Set {
	s := &Set{fs: fs}
	for _, st := range settings(cfg) {
		s.add(st)
	}
	return s
}

// RegisterOnly adds the settings of cfg named by their flags to fs, in
// the order Register adds them, for a command that reads only those. It
// panics on a name that is no setting: a command's list is code.
func RegisterOnly(fs *flag.FlagSet, cfg *Config, flags ...string) *Set {
	all := settings(cfg)
	for _, name := range flags {
		if !slices.ContainsFunc(all, func(st Setting) bool { return st.Flag == name }) {
			panic("config: no setting --" + name)
		}
	}
	s := &Set{fs: fs}
	for _, st := range all {
		if slices.Contains(flags, st.Flag) {
			s.add(st)
		}
	}
	return s
}

// settings lists every setting of cfg, bound to its field.
func settings(cfg *Config) []Setting {
	st := func(flag, env, arg, usage string, secret bool, v flag.Value) Setting {
		return Setting{Flag: flag, Env: env, Arg: arg, Usage: usage, Secret: secret, value: v}
	}
	return []Setting{
		st("addr", "PETSTORE_ADDR", "HOST:PORT", "public API listen address", false, stringValue{&cfg.Addr}),
		st("ops-addr", "PETSTORE_OPS_ADDR", "HOST:PORT", "operations listen address (/healthz, /readyz, /metrics)", false, stringValue{&cfg.OpsAddr}),
		st("store", "PETSTORE_STORE", "STORE", "pet storage: memory or postgres", false, choiceValue{&cfg.Store, []string{"memory", "postgres"}}),
		st("database-url", "PETSTORE_DATABASE_URL", "URL", "PostgreSQL URL (pets with --store=postgres; API keys managed by 'petstore keys')", true, stringValue{&cfg.DatabaseURL}),
		st("db-max-conns", "PETSTORE_DB_MAX_CONNS", "N", "maximum PostgreSQL connections per replica", false, intValue{p: &cfg.DBMaxConns, min: 1}),
		st("migrate", "PETSTORE_MIGRATE", "", "serve: apply the PostgreSQL migrations (under the migration lock) before listening; for development and single-instance installs", false, boolValue{&cfg.Migrate}),
		st("redis-url", "PETSTORE_REDIS_URL", "URL", "Redis URL, redis:// or rediss:// (empty with no --redis-addrs: limits are kept in this process only)", true, stringValue{&cfg.Redis.URL}),
		st("redis-mode", "PETSTORE_REDIS_MODE", "MODE", "Redis topology: single, sentinel or cluster", false, choiceValue{&cfg.Redis.Mode, []string{"single", "sentinel", "cluster"}}),
		st("redis-addrs", "PETSTORE_REDIS_ADDRS", "HOST:PORT,...", "comma-separated Redis host:port list (sentinels in sentinel mode, seed nodes in cluster mode)", false, listValue{&cfg.Redis.Addrs}),
		st("redis-master-name", "PETSTORE_REDIS_MASTER_NAME", "NAME", "Sentinel master name (sentinel mode)", false, stringValue{&cfg.Redis.MasterName}),
		st("redis-username", "PETSTORE_REDIS_USERNAME", "NAME", "Redis ACL user name", false, stringValue{&cfg.Redis.Username}),
		st("redis-password", "PETSTORE_REDIS_PASSWORD", "PASSWORD", "Redis password (overrides one in the URL)", true, stringValue{&cfg.Redis.Password}),
		st("redis-timeout", "PETSTORE_REDIS_TIMEOUT", "DURATION", "deadline of every Redis call made on a request's behalf", false, durationValue{p: &cfg.Redis.Timeout, min: time.Millisecond}),
		st("ratelimit-failure-mode", "PETSTORE_RATELIMIT_FAILURE_MODE", "MODE", "when Redis is unreachable: open (limit locally per replica) or closed (answer 503)", false, choiceValue{&cfg.FailureMode, []string{"open", "closed"}}),
		st("ratelimit-replicas", "PETSTORE_RATELIMIT_REPLICAS", "N", "replicas assumed until the live count announced through Redis is known; without Redis each replica allows its share of every limit", false, intValue{p: &cfg.Replicas, min: 1}),
		st("ratelimit-trip-after", "PETSTORE_RATELIMIT_TRIP_AFTER", "DURATION", "how long Redis round trips must keep failing (at least 3, no success between) before a replica stops asking Redis; until then a request whose round trip failed is sent once more, and decided locally only if that fails too", false, durationValue{p: &cfg.TripAfter, min: time.Millisecond}),
		st("ratelimit-max-lease", "PETSTORE_RATELIMIT_MAX_LEASE", "N", "most admissions a replica reserves at once for a busy key (1: every request asks Redis)", false, intValue{p: &cfg.MaxLease, min: 1}),
		st("ratelimit-finalize-after", "PETSTORE_RATELIMIT_FINALIZE_AFTER", "DURATION", "how long the replicas' census must show no replica of an older release, and no hold ('petstore limits finalize --hold'), before the fleet finalizes its records by itself (0: only 'petstore limits finalize')", false, durationValue{p: &cfg.FinalizeAfter, min: 0}),
		st("ratelimit-pipelines", "PETSTORE_RATELIMIT_PIPELINES", "N", "Redis round trips of decisions a replica keeps in flight at once, each carrying what queued meanwhile (a batch gathers behind the calls in flight for up to --ratelimit-pipeline-hold); more when Redis is far (lower latency)", false, intValue{p: &cfg.Pipelines, min: 1, max: 64}),
		st("ratelimit-pipeline-hold", "PETSTORE_RATELIMIT_PIPELINE_HOLD", "DURATION", "longest a decision waits for the round trips in flight to be answered before a free pipeline sends it: near Redis, decisions gather into fewer, larger calls (less CPU in Redis and here); 0 sends at once (0-10ms)", false, durationValue{p: &cfg.PipelineHold, min: 0, max: 10 * time.Millisecond}),
		st("ratelimit-draft-fields", "PETSTORE_RATELIMIT_DRAFT_FIELDS", "", "also send the IETF draft's RateLimit and RateLimit-Policy fields beside the specification's X-RateLimit-Limit, -Remaining and -Reset (off: the draft's syntax still changes, every window is at GET /v1/rate_limit, and the two make a page's header map a hash table, about 12% of a replica's throughput serving a page of pets)", false, boolValue{&cfg.DraftFields}),
		st("auth-failure-limit", "PETSTORE_AUTH_FAILURE_LIMIT", "LIMIT/PERIOD", "per-client-IP limit on requests without a valid key, as LIMIT/PERIOD, e.g. 30/1m", false, windowValue{&cfg.AuthFailureLimit}),
		st("plans-file", "PETSTORE_PLANS_FILE", "FILE", "YAML plans file (empty: built-in Free, Pro, Business, Enterprise, LoadTest); reloaded on change", false, stringValue{&cfg.PlansFile}),
		st("keys-file", "PETSTORE_KEYS_FILE", "FILE", "YAML static API keys file; reloaded on change", false, stringValue{&cfg.KeysFile}),
		st("key-cache-ttl", "PETSTORE_KEY_CACHE_TTL", "DURATION", "how long a database key lookup is cached; a revocation takes effect within it (0: no cache)", false, durationValue{p: &cfg.KeyCacheTTL, min: 0}),
		st("reload-interval", "PETSTORE_RELOAD_INTERVAL", "DURATION", "how often the plans and keys files are checked for changes", false, durationValue{p: &cfg.ReloadInterval, min: 100 * time.Millisecond}),
		st("trusted-proxies", "PETSTORE_TRUSTED_PROXIES", "CIDR,...", "comma-separated CIDRs whose X-Forwarded-For/Forwarded headers are believed", false, prefixListValue{&cfg.TrustedProxies}),
		st("max-body-bytes", "PETSTORE_MAX_BODY_BYTES", "BYTES", "largest accepted request body; larger ones get 413", false, int64Value{&cfg.MaxBodyBytes, 2}),
		st("shutdown-grace", "PETSTORE_SHUTDOWN_GRACE", "DURATION", "time in-flight requests get to finish after draining", false, durationValue{p: &cfg.ShutdownGrace, min: 0}),
		st("drain-delay", "PETSTORE_DRAIN_DELAY", "DURATION", "time between readiness turning false and the listener closing, so load balancers stop sending", false, durationValue{p: &cfg.DrainDelay, min: 0}),
		st("log-level", "PETSTORE_LOG_LEVEL", "LEVEL", "debug, info, warn or error", false, choiceValue{&cfg.LogLevel, []string{"debug", "info", "warn", "error"}}),
		st("log-format", "PETSTORE_LOG_FORMAT", "FORMAT", "json or text", false, choiceValue{&cfg.LogFormat, []string{"json", "text"}}),
		st("pprof", "PETSTORE_PPROF", "", "serve the Go runtime's profiles (net/http/pprof) under /debug/pprof/ on the ops port, never on the public port", false, boolValue{&cfg.Pprof}),
	}
}

func (s *Set) add(st Setting) {
	if d := st.value.String(); d != "false" {
		st.Default = d
	}
	s.fs.Var(st.value, st.Flag, fmt.Sprintf("%s (env %s)", st.Usage, st.Env))
	s.settings = append(s.settings, st)
}

// Settings lists the registered settings in registration order.
func (s *Set) Settings() []Setting { return append([]Setting(nil), s.settings...) }

// Parse parses args, then reads the environment variable of every
// setting that args leave unset: flags win. A request for help
// (flag.ErrHelp) is answered before the environment is read, so that a bad
// variable cannot hide the help.
func (s *Set) Parse(args []string, getenv func(string) string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	return s.ApplyEnv(getenv)
}

// ApplyEnv reads the environment variable of every setting whose flag was
// not given, once the arguments are parsed.
func (s *Set) ApplyEnv(getenv func(string) string) error {
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, st := range s.settings {
		v := getenv(st.Env)
		if v == "" || given[st.Flag] {
			continue
		}
		if err := st.value.Set(v); err != nil {
			return fmt.Errorf("%s: %w", st.Env, err)
		}
	}
	return nil
}

// Redacted returns the settings as name=value pairs for logging, with
// secrets masked (and passwords inside URLs masked).
func (s *Set) Redacted() map[string]string {
	out := make(map[string]string, len(s.settings))
	for _, st := range s.settings {
		v := st.value.String()
		if st.Secret && v != "" {
			v = redact(v)
		}
		out[st.Flag] = v
	}
	return out
}

// Validate checks settings that depend on each other.
func (c Config) Validate() error {
	var errs []error
	if c.Store == "postgres" && c.DatabaseURL == "" {
		errs = append(errs, errors.New("--store=postgres needs --database-url (PETSTORE_DATABASE_URL)"))
	}
	if c.Migrate && c.DatabaseURL == "" {
		errs = append(errs, errors.New("--migrate needs --database-url (PETSTORE_DATABASE_URL)"))
	}
	if c.Redis.Mode == "sentinel" && c.Redis.URL == "" && c.Redis.MasterName == "" {
		errs = append(errs, errors.New("--redis-mode=sentinel needs --redis-master-name (PETSTORE_REDIS_MASTER_NAME)"))
	}
	if c.Redis.URL != "" && len(c.Redis.Addrs) > 0 {
		errs = append(errs, errors.New("set either --redis-url or --redis-addrs, not both"))
	}
	if c.Redis.Timeout <= 0 {
		errs = append(errs, errors.New("--redis-timeout must be positive"))
	}
	return errors.Join(errs...)
}

// redact masks a secret; for URLs only the password part is hidden so the
// host stays visible in logs.
func redact(v string) string {
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	return "xxxxx"
}
