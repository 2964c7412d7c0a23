package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/animal-store/petstore/internal/pet"
)

func names(ms []Migration) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// ReadStatus through a schema's life: nothing, migrated, then rolled back
// under a newer release's additive and non-additive migrations.
func TestReadStatus(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	want := embeddedNames(t)
	needed := mustEmbedded(t)[len(want)-1].version

	st, err := ReadStatus(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Version() != "" || len(st.Applied) != 0 || !slices.Equal(names(st.Pending), want) || st.Needed != needed {
		t.Fatalf("empty schema: %+v", st)
	}
	var se *SchemaError
	if err := st.Err(); !errors.As(err, &se) || len(se.Pending) != len(want) ||
		!strings.Contains(err.Error(), "version is none") || !strings.Contains(err.Error(), "needs "+needed) ||
		!strings.Contains(err.Error(), "run `petstore migrate`") {
		t.Fatalf("empty schema: Err = %v", err)
	}

	if _, err := Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if st, err = ReadStatus(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if st.Err() != nil || st.Version() != needed || !slices.Equal(names(st.Applied), want) || len(st.Pending)+len(st.Unknown) != 0 {
		t.Fatalf("migrated: %+v, Err = %v", st, st.Err())
	}
	for _, m := range st.Applied {
		if m.AppliedAt.IsZero() || !m.Additive {
			t.Errorf("applied %+v", m)
		}
	}

	// A newer release applied an additive migration: still servable.
	if _, err := pool.Exec(t.Context(), "INSERT INTO schema_migrations (version, name) VALUES ('9998', '9998_add_things.sql')"); err != nil {
		t.Fatal(err)
	}
	if st, err = ReadStatus(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if st.Err() != nil || st.Version() != "9998" || !slices.Equal(names(st.Unknown), []string{"9998_add_things.sql"}) {
		t.Fatalf("newer additive: %+v, Err = %v", st, st.Err())
	}

	// Then one that is not additive: this release must not serve.
	if _, err := pool.Exec(t.Context(), "INSERT INTO schema_migrations (version, name, additive) VALUES ('9999', '9999_drop_things.sql', false)"); err != nil {
		t.Fatal(err)
	}
	if st, err = ReadStatus(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if err := st.Err(); !errors.As(err, &se) || !slices.Equal(se.NotAdditive, []string{"9999_drop_things.sql"}) ||
		se.Found != "9999" || !strings.Contains(err.Error(), "not additive") {
		t.Fatalf("newer, not additive: Err = %v", err)
	}
}

// A pending migration in the middle counts, even under newer ones.
func TestReadStatusGap(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	fsys := fstest.MapFS{
		"migrations/0001_a.sql": {Data: []byte("CREATE TABLE a (id int);")},
		"migrations/0002_b.sql": {Data: []byte("CREATE TABLE b (id int);")},
	}
	if _, err := migrate(t.Context(), pool, fstest.MapFS{"migrations/0001_a.sql": fsys["migrations/0001_a.sql"]}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), "INSERT INTO schema_migrations (version, name) VALUES ('0003', '0003_c.sql')"); err != nil {
		t.Fatal(err)
	}
	st, err := readStatus(t.Context(), pool, fsys)
	if err != nil {
		t.Fatal(err)
	}
	var se *SchemaError
	if !errors.As(st.Err(), &se) || !slices.Equal(se.Pending, []string{"0002_b.sql"}) || se.Found != "0003" || se.Needed != "0002" {
		t.Fatalf("Err = %v (%+v)", st.Err(), st)
	}
}

// With no schema of the search_path to look in, nothing is applied.
func TestReadStatusWithoutSchema(t *testing.T) {
	t.Parallel()
	pool := newPool(t, "petstore_test_no_such_schema")
	st, err := ReadStatus(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Applied) != 0 || len(st.Pending) == 0 || st.Err() == nil {
		t.Fatalf("%+v", st)
	}
}

// Pet queries on an unmigrated schema fail as unavailable (503), not as
// internal errors.
func TestUnmigratedStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	s := New(newPool(t, newSchema(t)))
	_, err := s.List(t.Context(), pet.ListQuery{Limit: 10})
	if !errors.Is(err, pet.ErrUnavailable) || !strings.Contains(err.Error(), `"pets" does not exist`) {
		t.Errorf("List = %v, want pet.ErrUnavailable", err)
	}
	if _, err := s.Get(t.Context(), 1); !errors.Is(err, pet.ErrUnavailable) {
		t.Errorf("Get = %v, want pet.ErrUnavailable", err)
	}
	np := pet.NewPet{Name: "Rex", CategoryID: 1, Status: pet.StatusAvailable}
	if _, _, err := s.Create(t.Context(), np, nil); !errors.Is(err, pet.ErrUnavailable) {
		t.Errorf("Create = %v, want pet.ErrUnavailable", err)
	}
	if _, _, err := s.Create(t.Context(), np, &pet.Idempotency{Key: "k", Fingerprint: "f", TTL: time.Minute}); !errors.Is(err, pet.ErrUnavailable) {
		t.Errorf("keyed Create = %v, want pet.ErrUnavailable", err)
	}
}

// Pet queries on a database that cannot be reached fail as unavailable
// (503), not as internal errors; a caller that gives up is neither.
func TestUnreachableStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1; the pool connects lazily.
	cfg, err := poolConfig("postgres://petstore@127.0.0.1:1/petstore?connect_timeout=2", 2)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := New(pool)
	if _, err := s.List(t.Context(), pet.ListQuery{Limit: 10}); !errors.Is(err, pet.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("List = %v, want pet.ErrUnavailable", err)
	}
	if _, _, err := s.Create(t.Context(), pet.NewPet{Name: "Rex", CategoryID: 1, Status: pet.StatusAvailable}, &pet.Idempotency{Key: "k", Fingerprint: "f", TTL: time.Minute}); !errors.Is(err, pet.ErrUnavailable) {
		t.Errorf("keyed Create = %v, want pet.ErrUnavailable", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Get(ctx, 1); errors.Is(err, pet.ErrUnavailable) {
		t.Errorf("Get on a canceled context = %v, want no pet.ErrUnavailable", err)
	}
}
