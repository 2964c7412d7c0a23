-- Pets, idempotency keys and API keys.
--
-- CHECK constraints repeat the domain rules of internal/pet so that no
-- writer, whatever its path, can store a pet the service could not serve.

CREATE TABLE pets (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text   NOT NULL,
    category_id bigint NOT NULL,
    status      text   NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pets_name_length CHECK (char_length(name) BETWEEN 1 AND 100),
    CONSTRAINT pets_name_trimmed CHECK (name = btrim(name)),
    -- No C0, DEL or C1 control characters (Go's unicode.IsControl).
    CONSTRAINT pets_name_no_control CHECK (name !~ '[\x01-\x1f\x7f-\x9f]'),
    CONSTRAINT pets_category_id_positive CHECK (category_id >= 1),
    CONSTRAINT pets_status_valid CHECK (status IN ('available', 'pending', 'sold'))
);

-- Keyset pages filtered by status: WHERE status = $1 AND id > $2 ORDER BY id.
-- Unfiltered pages use the primary key.
CREATE INDEX pets_status_id_idx ON pets (status, id);

-- A create with an Idempotency-Key records the key in the same transaction
-- as the pet. key is already scoped to the caller.
CREATE TABLE idempotency_keys (
    key         text   PRIMARY KEY,
    fingerprint text   NOT NULL,
    pet_id      bigint NOT NULL REFERENCES pets (id),
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT idempotency_keys_expiry_after_creation CHECK (expires_at > created_at)
);

-- The purge deletes the oldest expired keys first.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- API keys: only the SHA-256 of a key is stored, never the key.
CREATE TABLE api_keys (
    id         text PRIMARY KEY,
    hash       text NOT NULL UNIQUE,
    label      text NOT NULL DEFAULT '',
    plan       text NOT NULL,
    -- Window overrides: [{"limit": 100, "period": "1m"}, ...]
    overrides  jsonb NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CONSTRAINT api_keys_id_not_empty CHECK (id <> ''),
    CONSTRAINT api_keys_hash_sha256_hex CHECK (hash ~ '^[0-9a-f]{64}$'),
    CONSTRAINT api_keys_plan_not_empty CHECK (plan <> ''),
    CONSTRAINT api_keys_overrides_array CHECK (jsonb_typeof(overrides) = 'array')
);
