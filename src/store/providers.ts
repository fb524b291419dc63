// Provider bindings: provider_id → Ed25519 public key, plus the pinned tier and bans (docs/protocol.md).
// Bindings are durable so a restart never lets another key take over a known id.

import type { Database } from "bun:sqlite";
import type { BindResult, ProviderBinding } from "./types.ts";

interface BindingRow {
  provider_id: string;
  public_key: Uint8Array | null;
  pinned: number;
  banned: number;
  first_admitted_at_ms: number | null;
  updated_at_ms: number;
}

const COLUMNS = "provider_id, public_key, pinned, banned, first_admitted_at_ms, updated_at_ms";

function toBinding(row: BindingRow): ProviderBinding {
  return {
    provider_id: row.provider_id,
    public_key: row.public_key,
    pinned: row.pinned === 1,
    banned: row.banned === 1,
    first_admitted_at_ms: row.first_admitted_at_ms,
    updated_at_ms: row.updated_at_ms,
  };
}

function assertPublicKey(public_key: Uint8Array): void {
  // A wrong length here is a caller bug: the wire schema and the CLI both validate first.
  if (public_key.length !== 32) throw new Error(`Ed25519 public key must be 32 bytes, got ${public_key.length}`);
}

export function getProviderBinding(db: Database, provider_id: string): ProviderBinding | null {
  const row = db.query(`SELECT ${COLUMNS} FROM provider_bindings WHERE provider_id = ?`).get(provider_id);
  return row === null ? null : toBinding(row as BindingRow);
}

function mustGet(db: Database, provider_id: string): ProviderBinding {
  const binding = getProviderBinding(db, provider_id);
  if (binding === null) throw new Error(`provider binding ${provider_id} vanished inside its transaction`);
  return binding;
}

export function bindProvisionalProvider(
  db: Database,
  provider_id: string,
  public_key: Uint8Array,
  now_ms: number,
): BindResult {
  assertPublicKey(public_key);
  return db
    .transaction((): BindResult => {
      // Binds only a missing row or a keyless one (banned before ever seen); the WHERE makes a
      // concurrent second bind of the same id a no-op, so the first key to commit wins.
      const result = db
        .query(
          `INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, first_admitted_at_ms, updated_at_ms)
           VALUES (?1, ?2, 0, 0, ?3, ?3)
           ON CONFLICT (provider_id) DO UPDATE
             SET public_key = excluded.public_key, first_admitted_at_ms = excluded.first_admitted_at_ms,
                 updated_at_ms = excluded.updated_at_ms
             WHERE provider_bindings.public_key IS NULL`,
        )
        .run(provider_id, public_key, now_ms);
      const binding = mustGet(db, provider_id);
      return result.changes > 0 ? { ok: true, binding } : { ok: false, code: "already_bound", binding };
    })
    .immediate();
}

export function countFirstAdmissionsSince(db: Database, since_ms: number): number {
  const row = db
    .query("SELECT COUNT(*) AS n FROM provider_bindings WHERE first_admitted_at_ms >= ?")
    .get(since_ms) as { n: number };
  return row.n;
}

export function pinProvider(db: Database, provider_id: string, public_key: Uint8Array, now_ms: number): ProviderBinding {
  assertPublicKey(public_key);
  return db
    .transaction(() => {
      // Rebinding keeps first_admitted_at_ms: that first admission still happened when it did.
      db.query(
        `INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, updated_at_ms)
         VALUES (?1, ?2, 1, 0, ?3)
         ON CONFLICT (provider_id) DO UPDATE
           SET public_key = excluded.public_key, pinned = 1, updated_at_ms = excluded.updated_at_ms`,
      ).run(provider_id, public_key, now_ms);
      return mustGet(db, provider_id);
    })
    .immediate();
}

export function unpinProvider(db: Database, provider_id: string, now_ms: number): ProviderBinding | null {
  return db
    .transaction(() => {
      db.query("UPDATE provider_bindings SET pinned = 0, updated_at_ms = ? WHERE provider_id = ?").run(
        now_ms,
        provider_id,
      );
      return getProviderBinding(db, provider_id);
    })
    .immediate();
}

export function banProvider(db: Database, provider_id: string, now_ms: number): ProviderBinding {
  return db
    .transaction(() => {
      db.query(
        `INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, updated_at_ms)
         VALUES (?1, NULL, 0, 1, ?2)
         ON CONFLICT (provider_id) DO UPDATE SET banned = 1, updated_at_ms = excluded.updated_at_ms`,
      ).run(provider_id, now_ms);
      return mustGet(db, provider_id);
    })
    .immediate();
}

/** Lifts a ban; null when the id has no binding. */
export function unbanProvider(db: Database, provider_id: string, now_ms: number): ProviderBinding | null {
  return db
    .transaction(() => {
      db.query("UPDATE provider_bindings SET banned = 0, updated_at_ms = ? WHERE provider_id = ?").run(now_ms, provider_id);
      return getProviderBinding(db, provider_id);
    })
    .immediate();
}

export function listProviders(db: Database): ProviderBinding[] {
  const rows = db.query(`SELECT ${COLUMNS} FROM provider_bindings ORDER BY provider_id`).all() as BindingRow[];
  return rows.map(toBinding);
}
