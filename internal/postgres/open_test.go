package postgres

import (
	"strings"
	"testing"
	"time"
)

func TestPoolConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		url             string
		maxConns        int32
		wantMaxConns    int32
		wantConnect     time.Duration
		wantStatement   string
		wantApplication string
	}{
		{
			name: "defaults", url: "postgres://u@db:5432/petstore", maxConns: 0,
			wantConnect: defaultConnectTimeout, wantStatement: defaultStatementTimeout, wantApplication: "petstore",
		},
		{
			name: "max conns from the caller", url: "postgres://u@db:5432/petstore?pool_max_conns=3", maxConns: 12,
			wantMaxConns: 12, wantConnect: defaultConnectTimeout, wantStatement: defaultStatementTimeout, wantApplication: "petstore",
		},
		{
			name: "max conns from the URL", url: "postgres://u@db:5432/petstore?pool_max_conns=3", maxConns: 0,
			wantMaxConns: 3, wantConnect: defaultConnectTimeout, wantStatement: defaultStatementTimeout, wantApplication: "petstore",
		},
		{
			name:        "URL settings win",
			url:         "postgres://u@db:5432/petstore?connect_timeout=2&statement_timeout=250ms&application_name=job",
			wantConnect: 2 * time.Second, wantStatement: "250ms", wantApplication: "job",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := poolConfig(tt.url, tt.maxConns)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantMaxConns != 0 && cfg.MaxConns != tt.wantMaxConns {
				t.Errorf("MaxConns = %d, want %d", cfg.MaxConns, tt.wantMaxConns)
			}
			if cfg.ConnConfig.ConnectTimeout != tt.wantConnect {
				t.Errorf("ConnectTimeout = %v, want %v", cfg.ConnConfig.ConnectTimeout, tt.wantConnect)
			}
			params := cfg.ConnConfig.RuntimeParams
			if params["statement_timeout"] != tt.wantStatement || params["application_name"] != tt.wantApplication {
				t.Errorf("runtime params %v, want statement_timeout=%s application_name=%s", params, tt.wantStatement, tt.wantApplication)
			}
			if params["idle_in_transaction_session_timeout"] == "" || cfg.MaxConnLifetimeJitter <= 0 {
				t.Errorf("idle-in-transaction timeout or lifetime jitter unset: %v, %v", params, cfg.MaxConnLifetimeJitter)
			}
		})
	}
}

func TestOpenFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
		want string
	}{
		{"bad URL", "postgres://user:s3cret@db:notaport/petstore", "parse database URL"},
		// Nothing listens on port 1; the error comes at once, not at the
		// first request.
		{"unreachable", "postgres://user:s3cret@127.0.0.1:1/petstore?connect_timeout=2", "connect to 127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool, err := Open(t.Context(), tt.url, 2)
			if err == nil {
				pool.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Open error reveals the password: %v", err)
			}
		})
	}
}
