-- Per-key candidate quotas: proposed limits measured on a key's traffic
-- beside its enforced ones and never enforced. Each replaces the plan's
-- candidate quota of the same period or adds one, as overrides do for the
-- enforced quotas.
--
-- Additive: releases before it neither read nor write the column, and the
-- keys they create get the default, no candidate of their own. Adding a
-- column with a constant default rewrites nothing; the CHECK reads the
-- table once, under the lock, which a table of API keys makes brief.

ALTER TABLE api_keys
    -- [{"limit": 100, "period": "1m"}, ...], as overrides
    ADD COLUMN candidate jsonb NOT NULL DEFAULT '[]',
    ADD CONSTRAINT api_keys_candidate_array CHECK (jsonb_typeof(candidate) = 'array');
