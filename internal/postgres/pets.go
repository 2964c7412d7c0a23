package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/animal-store/petstore/internal/pet"
)

const (
	sqlInsertPet = `INSERT INTO pets (name, category_id, status) VALUES ($1, $2, $3)
RETURNING id, name, category_id, status`

	sqlGetPet = `SELECT id, name, category_id, status FROM pets WHERE id = $1`

	// Both pages are index range scans that stop after LIMIT rows.
	sqlListPets = `SELECT id, name, category_id, status FROM pets
WHERE id > $1 ORDER BY id LIMIT $2`

	// The filtered page is the range ($1, $2) < (status, id) <= ($1, max)
	// of pets_status_id_idx, which is exactly "status = $1 AND id > $2" in
	// id order. Written as "status = $1 AND id > $2 ORDER BY id", the
	// planner often walks the primary key and filters on status instead
	// (it assumes statuses are spread evenly over ids); when they are not,
	// for example after an import of old sold pets, a page of available
	// pets would read every row before them. The row comparisons leave the
	// (status, id) index as the only plan that needs no sort, for literal
	// and for generic (prepared) plans alike.
	sqlListPetsByStatus = `SELECT id, name, category_id, status FROM pets
WHERE (status, id) > ($1, $2) AND (status, id) <= ($1, 9223372036854775807)
ORDER BY status, id LIMIT $3`

	sqlLiveKey = `SELECT k.fingerprint, p.id, p.name, p.category_id, p.status
FROM idempotency_keys k JOIN pets p ON p.id = k.pet_id
WHERE k.key = $1 AND k.expires_at > $2`

	// Claims the key for the pet just inserted, unless a live claim exists.
	// An expired claim is replaced in place (the conflicting row is locked,
	// so two creates cannot both replace it). No row back means the key is
	// held by a live claim, possibly one committed while this statement
	// waited for it.
	sqlClaimKey = `INSERT INTO idempotency_keys AS k (key, fingerprint, pet_id, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key) DO UPDATE
SET fingerprint = excluded.fingerprint, pet_id = excluded.pet_id,
    created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE k.expires_at <= excluded.created_at
RETURNING k.pet_id`

	sqlPurgeKeys = `DELETE FROM idempotency_keys WHERE key IN (
    SELECT key FROM idempotency_keys WHERE expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

// claimAttempts bounds how often a keyed create retries when the key it
// lost to disappears (expires and is purged) before it can be read.
const claimAttempts = 3

// Create inserts a pet; the database assigns its id. With idem set (and a
// positive TTL), a retry of the same request within idem.TTL returns the
// original pet with replayed true, and a reuse of the key for another
// request fails with pet.ErrIdempotencyConflict.
func (s *Store) Create(ctx context.Context, np pet.NewPet, idem *pet.Idempotency) (pet.Pet, bool, error) {
	if idem == nil || idem.TTL <= 0 {
		p, err := scanPet(s.pool.QueryRow(ctx, sqlInsertPet, np.Name, np.CategoryID, np.Status))
		if err != nil {
			return pet.Pet{}, false, queryError("create pet", err)
		}
		return p, false, nil
	}

	now := s.now()
	for range claimAttempts {
		// Retries are the common case for a known key: answer them
		// without inserting (and without burning an id).
		p, replayed, err := s.replay(ctx, idem, now)
		if err != nil || replayed {
			return p, replayed, err
		}
		p, claimed, err := s.createClaimed(ctx, np, idem, now)
		if err != nil {
			return pet.Pet{}, false, err
		}
		if claimed {
			s.maybePurge(ctx, now)
			return p, false, nil
		}
	}
	return pet.Pet{}, false, fmt.Errorf("postgres: create pet: idempotency key claimed and released %d times in a row", claimAttempts)
}

// replay returns the pet a live claim on idem.Key made, replayed true, or
// replayed false when there is no live claim.
func (s *Store) replay(ctx context.Context, idem *pet.Idempotency, now time.Time) (pet.Pet, bool, error) {
	var (
		fingerprint string
		p           pet.Pet
	)
	err := s.pool.QueryRow(ctx, sqlLiveKey, idem.Key, now).Scan(&fingerprint, &p.ID, &p.Name, &p.CategoryID, &p.Status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return pet.Pet{}, false, nil
	case err != nil:
		return pet.Pet{}, false, queryError("create pet: look up idempotency key", err)
	case fingerprint != idem.Fingerprint:
		return pet.Pet{}, false, fmt.Errorf("postgres: create pet: %w", pet.ErrIdempotencyConflict)
	}
	return p, true, nil
}

// createClaimed inserts the pet and claims idem.Key for it in one
// transaction. When a live claim holds the key it rolls back and reports
// claimed false.
func (s *Store) createClaimed(ctx context.Context, np pet.NewPet, idem *pet.Idempotency, now time.Time) (p pet.Pet, claimed bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pet.Pet{}, false, queryError("create pet: begin", err)
	}
	defer func() {
		if !claimed {
			// Nothing to keep; a failed rollback closes the connection.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	p, err = scanPet(tx.QueryRow(ctx, sqlInsertPet, np.Name, np.CategoryID, np.Status))
	if err != nil {
		return pet.Pet{}, false, queryError("create pet", err)
	}
	var petID int64
	err = tx.QueryRow(ctx, sqlClaimKey, idem.Key, idem.Fingerprint, p.ID, now, now.Add(idem.TTL)).Scan(&petID)
	if errors.Is(err, pgx.ErrNoRows) {
		return pet.Pet{}, false, nil
	}
	if err != nil {
		return pet.Pet{}, false, queryError("create pet: claim idempotency key", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return pet.Pet{}, false, queryError("create pet: commit", err)
	}
	return p, true, nil
}

// maybePurge deletes a batch of expired idempotency keys if this store has
// not done so for purgeEvery. Expired keys are already treated as absent, so
// the purge only reclaims space: its failure is not the caller's, and the
// next purge retries.
func (s *Store) maybePurge(ctx context.Context, now time.Time) {
	if s.purgeEvery <= 0 {
		return
	}
	last := s.lastPurge.Load()
	if now.UnixNano()-last < int64(s.purgeEvery) || !s.lastPurge.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	_, _ = s.PurgeExpired(ctx, s.purgeBatch)
}

// PurgeExpired deletes up to limit idempotency keys that have expired,
// oldest first, skipping rows other transactions hold, and returns how many
// it deleted.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, sqlPurgeKeys, s.now(), limit)
	if err != nil {
		return 0, fmt.Errorf("postgres: purge idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Get returns the pet with the given id or an error wrapping pet.ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (pet.Pet, error) {
	p, err := scanPet(s.pool.QueryRow(ctx, sqlGetPet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return pet.Pet{}, fmt.Errorf("postgres: get pet %d: %w", id, pet.ErrNotFound)
	}
	if err != nil {
		return pet.Pet{}, queryError(fmt.Sprintf("get pet %d", id), err)
	}
	return p, nil
}

// List returns at most q.Limit pets with ids above q.After, of q.Status if
// set, in ascending id order.
func (s *Store) List(ctx context.Context, q pet.ListQuery) ([]pet.Pet, error) {
	if q.Limit <= 0 {
		return []pet.Pet{}, nil
	}
	var (
		rows pgx.Rows
		err  error
	)
	if q.Status == "" {
		rows, err = s.pool.Query(ctx, sqlListPets, q.After, q.Limit)
	} else {
		rows, err = s.pool.Query(ctx, sqlListPetsByStatus, q.Status, q.After, q.Limit)
	}
	if err != nil {
		return nil, queryError("list pets", err)
	}
	out := make([]pet.Pet, 0, min(q.Limit, 128))
	out, err = pgx.AppendRows(out, rows, func(row pgx.CollectableRow) (pet.Pet, error) { return scanPet(row) })
	if err != nil {
		return nil, queryError("list pets", err)
	}
	return out, nil
}

// schemaMismatch holds the SQLSTATEs of a statement that names a table,
// column or schema the database lacks: its schema is older than this
// release needs (not migrated yet) or was changed under it.
var schemaMismatch = map[string]bool{
	"42P01": true, // undefined_table
	"42703": true, // undefined_column
	"3F000": true, // invalid_schema_name
}

// queryError wraps the failure of a statement of what. A schema mismatch
// and a database that cannot be reached also wrap pet.ErrUnavailable: the
// request can succeed once the database is migrated or back, so it is
// answered 503 with Retry-After, not 500.
func queryError(what string, err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && schemaMismatch[pgErr.Code] {
		return fmt.Errorf("postgres: %s: %w: database schema is not what this release needs (run petstore migrate): %w", what, pet.ErrUnavailable, err)
	}
	if unreachable(err) {
		return fmt.Errorf("postgres: %s: %w: database unreachable: %w", what, pet.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %s: %w", what, err)
}

// unreachable reports whether err says the database could not be reached,
// dropped the connection, or is shutting down or starting up, as opposed to
// refusing the statement itself.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // the caller gave up; context errors also look like net.Error
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		// Class 08: connection exception; 57P01-57P03: admin or crash
		// shutdown, cannot connect now.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func scanPet(row pgx.Row) (pet.Pet, error) {
	var p pet.Pet
	err := row.Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status)
	return p, err
}
