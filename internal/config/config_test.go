package config

import (
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/animal-store/petstore/ratelimit"
	"github.com/redis/go-redis/v9"
)

func parse(t *testing.T, args []string, env map[string]string) (Config, *Set, error) {
	t.Helper()
	cfg := Default()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := Register(fs, &cfg)
	err := s.Parse(args, func(k string) string { return env[k] })
	return cfg, s, err
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, _, err := parse(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":8080" || cfg.OpsAddr != ":9090" || cfg.Store != "memory" || cfg.Redis.Configured() || cfg.Pprof || cfg.DraftFields {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"PETSTORE_ADDR":                    ":1234",
		"PETSTORE_STORE":                   "Postgres",
		"PETSTORE_DATABASE_URL":            "postgres://u:secret@db/x",
		"PETSTORE_REDIS_ADDRS":             "a:1, b:2",
		"PETSTORE_REDIS_MODE":              "cluster",
		"PETSTORE_REDIS_TIMEOUT":           "20ms",
		"PETSTORE_TRUSTED_PROXIES":         "10.0.0.0/8, 192.168.1.7",
		"PETSTORE_AUTH_FAILURE_LIMIT":      "5/10s",
		"PETSTORE_RATELIMIT_PIPELINES":     "8",
		"PETSTORE_RATELIMIT_PIPELINE_HOLD": "1ms",
		"PETSTORE_RATELIMIT_DRAFT_FIELDS":  "true",
	}
	cfg, s, err := parse(t, []string{"--addr", ":4321"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":4321" {
		t.Errorf("flag must win over env, got %q", cfg.Addr)
	}
	if cfg.Store != "postgres" || cfg.DatabaseURL == "" {
		t.Errorf("store settings: %q %q", cfg.Store, cfg.DatabaseURL)
	}
	if got := strings.Join(cfg.Redis.Addrs, "|"); got != "a:1|b:2" || cfg.Redis.Mode != "cluster" || cfg.Redis.Timeout != 20*time.Millisecond {
		t.Errorf("redis settings: %+v", cfg.Redis)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32")}
	if len(cfg.TrustedProxies) != 2 || cfg.TrustedProxies[0] != want[0] || cfg.TrustedProxies[1] != want[1] {
		t.Errorf("trusted proxies: %v", cfg.TrustedProxies)
	}
	if cfg.AuthFailureLimit != (ratelimit.Window{Limit: 5, Period: 10 * time.Second}) {
		t.Errorf("auth failure limit: %v", cfg.AuthFailureLimit)
	}
	if cfg.Pipelines != 8 || cfg.PipelineHold != time.Millisecond {
		t.Errorf("ratelimit pipelines: %d, hold %s", cfg.Pipelines, cfg.PipelineHold)
	}
	if !cfg.DraftFields {
		t.Errorf("PETSTORE_RATELIMIT_DRAFT_FIELDS=true left the draft's fields off")
	}
	red := s.Redacted()
	if strings.Contains(red["database-url"], "secret") || !strings.Contains(red["database-url"], "db") {
		t.Errorf("database url not redacted properly: %q", red["database-url"])
	}
}

func TestPprof(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, false},
		{[]string{"--pprof"}, nil, true},
		{nil, map[string]string{"PETSTORE_PPROF": "true"}, true},
		{nil, map[string]string{"PETSTORE_PPROF": "1"}, true},
		{[]string{"--pprof=false"}, map[string]string{"PETSTORE_PPROF": "true"}, false}, // the flag wins
	}
	for _, tt := range tests {
		cfg, _, err := parse(t, tt.args, tt.env)
		if err != nil || cfg.Pprof != tt.want {
			t.Errorf("args %q env %v: Pprof = %v, %v; want %v", tt.args, tt.env, cfg.Pprof, err, tt.want)
		}
	}
}

func TestBadValuesNameTheSetting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad store env", nil, map[string]string{"PETSTORE_STORE": "mysql"}, "PETSTORE_STORE"},
		{"bad duration env", nil, map[string]string{"PETSTORE_REDIS_TIMEOUT": "soon"}, "PETSTORE_REDIS_TIMEOUT"},
		{"bad cidr env", nil, map[string]string{"PETSTORE_TRUSTED_PROXIES": "10.0.0.0/99"}, "PETSTORE_TRUSTED_PROXIES"},
		{"bad window env", nil, map[string]string{"PETSTORE_AUTH_FAILURE_LIMIT": "lots"}, "PETSTORE_AUTH_FAILURE_LIMIT"},
		{"bad int flag", []string{"--ratelimit-replicas", "0"}, nil, "ratelimit-replicas"},
		{"too many pipelines", []string{"--ratelimit-pipelines", "65"}, nil, "ratelimit-pipelines"},
		{"no pipeline", nil, map[string]string{"PETSTORE_RATELIMIT_PIPELINES": "0"}, "PETSTORE_RATELIMIT_PIPELINES"},
		{"hold too long", []string{"--ratelimit-pipeline-hold", "11ms"}, nil, "ratelimit-pipeline-hold"},
		{"negative hold", nil, map[string]string{"PETSTORE_RATELIMIT_PIPELINE_HOLD": "-1us"}, "PETSTORE_RATELIMIT_PIPELINE_HOLD"},
		{"too small body", []string{"--max-body-bytes", "1"}, nil, "max-body-bytes"},
		{"bad bool env", nil, map[string]string{"PETSTORE_MIGRATE": "sometimes"}, "PETSTORE_MIGRATE"},
		{"bad pprof env", nil, map[string]string{"PETSTORE_PPROF": "maybe"}, "PETSTORE_PPROF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := parse(t, tt.args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	c := Default()
	c.Store = "postgres"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "database-url") {
		t.Errorf("postgres without url: %v", err)
	}
	c = Default()
	c.Migrate = true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--migrate needs") {
		t.Errorf("migrate without url: %v", err)
	}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, false},
		{[]string{"--migrate"}, nil, true},
		{nil, map[string]string{"PETSTORE_MIGRATE": "true"}, true},
		{[]string{"--migrate=false"}, map[string]string{"PETSTORE_MIGRATE": "1"}, false},
	} {
		if cfg, _, err := parse(t, tt.args, tt.env); err != nil || cfg.Migrate != tt.want {
			t.Errorf("%v %v: Migrate = %v, %v; want %v", tt.args, tt.env, cfg.Migrate, err, tt.want)
		}
	}
	c = Default()
	c.Redis.URL, c.Redis.Addrs = "redis://x", []string{"y:1"}
	if err := c.Validate(); err == nil {
		t.Error("url and addrs together must be rejected")
	}
}

