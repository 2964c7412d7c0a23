package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/ratelimit"
)

// ErrKeyExists is returned by CreateKey when a key with the same id or hash
// is already stored.
var ErrKeyExists = errors.New("postgres: API key already exists")

const (
	keyColumns = `id, hash, label, plan, overrides, candidate, created_at, revoked_at`

	sqlInsertKey = `INSERT INTO api_keys (id, hash, label, plan, overrides, candidate, created_at)
VALUES ($1, $2, $3, $4, $5, $6, COALESCE($7, now()))`
	sqlListKeys  = `SELECT ` + keyColumns + ` FROM api_keys ORDER BY created_at, id`
	sqlKeyByHash = `SELECT ` + keyColumns + ` FROM api_keys WHERE hash = $1`
	// Revoking twice keeps the first revocation time.
	sqlRevokeKey = `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
WHERE id = $1 RETURNING ` + keyColumns
)

// pgUniqueViolation is the SQLSTATE of a unique constraint violation.
const pgUniqueViolation = "23505"

// override is how a window is stored in api_keys.overrides and
// api_keys.candidate.
type override struct {
	Limit  int64  `json:"limit"`
	Period string `json:"period"`
}

// encodeWindows returns ws as api_keys stores them: a JSON array, empty
// for none.
func encodeWindows(ws []ratelimit.Window) ([]byte, error) {
	ovs := make([]override, len(ws))
	for i, w := range ws {
		ovs[i] = override{Limit: w.Limit, Period: ratelimit.FormatPeriod(w.Period)}
	}
	return json.Marshal(ovs)
}

// decodeWindows reads what encodeWindows wrote; an empty array is nil.
func decodeWindows(data []byte) ([]ratelimit.Window, error) {
	var ovs []override
	if err := json.Unmarshal(data, &ovs); err != nil {
		return nil, err
	}
	var ws []ratelimit.Window
	for _, o := range ovs {
		period, err := time.ParseDuration(o.Period)
		if err != nil {
			return nil, err
		}
		ws = append(ws, ratelimit.Window{Limit: o.Limit, Period: period})
	}
	return ws, nil
}

// CreateKey stores rec, its overrides and candidate quotas included.
// rec.Hash must be the lowercase hex SHA-256 of the key (the table refuses
// anything else, so a key cannot be stored by mistake). A zero
// rec.CreatedAt means now. A duplicate id or hash fails with an error
// wrapping ErrKeyExists.
func (s *Store) CreateKey(ctx context.Context, rec apikey.Record) error {
	overrides, err := encodeWindows(rec.Overrides)
	if err != nil {
		return fmt.Errorf("postgres: create key %s: encode overrides: %w", rec.ID, err)
	}
	candidate, err := encodeWindows(rec.Candidate)
	if err != nil {
		return fmt.Errorf("postgres: create key %s: encode candidate: %w", rec.ID, err)
	}
	var createdAt *time.Time
	if !rec.CreatedAt.IsZero() {
		createdAt = &rec.CreatedAt
	}
	_, err = s.pool.Exec(ctx, sqlInsertKey, rec.ID, rec.Hash, rec.Label, rec.Plan, overrides, candidate, createdAt)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == pgUniqueViolation {
		return fmt.Errorf("postgres: create key %s: %w", rec.ID, ErrKeyExists)
	}
	if err != nil {
		return fmt.Errorf("postgres: create key %s: %w", rec.ID, err)
	}
	return nil
}

// ListKeys returns every stored key, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]apikey.Record, error) {
	rows, err := s.pool.Query(ctx, sqlListKeys)
	if err != nil {
		return nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (apikey.Record, error) { return scanKey(row) })
	if err != nil {
		return nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	return recs, nil
}

// RevokeKey marks the key with the given id revoked and returns it. Revoking
// a revoked key keeps its first revocation time. An unknown id fails with an
// error wrapping apikey.ErrUnknown.
func (s *Store) RevokeKey(ctx context.Context, id string) (apikey.Record, error) {
	rec, err := scanKey(s.pool.QueryRow(ctx, sqlRevokeKey, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return apikey.Record{}, fmt.Errorf("postgres: revoke key %s: %w", id, apikey.ErrUnknown)
	}
	if err != nil {
		return apikey.Record{}, fmt.Errorf("postgres: revoke key %s: %w", id, err)
	}
	return rec, nil
}

// KeyByHash returns the key whose SHA-256 is hash, revoked or not (check
// Record.Revoked). An unknown hash fails with an error wrapping
// apikey.ErrUnknown.
func (s *Store) KeyByHash(ctx context.Context, hash string) (apikey.Record, error) {
	rec, err := scanKey(s.pool.QueryRow(ctx, sqlKeyByHash, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return apikey.Record{}, fmt.Errorf("postgres: key by hash: %w", apikey.ErrUnknown)
	}
	if err != nil {
		return apikey.Record{}, fmt.Errorf("postgres: key by hash: %w", err)
	}
	return rec, nil
}

func scanKey(row pgx.Row) (apikey.Record, error) {
	var (
		rec                  apikey.Record
		overrides, candidate []byte
		revokedAt            *time.Time
		err                  error
	)
	if err := row.Scan(&rec.ID, &rec.Hash, &rec.Label, &rec.Plan, &overrides, &candidate, &rec.CreatedAt, &revokedAt); err != nil {
		return apikey.Record{}, err
	}
	if rec.Overrides, err = decodeWindows(overrides); err != nil {
		return apikey.Record{}, fmt.Errorf("key %s: decode overrides: %w", rec.ID, err)
	}
	if rec.Candidate, err = decodeWindows(candidate); err != nil {
		return apikey.Record{}, fmt.Errorf("key %s: decode candidate: %w", rec.ID, err)
	}
	rec.CreatedAt = rec.CreatedAt.UTC()
	if revokedAt != nil {
		t := revokedAt.UTC()
		rec.RevokedAt = &t
	}
	return rec, nil
}
