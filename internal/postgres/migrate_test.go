package postgres

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func embeddedNames(t *testing.T) []string {
	t.Helper()
	ms, err := loadMigrations(embedded)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.name)
	}
	return names
}

func appliedVersions(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT version FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

func tableExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestLoadMigrations(t *testing.T) {
	t.Parallel()
	good := &fstest.MapFile{Data: []byte("SELECT 1")}
	tests := []struct {
		name    string
		fsys    fstest.MapFS
		want    []string
		wantErr string
	}{
		{"applied by version", fstest.MapFS{
			"migrations/0010_c.sql": good, "migrations/0002_b.sql": good, "migrations/0001_a.sql": good,
			"migrations/README.md": good,
		}, []string{"0001_a.sql", "0002_b.sql", "0010_c.sql"}, ""},
		{"bad name", fstest.MapFS{"migrations/1_a.sql": good}, nil, "name must look like"},
		{"upper case", fstest.MapFS{"migrations/0001_A.sql": good}, nil, "name must look like"},
		{"shared version", fstest.MapFS{"migrations/0001_a.sql": good, "migrations/0001_b.sql": good}, nil, "share version 0001"},
		{"none", fstest.MapFS{}, nil, "no migrations"},
		{"not additive without a reason", fstest.MapFS{"migrations/0001_a.sql": {Data: []byte("-- not additive:  \nDROP TABLE x;")}}, nil, "say after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, err := loadMigrations(tt.fsys)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("loadMigrations = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, m := range ms {
				names = append(names, m.name)
			}
			if !slices.Equal(names, tt.want) {
				t.Fatalf("order %v, want %v", names, tt.want)
			}
		})
	}
	if len(embeddedNames(t)) == 0 {
		t.Fatal("no embedded migrations")
	}
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	want := embeddedNames(t)

	applied, err := Migrate(t.Context(), pool)
	if err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	if !slices.Equal(applied, want) {
		t.Fatalf("first Migrate applied %v, want %v", applied, want)
	}
	for _, table := range []string{"pets", "idempotency_keys", "api_keys", "schema_migrations"} {
		if !tableExists(t, pool, table) {
			t.Errorf("table %s missing after Migrate", table)
		}
	}
	applied, err = Migrate(t.Context(), pool)
	if err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Migrate applied %v, want nothing", applied)
	}
	if got := appliedVersions(t, pool); len(got) != len(want) {
		t.Fatalf("schema_migrations holds %v after two runs, want %d versions", got, len(want))
	}
}

// Migrators on several pools (as replicas or Jobs would be) all succeed and
// each migration is applied exactly once: the advisory lock makes the
// others wait and then find nothing to do.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	const migrators = 4
	want := embeddedNames(t)
	for round := range 3 {
		schema := newSchema(t)
		pools := make([]*pgxpool.Pool, migrators)
		for i := range pools {
			pools[i] = newPool(t, schema)
		}
		results := make([][]string, migrators)
		errs := make([]error, migrators)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, pool := range pools {
			wg.Go(func() {
				<-start
				results[i], errs[i] = Migrate(t.Context(), pool)
			})
		}
		close(start)
		wg.Wait()

		var all []string
		for i := range migrators {
			if errs[i] != nil {
				t.Fatalf("round %d: migrator %d: %v", round, i, errs[i])
			}
			all = append(all, results[i]...)
		}
		slices.Sort(all)
		if !slices.Equal(all, want) {
			t.Fatalf("round %d: migrators applied %v together, want each of %v once", round, all, want)
		}
	}
}