func TestNewRedisClient(t *testing.T) {
	t.Parallel()
	for _, r := range []Redis{
		{URL: "redis://:pw@127.0.0.1:6379/0", Mode: "single", Timeout: time.Millisecond},
		{URL: "redis://127.0.0.1:7000?addr=127.0.0.1:7001", Mode: "cluster", Timeout: time.Millisecond},
		{URL: "redis://127.0.0.1:26379?master_name=mymaster", Mode: "sentinel", Timeout: time.Millisecond},
		{Addrs: []string{"127.0.0.1:6379"}, Mode: "single", Timeout: time.Millisecond},
		{Addrs: []string{"a:1", "b:2"}, Mode: "cluster", Timeout: time.Millisecond},
		{Addrs: []string{"a:1"}, Mode: "sentinel", MasterName: "m", Timeout: time.Millisecond},
	} {
		c, err := r.NewRedisClient()
		if err != nil || c == nil {
			t.Errorf("%+v: %v", r, err)
			continue
		}
		c.Close()
	}
	if _, err := (Redis{Addrs: []string{"a:1", "b:2"}, Mode: "single"}).NewRedisClient(); err == nil {
		t.Error("two addresses in single mode must be rejected")
	}
	if c, err := (Redis{}).NewRedisClient(); c != nil || err != nil {
		t.Error("no redis configured must give nil, nil")
	}
}

