package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/animal-store/petstore/internal/pet/pettest"
	"github.com/animal-store/petstore/internal/testenv"
)

var _ pettest.Store = (*Store)(nil)

// newSchema creates an empty schema with a random name, dropped when the
// test ends, and returns its name.
func newSchema(t *testing.T) string {
	t.Helper()
	url := testenv.PostgresURL(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "petstore_test_" + hex.EncodeToString(b)
	admin := func(ctx context.Context, sql string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := admin(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := admin(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// newPool opens a pool whose sessions use schema, closed when the test ends.
func newPool(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := poolConfig(testenv.PostgresURL(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := openPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newMigratedPool returns a pool on a fresh, migrated schema.
func newMigratedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t, newSchema(t))
	if _, err := Migrate(t.Context(), pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return pool
}

// clocked is a store whose clock the conformance suite can advance.
type clocked struct {
	*Store
	*pettest.Clock
}

func newClocked(t *testing.T, pool *pgxpool.Pool, opts ...Option) clocked {
	clock := pettest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	return clocked{Store: New(pool, append([]Option{WithClock(clock.Now)}, opts...)...), Clock: clock}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pettest.Run(t, func(t *testing.T) pettest.Store {
		return newClocked(t, newMigratedPool(t))
	})
}

func TestPing(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	s := New(pool)
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// The pool's session defaults reach the server.
	var timeout, app string
	if err := pool.QueryRow(t.Context(), "SELECT current_setting('statement_timeout'), current_setting('application_name')").Scan(&timeout, &app); err != nil {
		t.Fatal(err)
	}
	if timeout != defaultStatementTimeout || app != "petstore" {
		t.Errorf("session has statement_timeout=%s application_name=%s", timeout, app)
	}
	pool.Close()
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping on a closed pool succeeded")
	}
}