// A failing migration leaves nothing of itself behind and stops the run;
// the migrations before it stay applied, and a corrected file applies next
// time.
func TestMigrateFailureRollsBack(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	fsys := fstest.MapFS{
		"migrations/0001_first.sql":  {Data: []byte("CREATE TABLE first (id int PRIMARY KEY);")},
		"migrations/0002_second.sql": {Data: []byte("CREATE TABLE second (id int PRIMARY KEY);\nSELECT no_such_function();")},
		"migrations/0003_third.sql":  {Data: []byte("CREATE TABLE third (id int PRIMARY KEY);")},
	}
	applied, err := migrate(t.Context(), pool, fsys)
	if err == nil || !strings.Contains(err.Error(), "0002_second.sql") {
		t.Fatalf("migrate = %v, want an error naming 0002_second.sql", err)
	}
	if !slices.Equal(applied, []string{"0001_first.sql"}) {
		t.Fatalf("applied %v before the failure, want [0001_first.sql]", applied)
	}
	if !tableExists(t, pool, "first") || tableExists(t, pool, "second") || tableExists(t, pool, "third") {
		t.Fatal("want table first only after the failed run")
	}
	if got := appliedVersions(t, pool); !slices.Equal(got, []string{"0001"}) {
		t.Fatalf("schema_migrations = %v, want [0001]", got)
	}

	fsys["migrations/0002_second.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE second (id int PRIMARY KEY);")}
	applied, err = migrate(t.Context(), pool, fsys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(applied, []string{"0002_second.sql", "0003_third.sql"}) {
		t.Fatalf("second run applied %v, want 0002 and 0003", applied)
	}
}

func TestMigrateWithoutSchema(t *testing.T) {
	t.Parallel()
	pool := newPool(t, "petstore_test_no_such_schema")
	if _, err := Migrate(t.Context(), pool); err == nil || !strings.Contains(err.Error(), "search_path") {
		t.Fatalf("Migrate into a missing schema = %v, want an error about the search_path", err)
	}
}

func TestMigrationAdditive(t *testing.T) {
	t.Parallel()
	ms, err := loadMigrations(fstest.MapFS{
		"migrations/0001_a.sql": {Data: []byte("-- Adds a table; not additive: only in prose.\nCREATE TABLE a (id int);")},
		"migrations/0002_b.sql": {Data: []byte("-- Drops a column.\n  -- not additive: drops a.id, which 0001 readers select\nALTER TABLE a DROP COLUMN id;")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ms[0].additive || ms[1].additive {
		t.Fatalf("additive = %v, %v; want true, false", ms[0].additive, ms[1].additive)
	}
}

// TestReadmeListsMigrations keeps the table of additive migrations in
// docs/operations.md, which operators read before a rollback, in step with
// the files.
func TestReadmeListsMigrations(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([0-9]{4}_[a-z0-9_]+\\.sql)` \\| (yes|no) \\|").FindAllSubmatch(readme, -1) {
		listed[string(m[1])] = string(m[2])
	}
	ms := mustEmbedded(t)
	for _, m := range ms {
		want := map[bool]string{true: "yes", false: "no"}[m.additive]
		if listed[m.name] != want {
			t.Errorf("docs/operations.md lists %s as additive %q, want %q", m.name, listed[m.name], want)
		}
	}
	if len(listed) != len(ms) {
		t.Errorf("docs/operations.md lists %d migrations, the binary has %d", len(listed), len(ms))
	}
}

func mustEmbedded(t *testing.T) []migration {
	t.Helper()
	ms, err := loadMigrations(embedded)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// A schema_migrations table made before the additive column existed gets
// the column on the next Migrate, its rows counted as additive.
func TestMigrateExtendsOldBookkeeping(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	if _, err := pool.Exec(t.Context(), `CREATE TABLE schema_migrations (
    version text PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
INSERT INTO schema_migrations (version, name) VALUES ('0000', '0000_before.sql')`); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStatus(t.Context(), pool)
	if err != nil {
		t.Fatalf("ReadStatus on the old table: %v", err)
	}
	if len(st.Unknown) != 1 || !st.Unknown[0].Additive {
		t.Fatalf("old rows read as %+v, want one additive unknown migration", st.Unknown)
	}
	if _, err := Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	var additive []bool
	rows, err := pool.Query(t.Context(), "SELECT additive FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	if additive, err = pgx.CollectRows(rows, pgx.RowTo[bool]); err != nil {
		t.Fatal(err)
	}
	if len(additive) != 1+len(embeddedNames(t)) || slices.Contains(additive, false) {
		t.Fatalf("additive column after Migrate: %v", additive)
	}
}
