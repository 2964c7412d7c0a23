package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

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
		!slices.Equal(got.Overrides, want.Overrides) || !got.CreatedAt.Equal(want.CreatedAt) ||
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
	for _, rec := range []apikey.Record{pro, free} {
		if err := s.CreateKey(ctx, rec); err != nil {
			t.Fatalf("CreateKey(%s): %v", rec.ID, err)
		}
	}

	// Lookups return what was stored, overrides included.
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
