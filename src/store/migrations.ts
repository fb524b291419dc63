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
  // 2: the signed catalog's append-only history (docs/catalog.md). Every feed the gateway ever accepted
  // stays here, so a receipt naming an old catalog_id can still be checked against that catalog.
  // body holds the exact signed bytes; issued/expires are copies of the body's instants, kept for
  // queries only (the body stays authoritative). public_key is the raw Ed25519 key the signature
  // verified under when the row was accepted.
  `
  CREATE TABLE catalog_history (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    catalog_id     TEXT NOT NULL UNIQUE,
    body           BLOB NOT NULL,
    signature      TEXT NOT NULL,
    body_digest    TEXT NOT NULL UNIQUE CHECK (length(body_digest) = 64),
    public_key     BLOB NOT NULL CHECK (length(public_key) = 32),
    issued_at_ms   INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL CHECK (expires_at_ms > issued_at_ms),
    accepted_at_ms INTEGER NOT NULL
  ) STRICT;

  -- Invariant: append-only. The database itself refuses edits, whatever code runs against it.
  CREATE TRIGGER catalog_history_no_update BEFORE UPDATE ON catalog_history
    BEGIN SELECT RAISE(ABORT, 'catalog_history is append-only'); END;
  CREATE TRIGGER catalog_history_no_delete BEFORE DELETE ON catalog_history
    BEGIN SELECT RAISE(ABORT, 'catalog_history is append-only'); END;
  `,
  // Sign-up through external identity providers (issue 5): identities linked on (issuer, subject),
  // authorization requests in flight, account-page sessions, and browser demo sessions (counted per
  // client IP key for the hourly limit).
  `
  CREATE TABLE oidc_identities (
    issuer           TEXT NOT NULL,
    subject          TEXT NOT NULL,
    account_id       TEXT NOT NULL REFERENCES accounts (id),
    idp              TEXT NOT NULL,
    email            TEXT,
    created_at_ms    INTEGER NOT NULL,
    last_login_at_ms INTEGER NOT NULL,
    PRIMARY KEY (issuer, subject)
  ) STRICT;
  CREATE INDEX oidc_identities_account_id ON oidc_identities (account_id);

  -- One row per authorization request; deleted by the callback that uses it (so a replay finds
  -- nothing) or once expired. browser_hash = sha256 of the browser-binding cookie.
  CREATE TABLE oidc_pending_logins (
    state         TEXT PRIMARY KEY,
    idp           TEXT NOT NULL,
    browser_hash  BLOB NOT NULL CHECK (length(browser_hash) = 32),
    code_verifier TEXT NOT NULL,
    nonce         TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX oidc_pending_logins_expires ON oidc_pending_logins (expires_at_ms);

  -- id_hash = sha256 of the session cookie: a copy of the database never yields a usable session.
  -- reveal holds a new API key sealed under a key derived from the cookie itself, until its one display.
  CREATE TABLE account_sessions (
    id_hash              BLOB PRIMARY KEY CHECK (length(id_hash) = 32),
    account_id           TEXT NOT NULL REFERENCES accounts (id),
    created_at_ms        INTEGER NOT NULL,
    expires_at_ms        INTEGER NOT NULL,
    ended_at_ms          INTEGER,
    reveal               BLOB,
    reveal_expires_at_ms INTEGER
  ) STRICT;
  CREATE INDEX account_sessions_account_id ON account_sessions (account_id);

  CREATE TABLE demo_sessions (
    id            TEXT PRIMARY KEY,
    ip_key        TEXT NOT NULL,
    issued_at_ms  INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX demo_sessions_ip_key ON demo_sessions (ip_key, issued_at_ms);
  `,
  // Settlement and money (issue 4; docs/receipts.md, docs/ledger.md): route snapshots, settlements, received receipts,
  // reservations and the double-entry ledger. SQL-side guards back the code's own checks: a posting
  // is sealed only when its entries sum to zero, entries and sealed postings never change, at most one
  // posting per (request_id, attempt_n), and a settlement's first terminal outcome is final.
  `
  CREATE TABLE route_snapshots (
    request_id    TEXT NOT NULL,
    attempt_n     INTEGER NOT NULL CHECK (attempt_n >= 0),
    digest        TEXT NOT NULL CHECK (length(digest) = 64),
    snapshot      TEXT NOT NULL, -- the JCS text the digest covers
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (request_id, attempt_n)
  ) STRICT;

  CREATE TABLE settlements (
    request_id                     TEXT NOT NULL,
    attempt_n                      INTEGER NOT NULL,
    provider_id                    TEXT NOT NULL,
    account_id                     TEXT NOT NULL, -- buyer account id, or the demo scope (demo:<ip>)
    payer                          TEXT NOT NULL CHECK (payer IN ('buyer', 'promotion')),
    mode                           TEXT NOT NULL CHECK (mode IN ('observe', 'enforce')),
    prompt_credits_per_million     INTEGER NOT NULL CHECK (prompt_credits_per_million >= 0),
    completion_credits_per_million INTEGER NOT NULL CHECK (completion_credits_per_million >= 0),
    provider_share_bps             INTEGER NOT NULL CHECK (provider_share_bps BETWEEN 0 AND 10000),
    label                          TEXT NOT NULL DEFAULT 'pending'
                                   CHECK (label IN ('pending', 'verified', 'quarantined', 'zero_settled')),
    reason                         TEXT,
    accepted_model_hash            TEXT CHECK (accepted_model_hash IS NULL OR length(accepted_model_hash) = 64),
    -- the delivered prefix record, written once when the attempt ends (no output text is stored)
    delivered_output_hash          TEXT CHECK (delivered_output_hash IS NULL OR length(delivered_output_hash) = 64),
    delivered_start_byte           INTEGER,
    delivered_end_byte             INTEGER,
    delivered_tokens               INTEGER,
    delivered_terminal_state       TEXT,
    delivered_finish_reason        TEXT,
    delivered_tool_calls           INTEGER CHECK (delivered_tool_calls IS NULL OR delivered_tool_calls IN (0, 1)),
    reported_input_tokens          INTEGER,
    ended_at_ms                    INTEGER,
    pending_deadline_at_ms         INTEGER,
    receipt                        TEXT, -- the envelope that decided the outcome
    receipt_received_at_ms         INTEGER,
    billed_prompt_tokens           INTEGER NOT NULL DEFAULT 0 CHECK (billed_prompt_tokens >= 0),
    billed_completion_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (billed_completion_tokens >= 0),
    debit_credits                  INTEGER NOT NULL DEFAULT 0 CHECK (debit_credits >= 0),
    provider_credits               INTEGER NOT NULL DEFAULT 0 CHECK (provider_credits >= 0),
    platform_credits               INTEGER NOT NULL DEFAULT 0 CHECK (platform_credits >= 0),
    created_at_ms                  INTEGER NOT NULL,
    settled_at_ms                  INTEGER,
    CHECK (debit_credits = provider_credits + platform_credits),
    CHECK (label <> 'pending' OR debit_credits = 0),
    PRIMARY KEY (request_id, attempt_n),
    FOREIGN KEY (request_id, attempt_n) REFERENCES route_snapshots (request_id, attempt_n)
  ) STRICT;
  CREATE INDEX settlements_pending ON settlements (request_id) WHERE label = 'pending';

  -- Invariant: the first terminal outcome is final. The code's guarded UPDATE ... WHERE label = 'pending'
  -- decides races; this trigger makes any other write to a settled row an error.
  CREATE TRIGGER settlements_final BEFORE UPDATE ON settlements
    WHEN OLD.label <> 'pending'
    BEGIN SELECT RAISE(ABORT, 'settlement outcome is final'); END;

  -- Every receipt that reached the gateway, including late and duplicate ones (diagnostics, audit).
  CREATE TABLE receipts_received (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id     TEXT NOT NULL,
    attempt_n      INTEGER NOT NULL,
    provider_id    TEXT NOT NULL,
    envelope       TEXT NOT NULL,
    received_at_ms INTEGER NOT NULL,
    disposition    TEXT NOT NULL CHECK (disposition IN ('judged', 'after_final', 'unknown_attempt'))
  ) STRICT;
  CREATE INDEX receipts_received_attempt ON receipts_received (request_id, attempt_n);

  CREATE TABLE reservations (
    request_id     TEXT PRIMARY KEY,
    account_id     TEXT NOT NULL,
    payer          TEXT NOT NULL CHECK (payer IN ('buyer', 'promotion')),
    day            TEXT NOT NULL, -- UTC day of admission, YYYY-MM-DD (daily token quota)
    tokens         INTEGER NOT NULL CHECK (tokens >= 0),
    credits        INTEGER NOT NULL CHECK (credits >= 0),
    state          TEXT NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'finalised', 'released')),
    request_ended  INTEGER NOT NULL DEFAULT 0 CHECK (request_ended IN (0, 1)),
    used_tokens    INTEGER NOT NULL DEFAULT 0 CHECK (used_tokens >= 0),
    used_credits   INTEGER NOT NULL DEFAULT 0 CHECK (used_credits >= 0),
    created_at_ms  INTEGER NOT NULL,
    resolved_at_ms INTEGER
  ) STRICT;
  CREATE INDEX reservations_account_day ON reservations (account_id, day);
  CREATE INDEX reservations_held ON reservations (account_id) WHERE state = 'held';

  CREATE TABLE ledger_accounts (
    id            TEXT PRIMARY KEY, -- buyer:<account_id> | provider:<provider_id> | platform | promotion | funding
    kind          TEXT NOT NULL CHECK (kind IN ('buyer', 'provider', 'platform', 'promotion', 'funding')),
    created_at_ms INTEGER NOT NULL
  ) STRICT;

  CREATE TABLE ledger_postings (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL CHECK (kind IN ('settlement', 'grant')),
    request_id    TEXT,
    attempt_n     INTEGER,
    sealed        INTEGER NOT NULL DEFAULT 0 CHECK (sealed IN (0, 1)),
    memo          TEXT,
    created_at_ms INTEGER NOT NULL,
    CHECK ((kind = 'settlement') = (request_id IS NOT NULL AND attempt_n IS NOT NULL)),
    -- At most one posting per attempt: a second settlement of the same attempt fails here.
    UNIQUE (request_id, attempt_n)
  ) STRICT;

  CREATE TABLE ledger_entries (
    posting_id INTEGER NOT NULL REFERENCES ledger_postings (id),
    account_id TEXT NOT NULL REFERENCES ledger_accounts (id),
    amount     INTEGER NOT NULL CHECK (amount <> 0), -- credits; negative leaves the account
    PRIMARY KEY (posting_id, account_id)
  ) STRICT;
  CREATE INDEX ledger_entries_account ON ledger_entries (account_id);

  -- Invariant: a sealed posting has at least two entries summing to zero, and never changes again.
  CREATE TRIGGER ledger_postings_seal_balanced BEFORE UPDATE OF sealed ON ledger_postings
    WHEN NEW.sealed = 1 AND OLD.sealed = 0 AND (
      (SELECT COUNT(*) FROM ledger_entries WHERE posting_id = NEW.id) < 2 OR
      (SELECT SUM(amount) FROM ledger_entries WHERE posting_id = NEW.id) <> 0)
    BEGIN SELECT RAISE(ABORT, 'unbalanced posting'); END;
  CREATE TRIGGER ledger_postings_sealed_final BEFORE UPDATE ON ledger_postings
    WHEN OLD.sealed = 1
    BEGIN SELECT RAISE(ABORT, 'ledger postings are append-only'); END;
  CREATE TRIGGER ledger_postings_no_delete BEFORE DELETE ON ledger_postings
    BEGIN SELECT RAISE(ABORT, 'ledger postings are append-only'); END;
  CREATE TRIGGER ledger_entries_into_open_posting BEFORE INSERT ON ledger_entries
    WHEN (SELECT sealed FROM ledger_postings WHERE id = NEW.posting_id) IS NOT 0
    BEGIN SELECT RAISE(ABORT, 'posting is sealed'); END;
  CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
  CREATE TRIGGER ledger_entries_no_delete BEFORE DELETE ON ledger_entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
  `,
  // Buyer feedback and usage (issue 5): one rating per request (a repeat replaces it, so the call is
  // idempotent per request id), a submission log counted per client IP key for the hourly limit (rows
  // older than the window are deleted as new ones arrive), and an index for per-account usage.
  `
  CREATE TABLE feedback (
    request_id    TEXT PRIMARY KEY,
    account_id    TEXT NOT NULL, -- buyer account id, or the demo scope (demo:<ip>)
    rating        TEXT NOT NULL CHECK (rating IN ('up', 'down')),
    comment       TEXT CHECK (comment IS NULL OR length(comment) <= 2000),
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX feedback_account ON feedback (account_id);
  CREATE INDEX feedback_updated ON feedback (updated_at_ms);

  CREATE TABLE feedback_submissions (
    ip_key          TEXT NOT NULL,
    submitted_at_ms INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX feedback_submissions_ip_key ON feedback_submissions (ip_key, submitted_at_ms);

  CREATE INDEX settlements_account ON settlements (account_id, created_at_ms);
  `,
  // Per-account ledger totals: a reservation read SUM(amount) over every entry the account
  // ever had, O(history) per request. The total is kept by a trigger in the same transaction as the
  // entry it adds (entries are append-only, so the total always equals the sum; `gateway ledger
  // audit` still recomputes balances from entries).
  `
  CREATE TABLE ledger_account_totals (
    account_id TEXT PRIMARY KEY REFERENCES ledger_accounts (id),
    balance    INTEGER NOT NULL
  ) STRICT;
  INSERT INTO ledger_account_totals (account_id, balance)
    SELECT account_id, SUM(amount) FROM ledger_entries GROUP BY account_id;
  CREATE TRIGGER ledger_entries_total AFTER INSERT ON ledger_entries
    BEGIN
      INSERT INTO ledger_account_totals (account_id, balance) VALUES (NEW.account_id, NEW.amount)
        ON CONFLICT (account_id) DO UPDATE SET balance = balance + excluded.balance;
    END;
  `,
  // Held credits per buyer account: the balance check summed every held reservation of the account,
  // O(requests in flight) per request. The
  // sum is kept by triggers in the transactions that take and resolve holds (a reservation's payer,
  // account and credits never change; its state only leaves 'held').
  `
  CREATE TABLE reservation_holds (
    account_id   TEXT PRIMARY KEY,
    held_credits INTEGER NOT NULL CHECK (held_credits >= 0)
  ) STRICT;
  INSERT INTO reservation_holds (account_id, held_credits)
    SELECT account_id, SUM(credits) FROM reservations WHERE payer = 'buyer' AND state = 'held' GROUP BY account_id;
  CREATE TRIGGER reservations_hold_taken AFTER INSERT ON reservations
    WHEN NEW.payer = 'buyer' AND NEW.state = 'held'
    BEGIN
      INSERT INTO reservation_holds (account_id, held_credits) VALUES (NEW.account_id, NEW.credits)
        ON CONFLICT (account_id) DO UPDATE SET held_credits = held_credits + excluded.held_credits;
    END;
  CREATE TRIGGER reservations_hold_resolved AFTER UPDATE OF state ON reservations
    WHEN OLD.payer = 'buyer' AND OLD.state = 'held' AND NEW.state <> 'held'
    BEGIN
      UPDATE reservation_holds SET held_credits = held_credits - OLD.credits WHERE account_id = OLD.account_id;
    END;
  `,
  // A settlement refers to its deciding receipt's row in the arrival log: the envelope
  // (~2 KB) was stored twice, and writing it into the settlement row at settle time grew the row past
  // its page's room. Rows settled before keep their envelope in `receipt`.
  `
  ALTER TABLE settlements ADD COLUMN receipt_id INTEGER REFERENCES receipts_received (id);
  `,
  // No index of ledger entries by account: nothing reads entries by account alone (balances
  // are kept in ledger_account_totals, and the audit's per-account sums read the table once), and
  // ledger accounts are never deleted or re-keyed, so the foreign key never looks entries up by
  // account either. The index cost every settlement a leaf page per account it touched: ~3.8 of the
  // ~27 WAL pages a request wrote at one request at a time (docs/benchmarks-archive.md, tenth pass).
  `
  DROP INDEX ledger_entries_account;
  `,
  // The delivered record keeps its tool-call bytes: the output-token bound counts them, and an attempt
  // judged after a restart must be bounded as it would have been before (docs/receipts.md).
  `
  ALTER TABLE settlements ADD COLUMN delivered_tool_call_bytes INTEGER
    CHECK (delivered_tool_call_bytes IS NULL OR delivered_tool_call_bytes >= 0);
  `,
];
