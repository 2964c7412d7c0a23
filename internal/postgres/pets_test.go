package postgres

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/animal-store/petstore/internal/pet"
)

// Pages must be index range scans that stop after LIMIT rows: no Seq Scan
// and no Sort, whatever the page's position, with the plans the server
// picks for literal values and the generic plan it may cache for the
// prepared statements the pool uses.
func TestListPlansUseIndexes(t *testing.T) {
	t.Parallel()
	pool := newMigratedPool(t)
	ctx := t.Context()
	const rows = 60000
	// The first third sold (an import of old pets), then uneven shares
	// (60% available, 30% sold, 10% pending) interleaved.
	if _, err := pool.Exec(ctx, `INSERT INTO pets (name, category_id, status)
SELECT 'pet ' || g, 1 + g % 7,
       CASE WHEN g <= $1 / 3 THEN 'sold'
            WHEN g % 10 < 6 THEN 'available' WHEN g % 10 < 9 THEN 'sold' ELSE 'pending' END
FROM generate_series(1, $1) AS g`, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE pets"); err != nil {
		t.Fatal(err)
	}

	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The session settings below must not go back to the pool.
	conn := pc.Hijack()
	defer conn.Close(ctx)

	// EXPLAIN EXECUTE of a prepared statement shows the plan the server
	// would use for it: a custom plan for the values, or the generic one
	// under force_generic_plan.
	for name, sql := range map[string]string{"list": sqlListPets, "list_by_status": sqlListPetsByStatus} {
		if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
			t.Fatal(err)
		}
	}
	explain := func(name string, args ...any) string {
		t.Helper()
		// EXECUTE takes no bind parameters; the values here are the test's own.
		lits := make([]string, len(args))
		for i, a := range args {
			if s, ok := a.(string); ok {
				lits[i] = "'" + s + "'"
			} else {
				lits[i] = fmt.Sprint(a)
			}
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(lits, ", ")+")")
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	check := func(mode, what, plan, index string) {
		t.Helper()
		if !strings.Contains(plan, "Index Scan using "+index) || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Errorf("%s plan for %s: want an index scan on %s without Seq Scan or Sort, got:\n%s", mode, what, index, plan)
		}
	}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, after := range []int64{0, rows / 2, rows - 100} {
			for _, st := range pet.Statuses {
				what := fmt.Sprintf("status=%s after=%d", st, after)
				check(mode, what, explain("list_by_status", string(st), after, 21), "pets_status_id_idx")
			}
			check(mode, fmt.Sprintf("after=%d", after), explain("list", after, 21), "pets_pkey")
		}
	}
}

// The table enforces the domain rules itself: a writer that bypasses the
// service's validation still cannot store a pet the service cannot serve.
func TestPetConstraints(t *testing.T) {
	t.Parallel()
	pool := newMigratedPool(t)
	tests := []struct {
		name           string
		np             pet.NewPet
		wantConstraint string
	}{
		{"valid", pet.NewPet{Name: "Rex", CategoryID: 1, Status: pet.StatusAvailable}, ""},
		{"longest name", pet.NewPet{Name: strings.Repeat("🐕", pet.MaxNameLength), CategoryID: 1, Status: pet.StatusSold}, ""},
		{"empty name", pet.NewPet{Name: "", CategoryID: 1, Status: pet.StatusSold}, "pets_name_length"},
		{"name too long", pet.NewPet{Name: strings.Repeat("🐕", pet.MaxNameLength+1), CategoryID: 1, Status: pet.StatusSold}, "pets_name_length"},
		{"untrimmed name", pet.NewPet{Name: " Rex", CategoryID: 1, Status: pet.StatusSold}, "pets_name_trimmed"},
		{"tab in name", pet.NewPet{Name: "Re\tx", CategoryID: 1, Status: pet.StatusSold}, "pets_name_no_control"},
		{"DEL in name", pet.NewPet{Name: "Re\x7fx", CategoryID: 1, Status: pet.StatusSold}, "pets_name_no_control"},
		{"C1 control in name", pet.NewPet{Name: "Re\u0085x", CategoryID: 1, Status: pet.StatusSold}, "pets_name_no_control"},
		{"zero category", pet.NewPet{Name: "Rex", CategoryID: 0, Status: pet.StatusSold}, "pets_category_id_positive"},
		{"negative category", pet.NewPet{Name: "Rex", CategoryID: -3, Status: pet.StatusSold}, "pets_category_id_positive"},
		{"unknown status", pet.NewPet{Name: "Rex", CategoryID: 1, Status: "lost"}, "pets_status_valid"},
		{"empty status", pet.NewPet{Name: "Rex", CategoryID: 1, Status: ""}, "pets_status_valid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The table accepts exactly the normalized, valid pets.
			if domainOK := tt.np.Normalize() == tt.np && tt.np.Validate() == nil; domainOK != (tt.wantConstraint == "") {
				t.Fatalf("domain accepts=%v, table accepts=%v", domainOK, tt.wantConstraint == "")
			}
			_, err := pool.Exec(t.Context(), "INSERT INTO pets (name, category_id, status) VALUES ($1, $2, $3)", tt.np.Name, tt.np.CategoryID, tt.np.Status)
			if tt.wantConstraint == "" {
				if err != nil {
					t.Fatalf("insert: %v", err)
				}
				return
			}
			pgErr, ok := errors.AsType[*pgconn.PgError](err)
			if !ok || pgErr.ConstraintName != tt.wantConstraint {
				t.Fatalf("insert = %v, want a violation of %s", err, tt.wantConstraint)
			}
		})
	}
}

