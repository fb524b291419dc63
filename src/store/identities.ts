// Sign-up through external identity providers: pending logins (one per authorization request),
// identities linked on (issuer, subject), browser sessions of the account page, and the API keys the
// account page issues. The raw API key never reaches a table: only its hash (api_keys) and, until its
// one display, a ciphertext that only the browser's session cookie can open (see src/http/signup).

import type { Database } from "bun:sqlite";
import { createAccount, createApiKey } from "./accounts.ts";
import type { RandomBytes } from "./ids.ts";

/** An authorization request in flight: what the callback needs to finish it. */
export interface PendingLogin {
  state: string;
  idp: string;
  /** sha256 of the browser-binding cookie: the callback must come from the browser that started. */
  browser_hash: Uint8Array;
  code_verifier: string;
  nonce: string;
  created_at_ms: number;
  expires_at_ms: number;
}

export interface IdentityRow {
  issuer: string;
  subject: string;
  account_id: string;
  idp: string;
  email: string | null;
  created_at_ms: number;
  last_login_at_ms: number;
}

export interface AccountSession {
  account_id: string;
  created_at_ms: number;
  expires_at_ms: number;
}

/** Seals a freshly issued raw API key for its one display; the store keeps only the result. */
export type SealKey = (api_key: string) => Uint8Array;

export interface SignInInput {
  idp: string;
  issuer: string;
  subject: string;
  email: string | null;
  /** sha256 of the new session cookie's value. */
  session_hash: Uint8Array;
  session_expires_at_ms: number;
  /** How long the sealed key waits for its one display. */
  reveal_ttl_ms: number;
}

export interface SignInResult {
  account_id: string;
  /** True when this sign-in created the account (and its first key). */
  created: boolean;
}

export type IssueKeyResult = { ok: true; key_id: string } | { ok: false; code: "not_found" | "too_many_keys" };

export interface IdentityStore {
  /** Records an authorization request; also drops pending logins that have expired. */
  savePendingLogin(login: PendingLogin, now_ms?: number): void;
  /** Removes and returns the pending login for `state` — once: a second call (a replayed callback)
   *  gets null. Null as well when it expired. */
  takePendingLogin(state: string, now_ms?: number): PendingLogin | null;
  /** Finds the account linked to (issuer, subject) or creates it with a first API key, and opens a
   *  session; atomically, so a crash never leaves an account without its identity. A new key is
   *  stored hashed; `seal` turns it into the session's one-time reveal. */
  signIn(input: SignInInput, seal: SealKey, now_ms?: number): SignInResult;
  listIdentities(account_id: string): IdentityRow[];
  /** The live (unexpired, not ended) session with this cookie hash, or null. */
  getAccountSession(session_hash: Uint8Array, now_ms?: number): AccountSession | null;
  /** Takes the session's sealed key for display: it is cleared in the same statement, so it is
   *  returned at most once. Null when there is none or it waited too long. */
  takeKeyReveal(session_hash: Uint8Array, now_ms?: number): Uint8Array | null;
  endAccountSession(session_hash: Uint8Array, now_ms?: number): void;
  /** Issues a key for the session's account — replacing (revoking) `replaces_key_id` when given, in
   *  the same transaction — and stores its sealed reveal on the session. `not_found`: the replaced key
   *  is not a live key of this account; `too_many_keys`: the account already has `max_live_keys`. */
  issueAccountKey(
    input: { account_id: string; session_hash: Uint8Array; replaces_key_id?: string; reveal_ttl_ms: number; max_live_keys: number },
    seal: SealKey,
    now_ms?: number,
  ): IssueKeyResult;
  /** Revokes a key only if it belongs to `account_id`; false when it does not (or is unknown). */
  revokeAccountKey(account_id: string, key_id: string, now_ms?: number): boolean;
}

/** Label of the key created with a new account (rotations keep the label of the key they replace). */
export const SIGNUP_KEY_LABEL = "sign-up";

