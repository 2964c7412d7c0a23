package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/ratelimit"
)

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func record(key, plan string, created time.Time, overrides ...ratelimit.Window) apikey.Record {
	h := hashOf(key)
	return apikey.Record{ID: "key_" + h[:12], Hash: h, Label: "owner of " + key, Plan: plan, Overrides: overrides, CreatedAt: created}
}

func sameRecord(t *testing.T, what string, got, want apikey.Record) {
	t.Helper()
	if got.ID != want.ID || got.Hash != want.Hash || got.Label != want.Label || got.Plan != want.Plan ||
		!slices.Equal(got.Overrides, want.Overrides) || !slices.Equal(got.Candidate, want.Candidate) || !got.CreatedAt.Equal(want.CreatedAt) ||
		(got.RevokedAt == nil) != (want.RevokedAt == nil) ||
		(got.RevokedAt != nil && !got.RevokedAt.Equal(*want.RevokedAt)) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	s := New(newMigratedPool(t))
	ctx := t.Context()
	t0 := time.Date(2030, 5, 6, 7, 8, 9, 123456000, time.UTC)
	free := record("pst_free", "free", t0)
	pro := record("pst_pro", "pro", t0.Add(time.Hour),
		ratelimit.Window{Limit: 500, Period: time.Minute},
		ratelimit.Window{Limit: 20000, Period: 24 * time.Hour},
		ratelimit.Window{Limit: 5, Period: 1500 * time.Millisecond},
		ratelimit.Window{Limit: 7, Period: 90 * time.Second},
	)
	// A candidate of the key's own, periods as the keys file and the
	// command line accept them.
	pro.Candidate = []ratelimit.Window{
		{Limit: 250, Period: time.Minute},
		{Limit: 100000, Period: 7 * 24 * time.Hour},
		{Limit: 3, Period: 1500 * time.Millisecond},
	}
	for _, rec := range []apikey.Record{pro, free} {
		if err := s.CreateKey(ctx, rec); err != nil {
			t.Fatalf("CreateKey(%s): %v", rec.ID, err)
		}
	}

	// Lookups return what was stored, overrides and candidate included.
	for _, want := range []apikey.Record{free, pro} {
		got, err := s.KeyByHash(ctx, want.Hash)
		if err != nil {
			t.Fatalf("KeyByHash(%s): %v", want.ID, err)
		}
		sameRecord(t, "KeyByHash", got, want)
		if got.Revoked() {
			t.Fatalf("%s revoked before RevokeKey", got.ID)
		}
	}
	if _, err := s.KeyByHash(ctx, hashOf("pst_nobody")); !errors.Is(err, apikey.ErrUnknown) {
		t.Fatalf("KeyByHash(unknown) = %v, want apikey.ErrUnknown", err)
	}

	// Oldest first.
	list, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("ListKeys = %d keys, want 2", len(list))
	}
	sameRecord(t, "ListKeys[0]", list[0], free)
	sameRecord(t, "ListKeys[1]", list[1], pro)

	// Revoked keys stay visible, marked revoked; revoking again keeps the
	// first time.
	revoked, err := s.RevokeKey(ctx, free.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !revoked.Revoked() {
		t.Fatalf("RevokeKey returned %+v, not revoked", revoked)
	}
	again, err := s.RevokeKey(ctx, free.ID)
	if err != nil {
		t.Fatal(err)
	}
	sameRecord(t, "second RevokeKey", again, revoked)
	got, err := s.KeyByHash(ctx, free.Hash)
	if err != nil {
		t.Fatal(err)
	}
	sameRecord(t, "KeyByHash of a revoked key", got, revoked)
	if _, err := s.RevokeKey(ctx, "key_nobody"); !errors.Is(err, apikey.ErrUnknown) {
		t.Fatalf("RevokeKey(unknown) = %v, want apikey.ErrUnknown", err)
	}
	if got, _ := s.KeyByHash(ctx, pro.Hash); got.Revoked() {
		t.Fatal("revoking one key revoked another")
	}
}

func TestCreateKeyRefuses(t *testing.T) {
	t.Parallel()
	s := New(newMigratedPool(t))
	ctx := t.Context()
	existing := record("pst_a", "free", time.Time{})
	if err := s.CreateKey(ctx, existing); err != nil {
		t.Fatal(err)
	}
	sameID := record("pst_b", "free", time.Time{})
	sameID.ID = existing.ID
	sameHash := record("pst_a", "pro", time.Time{})
	sameHash.ID = "key_other"
	rawKey := record("pst_c", "free", time.Time{})
	rawKey.Hash = "pst_c"
	upperHash := record("pst_d", "free", time.Time{})
	upperHash.Hash = "ABCDEF" + upperHash.Hash[6:]
	noPlan := record("pst_e", "", time.Time{})
	noID := record("pst_f", "free", time.Time{})
	noID.ID = ""

	tests := []struct {
		name   string
		rec    apikey.Record
		exists bool
	}{
		{"same id", sameID, true},
		{"same hash", sameHash, true},
		{"a key instead of its hash", rawKey, false},
		{"upper-case hash", upperHash, false},
		{"no plan", noPlan, false},
		{"no id", noID, false},
	}
	for _, tt := range tests {
		err := s.CreateKey(ctx, tt.rec)
		if err == nil {
			t.Errorf("%s: CreateKey succeeded", tt.name)
			continue
		}
		if errors.Is(err, ErrKeyExists) != tt.exists {
			t.Errorf("%s: CreateKey = %v; want ErrKeyExists: %v", tt.name, err, tt.exists)
		}
	}
	list, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("ListKeys = %+v, want only the first key", list)
	}
	// A zero CreatedAt means now, by the database's clock.
	if age := time.Since(list[0].CreatedAt); age < -time.Minute || age > time.Minute {
		t.Fatalf("CreatedAt = %v, want about now", list[0].CreatedAt)
	}
}