func countKeys(t *testing.T, s clocked) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPurgeExpired(t *testing.T) {
	t.Parallel()
	s := newClocked(t, newMigratedPool(t), WithPurge(0, 0))
	ctx := t.Context()
	np := pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusAvailable}
	for i := range 8 {
		ttl := time.Minute
		if i >= 5 {
			ttl = time.Hour
		}
		if _, _, err := s.Create(ctx, np, &pet.Idempotency{Key: fmt.Sprint("k", i), Fingerprint: "f", TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	s.Advance(2 * time.Minute)
	for _, want := range []int64{2, 2, 1, 0} {
		n, err := s.PurgeExpired(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("PurgeExpired deleted %d keys, want %d", n, want)
		}
	}
	if n := countKeys(t, s); n != 3 {
		t.Fatalf("%d keys left, want the 3 live ones", n)
	}
	// Purging never touches pets.
	if ps, err := s.List(ctx, pet.ListQuery{Limit: 100}); err != nil || len(ps) != 8 {
		t.Fatalf("List = %d pets, %v; want 8", len(ps), err)
	}
}

// Keyed creates purge expired keys by themselves, at most once per period.
func TestCreatePurgesExpiredKeys(t *testing.T) {
	t.Parallel()
	s := newClocked(t, newMigratedPool(t), WithPurge(time.Minute, 100))
	ctx := t.Context()
	create := func(key string) {
		t.Helper()
		if _, _, err := s.Create(ctx, pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusSold}, &pet.Idempotency{Key: key, Fingerprint: "f", TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	create("a") // purges (nothing yet) and starts the period
	create("b")
	s.Advance(30 * time.Second)
	create("c") // within the period: a and b stay, though expired
	if n := countKeys(t, s); n != 3 {
		t.Fatalf("%d keys, want 3 (no purge within the period)", n)
	}
	s.Advance(31 * time.Second)
	create("d") // a new period: a, b and c go
	if n := countKeys(t, s); n != 1 {
		t.Fatalf("%d keys, want 1 after the periodic purge", n)
	}
}

// Replicas race on one key through separate pools; still one pet.
func TestSameKeyAcrossPools(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	first := newPool(t, schema)
	if _, err := Migrate(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	stores := []*Store{New(first), New(newPool(t, schema))}
	const perStore = 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ids   = map[int64]int{}
		fresh int
	)
	start := make(chan struct{})
	for _, s := range stores {
		for range perStore {
			wg.Go(func() {
				<-start
				p, replayed, err := s.Create(t.Context(), pet.NewPet{Name: "r", CategoryID: 1, Status: pet.StatusPending}, &pet.Idempotency{Key: "k/1", Fingerprint: "f", TTL: time.Hour})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				ids[p.ID]++
				if !replayed {
					fresh++
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if len(ids) != 1 || fresh != 1 {
		t.Fatalf("callers saw pets %v with %d fresh creates; want one pet, created once", ids, fresh)
	}
	ps, err := stores[1].List(t.Context(), pet.ListQuery{Limit: 100})
	if err != nil || len(ps) != 1 {
		t.Fatalf("List = %v, %v; want one pet", ps, err)
	}
}

// A create that is not told to remember its key (no TTL) is a plain create.
func TestCreateWithoutTTLIsPlain(t *testing.T) {
	t.Parallel()
	s := newClocked(t, newMigratedPool(t))
	for range 2 {
		_, replayed, err := s.Create(t.Context(), pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusSold}, &pet.Idempotency{Key: "k", Fingerprint: "f"})
		if err != nil || replayed {
			t.Fatalf("Create = %v, %v; want a new pet", replayed, err)
		}
	}
	if n := countKeys(t, s); n != 0 {
		t.Fatalf("%d keys recorded, want 0", n)
	}
}

func TestErrorsSayWhatFailed(t *testing.T) {
	t.Parallel()
	pool := newMigratedPool(t)
	s := New(pool)
	_, err := s.Get(t.Context(), 7)
	if !errors.Is(err, pet.ErrNotFound) || err.Error() != "postgres: get pet 7: pet not found" {
		t.Fatalf("Get(7) = %v", err)
	}
	pool.Close()
	if _, _, err := s.Create(t.Context(), pet.NewPet{Name: "a", CategoryID: 1, Status: pet.StatusSold}, nil); err == nil || !strings.HasPrefix(err.Error(), "postgres: create pet: ") {
		t.Fatalf("Create on a closed pool = %v", err)
	}
	if _, err := s.List(t.Context(), pet.ListQuery{Limit: 1}); err == nil || !strings.HasPrefix(err.Error(), "postgres: list pets: ") {
		t.Fatalf("List on a closed pool = %v", err)
	}
	if _, err := s.Get(t.Context(), 1); err == nil || errors.Is(err, pet.ErrNotFound) {
		t.Fatalf("Get on a closed pool = %v, want an error other than not found", err)
	}
}