// TestPipelineBuffersAreSmall: single and sentinel clients, from
// addresses or a URL, give their pipeline connections pipelineBuffer each
// way (go-redis's default of 128 KiB made a replica's heap follow its pool),
// and a URL's own sizes win.
func TestPipelineBuffersAreSmall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r           Redis
		read, write int
	}{
		{Redis{URL: "redis://127.0.0.1:6379/0", Mode: "single"}, pipelineBuffer, pipelineBuffer},
		{Redis{URL: "redis://127.0.0.1:26379?master_name=m", Mode: "sentinel"}, pipelineBuffer, pipelineBuffer},
		{Redis{Addrs: []string{"127.0.0.1:6379"}, Mode: "single"}, pipelineBuffer, pipelineBuffer},
		{Redis{Addrs: []string{"a:1"}, Mode: "sentinel", MasterName: "m"}, pipelineBuffer, pipelineBuffer},
		{Redis{URL: "redis://127.0.0.1:6379/0?pipeline_read_buffer_size=65536", Mode: "single"}, 65536, pipelineBuffer},
	} {
		c.r.Timeout = time.Millisecond
		rdb, err := c.r.NewRedisClient()
		if err != nil {
			t.Fatalf("%+v: %v", c.r, err)
		}
		o := rdb.(*redis.Client).Options()
		if o.PipelineReadBufferSize != c.read || o.PipelineWriteBufferSize != c.write {
			t.Errorf("%+v: pipeline buffers %d/%d, want %d/%d", c.r, o.PipelineReadBufferSize, o.PipelineWriteBufferSize, c.read, c.write)
		}
		rdb.Close()
	}
}

func TestPipelineHoldZeroIsAccepted(t *testing.T) {
	t.Parallel()
	if d := Default().PipelineHold; d != 200*time.Microsecond {
		t.Errorf("default hold %s, want 200µs", d)
	}
	cfg, _, err := parse(t, []string{"--ratelimit-pipeline-hold", "0"}, nil)
	if err != nil || cfg.PipelineHold != 0 {
		t.Fatalf("hold 0: %s, %v", cfg.PipelineHold, err)
	}
}

// TestRegisterOnly: a command that reads some settings registers those
// alone, reads only their environment variables, and names the rest
// unknown flags.
func TestRegisterOnly(t *testing.T) {
	t.Parallel()
	cfg := Default()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := RegisterOnly(fs, &cfg, append([]string{"plans-file"}, RedisSettings...)...)
	var got []string
	for _, st := range s.Settings() {
		got = append(got, st.Flag)
	}
	if want := "redis-url redis-mode redis-addrs redis-master-name redis-username redis-password redis-timeout plans-file"; strings.Join(got, " ") != want {
		t.Errorf("settings %q, want %q (in Register's order)", got, want)
	}
	env := map[string]string{"PETSTORE_REDIS_ADDRS": "a:1", "PETSTORE_STORE": "nonsense", "PETSTORE_ADDR": ":1"}
	if err := s.Parse([]string{"--plans-file", "p.yaml"}, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("an unregistered setting's variable was read: %v", err)
	}
	if cfg.PlansFile != "p.yaml" || len(cfg.Redis.Addrs) != 1 || cfg.Addr != ":8080" {
		t.Errorf("config %+v", cfg)
	}
	if err := s.Parse([]string{"--addr", ":1"}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "-addr") {
		t.Errorf("--addr on a command without it: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("RegisterOnly took a name that is no setting")
		}
	}()
	RegisterOnly(flag.NewFlagSet("test", flag.ContinueOnError), &cfg, "no-such-setting")
}

// TestHelpBeforeEnvironment: a bad variable cannot hide the help, and a
// flag given leaves its variable unread.
func TestHelpBeforeEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PETSTORE_REDIS_TIMEOUT": "soon"}
	if _, _, err := parse(t, []string{"--help"}, env); err != flag.ErrHelp {
		t.Errorf("--help with a bad variable: %v, want flag.ErrHelp", err)
	}
	if cfg, _, err := parse(t, []string{"--redis-timeout", "1s"}, env); err != nil || cfg.Redis.Timeout != time.Second {
		t.Errorf("a flag over a bad variable: %v, %s", err, cfg.Redis.Timeout)
	}
}

// TestSettingsDescribeThemselves: every setting names its value for help
// (a boolean none) and states its default.
func TestSettingsDescribeThemselves(t *testing.T) {
	t.Parallel()
	_, s, err := parse(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range s.Settings() {
		_, isBool := st.value.(boolValue)
		if (st.Arg == "") != isBool {
			t.Errorf("--%s: Arg %q", st.Flag, st.Arg)
		}
	}
	defaults := map[string]string{}
	for _, st := range s.Settings() {
		defaults[st.Flag] = st.Default
	}
	if defaults["addr"] != ":8080" || defaults["auth-failure-limit"] != "30/1m" || defaults["pprof"] != "" || defaults["database-url"] != "" {
		t.Errorf("defaults %v", defaults)
	}
}