func TestListKeysEmpty(t *testing.T) {
	t.Parallel()
	s := New(newMigratedPool(t))
	list, err := s.ListKeys(t.Context())
	if err != nil || len(list) != 0 {
		t.Fatalf("ListKeys = %v, %v; want no keys", list, err)
	}
}

// The table refuses a candidate that is not a list, whoever writes it.
func TestKeyCandidateMustBeAList(t *testing.T) {
	t.Parallel()
	pool := newMigratedPool(t)
	h := hashOf("pst_candidate")
	_, err := pool.Exec(t.Context(), `INSERT INTO api_keys (id, hash, plan, candidate) VALUES ('key_c', $1, 'free', '{"limit": 1, "period": "1m"}')`, h)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.ConstraintName != "api_keys_candidate_array" {
		t.Fatalf("INSERT of a candidate object = %v, want the api_keys_candidate_array constraint to refuse it", err)
	}
}

// The candidate column is additive (0002): a release before it reads and
// writes keys on the migrated table as it always did, and keys it wrote
// before or after the migration read back with no candidate of their own.
func TestCandidateMigrationIsAdditive(t *testing.T) {
	t.Parallel()
	pool := newPool(t, newSchema(t))
	ctx := t.Context()
	first := fstest.MapFS{}
	for _, m := range mustEmbedded(t) {
		if m.version == "0001" {
			first["migrations/"+m.name] = &fstest.MapFile{Data: []byte(m.sql)}
		}
	}
	if len(first) != 1 {
		t.Fatal("no 0001 migration")
	}
	if _, err := migrate(ctx, pool, first); err != nil {
		t.Fatal(err)
	}

	// What the release before 0002 runs, word for word.
	const (
		oldColumns = `id, hash, label, plan, overrides, created_at, revoked_at`
		oldInsert  = `INSERT INTO api_keys (id, hash, label, plan, overrides, created_at)
VALUES ($1, $2, $3, $4, $5, COALESCE($6, now()))`
		oldByHash = `SELECT ` + oldColumns + ` FROM api_keys WHERE hash = $1`
	)
	oldCreate := func(key string) {
		t.Helper()
		if _, err := pool.Exec(ctx, oldInsert, "key_"+key, hashOf(key), "old", "free", []byte(`[{"limit": 5, "period": "1m"}]`), nil); err != nil {
			t.Fatalf("the old release's insert: %v", err)
		}
	}
	oldRead := func(key string) {
		t.Helper()
		var id, hash, label, plan string
		var overrides []byte
		var created time.Time
		var revoked *time.Time
		if err := pool.QueryRow(ctx, oldByHash, hashOf(key)).Scan(&id, &hash, &label, &plan, &overrides, &created, &revoked); err != nil {
			t.Fatalf("the old release's lookup: %v", err)
		}
	}
	oldCreate("pst_before")

	// This release on the old schema: not servable until migrated.
	st, err := ReadStatus(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var se *SchemaError
	if !errors.As(st.Err(), &se) || !slices.Equal(se.Pending, []string{"0002_add_api_keys_candidate.sql"}) || se.Found != "0001" {
		t.Fatalf("this release on schema 0001: Err = %v", st.Err())
	}

	applied, err := Migrate(ctx, pool)
	if err != nil || !slices.Equal(applied, []string{"0002_add_api_keys_candidate.sql"}) {
		t.Fatalf("Migrate = %v, %v; want 0002 applied", applied, err)
	}
	// The release before 0002 on the migrated schema: it finds a newer
	// migration, additive, so it serves; its statements still work.
	oldStatus, err := readStatus(ctx, pool, first)
	if err != nil {
		t.Fatal(err)
	}
	if err := oldStatus.Err(); err != nil || len(oldStatus.Unknown) != 1 || !oldStatus.Unknown[0].Additive {
		t.Fatalf("the release before 0002 on schema 0002: %+v, Err = %v; want it servable", oldStatus, err)
	}
	oldRead("pst_before")
	oldCreate("pst_after")
	oldRead("pst_after")

	s := New(pool)
	for _, key := range []string{"pst_before", "pst_after"} {
		rec, err := s.KeyByHash(ctx, hashOf(key))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Candidate != nil || !slices.Equal(rec.Overrides, []ratelimit.Window{{Limit: 5, Period: time.Minute}}) {
			t.Fatalf("%s written by the old release reads as %+v, want its overrides and no candidate", key, rec)
		}
	}
}
