// Versioned schema migrations, applied in order by openDatabase (db.ts).
// Invariant: this list is append-only. Entry i is schema version i + 1; once released, an entry is
// never edited or reordered, because databases in the field record which versions they have applied.
// A later change to a table is a new entry (for a table rebuild, foreign keys are deferred to the
// commit of the migration's transaction, so the usual create-copy-drop-rename works).
// Tables are STRICT so a wrong type is an error rather than silently stored (SQLite ≥ 3.37).

export const migrations: readonly string[] = [
  // 1: accounts, API keys, provider bindings, secrets.
  `
  CREATE TABLE accounts (
    id            TEXT PRIMARY KEY,
    name          TEXT,
    tier          TEXT NOT NULL CHECK (tier IN ('free', 'paid')),
    created_at_ms INTEGER NOT NULL
  ) STRICT;

  -- Only sha256(key) is stored: a copy of the database never yields a usable key.
  CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY,
    account_id      TEXT NOT NULL REFERENCES accounts (id),
    key_hash        BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    display_prefix  TEXT NOT NULL,
    label           TEXT,
    created_at_ms   INTEGER NOT NULL,
    last_used_at_ms INTEGER,
    revoked_at_ms   INTEGER
  ) STRICT;
  CREATE INDEX api_keys_account_id ON api_keys (account_id);

  -- public_key is NULL only for an id banned before it was ever bound.
  -- first_admitted_at_ms is set by the first provisional admission only (the provisional rate
  -- limit counts those); a pinned id that never came in provisionally keeps it NULL.
  CREATE TABLE provider_bindings (
    provider_id          TEXT PRIMARY KEY CHECK (length(provider_id) BETWEEN 1 AND 64),
    public_key           BLOB CHECK (public_key IS NULL OR length(public_key) = 32),
    pinned               INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1)),
    banned               INTEGER NOT NULL DEFAULT 0 CHECK (banned IN (0, 1)),
    first_admitted_at_ms INTEGER,
    updated_at_ms        INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX provider_bindings_first_admitted ON provider_bindings (first_admitted_at_ms)
    WHERE first_admitted_at_ms IS NOT NULL;

  CREATE TABLE secrets (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
  ) STRICT;
  `,
  // 2: the signed catalog's append-only history (DESIGN §5).
  `
  CREATE TABLE catalog_history (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    catalog_id     TEXT NOT NULL UNIQUE,
    body           BLOB NOT NULL,
    signature      TEXT NOT NULL,
    body_digest    TEXT NOT NULL CHECK (length(body_digest) = 64),
    accepted_at_ms INTEGER NOT NULL
  ) STRICT;
  `,
];
