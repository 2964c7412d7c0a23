package postgres

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration is one schema migration: built into this binary, recorded in a
// database by Migrate, or both.
type Migration struct {
	// Version is the file's NNNN prefix; versions order migrations.
	Version string
	// Name is the file name, NNNN_words.sql.
	Name string
	// Additive reports whether releases that predate the migration can
	// still serve the schema after it (see notAdditiveMarker).
	Additive bool
	// AppliedAt is when Migrate recorded it; zero while it is pending.
	AppliedAt time.Time
}

// SchemaStatus compares the migrations recorded in a database with those
// built into this binary.
type SchemaStatus struct {
	// Applied are the migrations the database records, in version order,
	// unknown ones included.
	Applied []Migration
	// Pending are built-in migrations the database does not record.
	Pending []Migration
	// Unknown are recorded migrations this binary does not have: a newer
	// release applied them.
	Unknown []Migration
	// Needed is the newest built-in version: this release needs the schema
	// at least there.
	Needed string
}

// Version is the newest recorded version, "" when nothing is recorded.
func (s SchemaStatus) Version() string {
	if len(s.Applied) == 0 {
		return ""
	}
	return s.Applied[len(s.Applied)-1].Version
}

// Err reports whether this release can serve the schema: nil when every
// built-in migration is applied and every unknown (newer) one is additive,
// else a *SchemaError saying what is wrong and what to do.
//
// This is the one place that decides it; readiness and `migrate --status`
// both ask here.
func (s SchemaStatus) Err() error {
	e := &SchemaError{Found: s.Version(), Needed: s.Needed}
	for _, m := range s.Pending {
		e.Pending = append(e.Pending, m.Name)
	}
	for _, m := range s.Unknown {
		if !m.Additive {
			e.NotAdditive = append(e.NotAdditive, m.Name)
		}
	}
	if len(e.Pending) == 0 && len(e.NotAdditive) == 0 {
		return nil
	}
	return e
}

// SchemaError says why this release cannot serve a database's schema.
type SchemaError struct {
	// Found is the database's schema version ("" when it has none), Needed
	// the one this release needs.
	Found, Needed string
	// Pending names the built-in migrations the database lacks.
	Pending []string
	// NotAdditive names newer migrations, unknown to this release, that
	// releases before them cannot serve.
	NotAdditive []string
}

func (e *SchemaError) Error() string {
	found := e.Found
	if found == "" {
		found = "none (no migrations applied)"
	}
	if len(e.Pending) > 0 {
		return fmt.Sprintf("database schema version is %s, this release needs %s (pending: %s): run `petstore migrate`",
			found, e.Needed, strings.Join(e.Pending, ", "))
	}
	return fmt.Sprintf("database schema version is %s, newer than this release's %s, and %s is not additive: this release cannot serve it; deploy a release that has it",
		found, e.Needed, strings.Join(e.NotAdditive, ", "))
}

// ReadStatus reads the migrations recorded in pool's database (in the first
// schema of the search_path, where Migrate records them) and compares them
// with the built-in ones. It only reads: no lock, nothing created, so a
// replica or a pipeline can call it at any time.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool) (SchemaStatus, error) {
	return readStatus(ctx, pool, embedded)
}

func readStatus(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) (SchemaStatus, error) {
	ms, err := loadMigrations(fsys)
	if err != nil {
		return SchemaStatus{}, err
	}
	st := SchemaStatus{Needed: ms[len(ms)-1].version}

	var exists bool
	if err := pool.QueryRow(ctx, `SELECT current_schema() IS NOT NULL
    AND to_regclass(quote_ident(current_schema()) || '.schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return SchemaStatus{}, fmt.Errorf("postgres: read schema version: %w", err)
	}
	var recorded []Migration
	if exists {
		// A table made by a release before the additive column lacks it;
		// its rows are additive (see migrate).
		rows, err := pool.Query(ctx, `SELECT version, name, applied_at,
    COALESCE((to_jsonb(m) ->> 'additive')::boolean, true)
FROM schema_migrations m ORDER BY version`)
		if err != nil {
			return SchemaStatus{}, fmt.Errorf("postgres: read schema version: %w", err)
		}
		recorded, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Migration, error) {
			var m Migration
			err := row.Scan(&m.Version, &m.Name, &m.AppliedAt, &m.Additive)
			return m, err
		})
		if err != nil {
			return SchemaStatus{}, fmt.Errorf("postgres: read schema version: %w", err)
		}
	}

	builtIn := make(map[string]bool, len(ms))
	for _, m := range ms {
		builtIn[m.version] = true
	}
	done := make(map[string]bool, len(recorded))
	for _, m := range recorded {
		done[m.Version] = true
		st.Applied = append(st.Applied, m)
		if !builtIn[m.Version] {
			st.Unknown = append(st.Unknown, m)
		}
	}
	for _, m := range ms {
		if !done[m.version] {
			st.Pending = append(st.Pending, Migration{Version: m.version, Name: m.name, Additive: m.additive})
		}
	}
	return st, nil
}
