package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var embedded embed.FS

// migrationLockClass is the first half of the advisory lock key that
// serializes migrations; the second half is derived from the schema, so
// that only migrations of the same schema wait for each other.
const migrationLockClass = 0x70657473 // "pets"

// migrationName is NNNN_words.sql; NNNN is the version, and files apply in
// version order.
var migrationName = regexp.MustCompile(`^([0-9]{4})_[a-z0-9_]+\.sql$`)

// notAdditiveMarker starts the line of a migration file that says why the
// migration is not additive ("-- not additive: drops pets.legacy, which
// releases before 0007 read"). Every other migration is additive: releases
// that predate it can still serve the schema after it.
const notAdditiveMarker = "-- not additive:"

type migration struct {
	version  string
	name     string
	sql      string
	additive bool
}

// Migrate applies the embedded migrations the database lacks, in order,
// each in its own transaction, and returns the names of those it applied.
// It is safe to run again (it applies nothing) and from several processes
// at once: a session advisory lock makes the others wait, then find nothing
// to do. Tables are created in the first schema of the search_path.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (applied []string, err error) {
	return migrate(ctx, pool, embedded)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) (applied []string, err error) {
	ms, err := loadMigrations(fsys)
	if err != nil {
		return nil, err
	}

	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: acquire connection: %w", err)
	}
	// The connection leaves the pool for good: closing it releases the
	// advisory lock and the session settings below whatever happens.
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	// Waiting for another migrator, or building an index on a large table,
	// may take longer than the pool's statement timeout; ctx bounds it.
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	var schema *string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, fmt.Errorf("postgres: migrate: find schema: %w", err)
	}
	if schema == nil {
		return nil, errors.New("postgres: migrate: no schema of the search_path exists to create tables in")
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", migrationLockClass, *schema); err != nil {
		return nil, fmt.Errorf("postgres: migrate: wait for the migration lock: %w", err)
	}

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    additive   boolean NOT NULL DEFAULT true
)`); err != nil {
		return nil, fmt.Errorf("postgres: migrate: create schema_migrations: %w", err)
	}
	// Releases before the column existed applied only additive migrations.
	if _, err := conn.Exec(ctx, "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS additive boolean NOT NULL DEFAULT true"); err != nil {
		return nil, fmt.Errorf("postgres: migrate: extend schema_migrations: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: read schema_migrations: %w", err)
	}
	done := make(map[string]bool, len(versions))
	for _, v := range versions {
		done[v] = true
	}

	applied = []string{}
	for _, m := range ms {
		if done[m.version] {
			continue
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name, additive) VALUES ($1, $2, $3)", m.version, m.name, m.additive)
			return err
		}); err != nil {
			return applied, fmt.Errorf("postgres: migrate: apply %s: %w", m.name, err)
		}
		applied = append(applied, m.name)
	}
	return applied, nil
}

func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("postgres: list migrations: %w", err)
	}
	var ms []migration
	seen := map[string]string{}
	for _, path := range names {
		name := path[len("migrations/"):]
		match := migrationName.FindStringSubmatch(name)
		if match == nil {
			return nil, fmt.Errorf("postgres: migration %s: name must look like 0001_create_things.sql", name)
		}
		version := match[1]
		if other, dup := seen[version]; dup {
			return nil, fmt.Errorf("postgres: migrations %s and %s share version %s", other, name, version)
		}
		seen[version] = name
		b, err := fs.ReadFile(fsys, path)
		if err != nil {
			return nil, fmt.Errorf("postgres: read migration %s: %w", name, err)
		}
		additive, err := isAdditive(name, string(b))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: version, name: name, sql: string(b), additive: additive})
	}
	if len(ms) == 0 {
		return nil, errors.New("postgres: no migrations found")
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// isAdditive reads a migration's notAdditiveMarker, which must give a reason.
func isAdditive(name, sql string) (bool, error) {
	for line := range strings.Lines(sql) {
		reason, found := strings.CutPrefix(strings.TrimSpace(line), notAdditiveMarker)
		if !found {
			continue
		}
		if strings.TrimSpace(reason) == "" {
			return false, fmt.Errorf("postgres: migration %s: say after %q why releases before it cannot serve the schema", name, notAdditiveMarker)
		}
		return false, nil
	}
	return true, nil
}
