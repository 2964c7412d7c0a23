// Package postgres is the production store: pets, idempotency keys and API
// keys in PostgreSQL, shared by every replica. It owns the schema too: its
// migrations are embedded in the binary and applied by Migrate.
//
// Ids come from the database (an identity column), pages are read by keyset
// on the primary key or on (status, id), and an idempotent create records
// its key in the same transaction as the pet, so that concurrent retries on
// different replicas still make exactly one pet.
package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool defaults applied when the connection URL does not set them.
const (
	defaultConnectTimeout        = 5 * time.Second
	defaultMaxConnLifetimeJitter = 5 * time.Minute
	// Queries of the store take milliseconds; a statement running this
	// long is stuck and holds a connection other requests need.
	defaultStatementTimeout = "10s"
	// A transaction left open (a bug, a lost client) must not keep row
	// locks on idempotency keys forever.
	defaultIdleInTxTimeout = "60s"
)

// Open connects a pool to the database at url and checks that it answers.
// maxConns > 0 caps the pool (it overrides pool_max_conns in url). Settings
// given in url (connect_timeout, statement_timeout, pool_* ...) win over the
// defaults applied here.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(url, maxConns)
	if err != nil {
		return nil, err
	}
	return openPool(ctx, cfg)
}

func poolConfig(url string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgconn redacts the password in its parse errors.
		return nil, fmt.Errorf("postgres: parse database URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	if cfg.MaxConnLifetimeJitter <= 0 {
		// Connections opened together must not all be recycled together.
		cfg.MaxConnLifetimeJitter = defaultMaxConnLifetimeJitter
	}
	params := cfg.ConnConfig.RuntimeParams
	for name, value := range map[string]string{
		"application_name":                    "petstore",
		"statement_timeout":                   defaultStatementTimeout,
		"idle_in_transaction_session_timeout": defaultIdleInTxTimeout,
	} {
		if _, ok := params[name]; !ok {
			params[name] = value
		}
	}
	return cfg, nil
}

func openPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// Store keeps pets, idempotency keys and API keys in PostgreSQL. It is safe
// for concurrent use; it does not own the pool (close it after the Store's
// last use).
type Store struct {
	pool       *pgxpool.Pool
	now        func() time.Time
	purgeEvery time.Duration
	purgeBatch int
	// lastPurge is the time (Unix ns, per s.now) of the last opportunistic
	// purge of expired idempotency keys.
	lastPurge atomic.Int64
}

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read the time from now when it records and
// expires idempotency keys. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// WithPurge sets how often (at most) a create also deletes expired
// idempotency keys, and how many per purge. every <= 0 disables it.
// The default is up to 1000 keys once a minute per Store.
func WithPurge(every time.Duration, batch int) Option {
	return func(s *Store) {
		s.purgeEvery = every
		s.purgeBatch = batch
	}
}

// New returns a store on pool, whose database must be migrated (Migrate).
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &Store{
		pool:       pool,
		now:        time.Now,
		purgeEvery: time.Minute,
		purgeBatch: 1000,
	}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}
