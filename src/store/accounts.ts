// Accounts and API keys. Only sha256(key) is stored; the raw key exists once, in createApiKey's answer.

import type { Database } from "bun:sqlite";
import { timingSafeEqual } from "node:crypto";
import { hashApiKey, newApiKey, newId, type RandomBytes } from "./ids.ts";
import type { AccountRow, ApiKeyRow, AuthenticatedKey, AccountTier } from "./accountTypes.ts";

/** last_used_at_ms is refreshed at most this often, so authentication is not a write per request. */
export const LAST_USED_RESOLUTION_MS = 60_000;

const ACCOUNT_COLUMNS = "id AS account_id, name, tier, created_at_ms";
const KEY_COLUMNS =
  "id AS key_id, account_id, display_prefix, label, created_at_ms, last_used_at_ms, revoked_at_ms";

export function createAccount(
  db: Database,
  random: RandomBytes,
  input: { name?: string; tier: AccountTier },
  now_ms: number,
): { account_id: string } {
  const account_id = newId("acct", random);
  db.query("INSERT INTO accounts (id, name, tier, created_at_ms) VALUES (?, ?, ?, ?)").run(
    account_id,
    input.name ?? null,
    input.tier,
    now_ms,
  );
  return { account_id };
}

/** Moves an account to another tier (its keys follow at once); null when the account is unknown. */
export function setAccountTier(db: Database, account_id: string, tier: AccountTier): AccountRow | null {
  return db.query(`UPDATE accounts SET tier = ? WHERE id = ? RETURNING ${ACCOUNT_COLUMNS}`).get(tier, account_id) as AccountRow | null;
}

export function listAccounts(db: Database): AccountRow[] {
  return db.query(`SELECT ${ACCOUNT_COLUMNS} FROM accounts ORDER BY created_at_ms, rowid`).all() as AccountRow[];
}

export function getAccount(db: Database, account_id: string): AccountRow | null {
  return db.query(`SELECT ${ACCOUNT_COLUMNS} FROM accounts WHERE id = ?`).get(account_id) as AccountRow | null;
}

export function createApiKey(
  db: Database,
  random: RandomBytes,
  keyPrefix: string,
  input: { account_id: string; label?: string },
  now_ms: number,
): { key_id: string; api_key: string } {
  const key_id = newId("key", random);
  const { api_key, display_prefix } = newApiKey(keyPrefix, random);
  // The foreign key rejects an unknown account (a caller bug: callers check the account first).
  db.query(
    "INSERT INTO api_keys (id, account_id, key_hash, display_prefix, label, created_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
  ).run(key_id, input.account_id, hashApiKey(api_key), display_prefix, input.label ?? null, now_ms);
  return { key_id, api_key };
}

interface KeyLookup {
  key_id: string;
  account_id: string;
  tier: AccountTier;
  key_hash: Uint8Array;
  last_used_at_ms: number | null;
  revoked_at_ms: number | null;
}

export function authenticateApiKey(
  db: Database,
  keyPrefix: string,
  api_key: string,
  now_ms: number,
): AuthenticatedKey | null {
  // Not ours by its shape: skip the hash and the lookup.
  if (!api_key.startsWith(`${keyPrefix}_`)) return null;
  const hash = hashApiKey(api_key);
  const row = db
    .query(
      `SELECT k.id AS key_id, k.account_id, a.tier, k.key_hash, k.last_used_at_ms, k.revoked_at_ms
         FROM api_keys k JOIN accounts a ON a.id = k.account_id
        WHERE k.key_hash = ?`,
    )
    .get(hash) as KeyLookup | null;
  // The index lookup already matched the hash; the constant-time compare is defence in depth so the
  // final accept/reject decision never depends on a short-circuiting byte comparison.
  if (row === null || row.key_hash.length !== hash.length || !timingSafeEqual(row.key_hash, hash)) return null;
  if (row.revoked_at_ms !== null) return null;
  if (row.last_used_at_ms === null || now_ms - row.last_used_at_ms >= LAST_USED_RESOLUTION_MS) {
    // The condition is repeated in SQL so concurrent processes still write at most once a minute.
    db.query(
      "UPDATE api_keys SET last_used_at_ms = ? WHERE id = ? AND (last_used_at_ms IS NULL OR last_used_at_ms <= ?)",
    ).run(now_ms, row.key_id, now_ms - LAST_USED_RESOLUTION_MS);
  }
  return { account_id: row.account_id, key_id: row.key_id, tier: row.tier };
}

export function revokeApiKey(db: Database, key_id: string, now_ms: number): boolean {
  // COALESCE keeps the first revocation time; `changes` still counts the row, so it tells existence.
  const result = db
    .query("UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, ?) WHERE id = ?")
    .run(now_ms, key_id);
  return result.changes > 0;
}

export function listApiKeys(db: Database, account_id?: string): ApiKeyRow[] {
  if (account_id === undefined) {
    return db.query(`SELECT ${KEY_COLUMNS} FROM api_keys ORDER BY created_at_ms, rowid`).all() as ApiKeyRow[];
  }
  return db
    .query(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE account_id = ? ORDER BY created_at_ms, rowid`)
    .all(account_id) as ApiKeyRow[];
}