export function identityStore(db: Database, random: RandomBytes, keyPrefix: string, clock: () => number): IdentityStore {
  const savePendingLogin = (login: PendingLogin, now_ms = clock()) => {
    db.transaction(() => {
      db.query("DELETE FROM oidc_pending_logins WHERE expires_at_ms <= ?").run(now_ms);
      db.query(
        `INSERT INTO oidc_pending_logins (state, idp, browser_hash, code_verifier, nonce, created_at_ms, expires_at_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?)`,
      ).run(login.state, login.idp, login.browser_hash, login.code_verifier, login.nonce, login.created_at_ms, login.expires_at_ms);
    })();
  };

  const takePendingLogin = (state: string, now_ms = clock()): PendingLogin | null => {
    // DELETE … RETURNING is one statement: two concurrent callbacks cannot both get the row.
    const row = db.query("DELETE FROM oidc_pending_logins WHERE state = ? RETURNING *").get(state) as PendingLogin | null;
    if (row === null || row.expires_at_ms <= now_ms) return null;
    return row;
  };

  const liveKeyCount = (account_id: string): number =>
    (db.query("SELECT COUNT(*) AS n FROM api_keys WHERE account_id = ? AND revoked_at_ms IS NULL").get(account_id) as { n: number }).n;

  const signIn = (input: SignInInput, seal: SealKey, now_ms = clock()): SignInResult =>
    db
      .transaction((): SignInResult => {
        const linked = db
          .query("SELECT account_id FROM oidc_identities WHERE issuer = ? AND subject = ?")
          .get(input.issuer, input.subject) as { account_id: string } | null;
        let account_id: string;
        let reveal: Uint8Array | null = null;
        if (linked) {
          account_id = linked.account_id;
          db.query("UPDATE oidc_identities SET last_login_at_ms = ?, email = COALESCE(?, email) WHERE issuer = ? AND subject = ?").run(
            now_ms,
            input.email,
            input.issuer,
            input.subject,
          );
        } else {
          account_id = createAccount(db, random, { name: input.email ?? undefined, tier: "free" }, now_ms).account_id;
          db.query(
            `INSERT INTO oidc_identities (issuer, subject, account_id, idp, email, created_at_ms, last_login_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)`,
          ).run(input.issuer, input.subject, account_id, input.idp, input.email, now_ms, now_ms);
          const { api_key } = createApiKey(db, random, keyPrefix, { account_id, label: SIGNUP_KEY_LABEL }, now_ms);
          reveal = seal(api_key);
        }
        db.query(
          `INSERT INTO account_sessions (id_hash, account_id, created_at_ms, expires_at_ms, reveal, reveal_expires_at_ms)
           VALUES (?, ?, ?, ?, ?, ?)`,
        ).run(input.session_hash, account_id, now_ms, input.session_expires_at_ms, reveal, reveal ? now_ms + input.reveal_ttl_ms : null);
        return { account_id, created: linked === null };
      })
      .immediate();

  const listIdentities = (account_id: string): IdentityRow[] =>
    db.query("SELECT * FROM oidc_identities WHERE account_id = ? ORDER BY created_at_ms").all(account_id) as IdentityRow[];

  const getAccountSession = (session_hash: Uint8Array, now_ms = clock()): AccountSession | null =>
    db
      .query(
        `SELECT account_id, created_at_ms, expires_at_ms FROM account_sessions
          WHERE id_hash = ? AND ended_at_ms IS NULL AND expires_at_ms > ?`,
      )
      .get(session_hash, now_ms) as AccountSession | null;

  // Read and clear in one write transaction (RETURNING would give the cleared values), so two
  // concurrent page loads cannot both get the key.
  const takeKeyReveal = (session_hash: Uint8Array, now_ms = clock()): Uint8Array | null =>
    db
      .transaction((): Uint8Array | null => {
        const row = db
          .query("SELECT reveal, reveal_expires_at_ms FROM account_sessions WHERE id_hash = ? AND reveal IS NOT NULL")
          .get(session_hash) as { reveal: Uint8Array; reveal_expires_at_ms: number } | null;
        if (row === null) return null;
        db.query("UPDATE account_sessions SET reveal = NULL, reveal_expires_at_ms = NULL WHERE id_hash = ?").run(session_hash);
        return row.reveal_expires_at_ms > now_ms ? row.reveal : null;
      })
      .immediate();

  const endAccountSession = (session_hash: Uint8Array, now_ms = clock()) => {
    db.query("UPDATE account_sessions SET ended_at_ms = ?, reveal = NULL, reveal_expires_at_ms = NULL WHERE id_hash = ? AND ended_at_ms IS NULL").run(
      now_ms,
      session_hash,
    );
  };

  const issueAccountKey: IdentityStore["issueAccountKey"] = (input, seal, now_ms = clock()) =>
    db
      .transaction((): IssueKeyResult => {
        let label: string | undefined;
        if (input.replaces_key_id !== undefined) {
          const old = db
            .query("SELECT label FROM api_keys WHERE id = ? AND account_id = ? AND revoked_at_ms IS NULL")
            .get(input.replaces_key_id, input.account_id) as { label: string | null } | null;
          if (old === null) return { ok: false, code: "not_found" };
          label = old.label ?? undefined;
          db.query("UPDATE api_keys SET revoked_at_ms = ? WHERE id = ?").run(now_ms, input.replaces_key_id);
        } else if (liveKeyCount(input.account_id) >= input.max_live_keys) {
          return { ok: false, code: "too_many_keys" };
        }
        const { key_id, api_key } = createApiKey(db, random, keyPrefix, { account_id: input.account_id, label }, now_ms);
        db.query("UPDATE account_sessions SET reveal = ?, reveal_expires_at_ms = ? WHERE id_hash = ?").run(
          seal(api_key),
          now_ms + input.reveal_ttl_ms,
          input.session_hash,
        );
        return { ok: true, key_id };
      })
      .immediate();

  const revokeAccountKey = (account_id: string, key_id: string, now_ms = clock()): boolean =>
    db
      .query("UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, ?) WHERE id = ? AND account_id = ?")
      .run(now_ms, key_id, account_id).changes > 0;

  return {
    savePendingLogin,
    takePendingLogin,
    signIn,
    listIdentities,
    getAccountSession,
    takeKeyReveal,
    endAccountSession,
    issueAccountKey,
    revokeAccountKey,
  };
}
