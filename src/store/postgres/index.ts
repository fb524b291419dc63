// The store on PostgreSQL (a cluster node's durable state, docs/postgres-store.md): every operation of the
// embedded SQLite store with the same semantics, over Bun's built-in SQL client (docs/decisions.md).
// Each write is one transaction; outside effects wait for it through afterCommit, which here waits
// for the writes still in flight. No SQL text is built from values: every value is a parameter.

import { SQL } from "bun";
import { randomBytes as cryptoRandomBytes, timingSafeEqual } from "node:crypto";
import { verifyCatalogFeed } from "../../catalog/feed.ts";
import { LAST_USED_RESOLUTION_MS } from "../accounts.ts";
import { isStoreUnavailable, type AsyncStore, type StoreHealth } from "../asyncStore.ts";
import type { DemoSessionResult } from "../demoSessions.ts";
import type { FeedbackRating, FeedbackRow, RecordFeedbackResult } from "../feedback.ts";
import { SIGNUP_KEY_LABEL, type IdentityRow, type IssueKeyResult, type PendingLogin, type SignInResult } from "../identities.ts";
import { hashApiKey, KEY_PREFIX_PATTERN, newApiKey, newId, type RandomBytes } from "../ids.ts";
import { requestSlotStore } from "../requestSlots.ts";
import type { SettlementLabel } from "../ledgerTypes.ts";
import type { AccountUsage, ModelUsage } from "../usage.ts";
import type { AccountRow, ApiKeyRow, AppendCatalogResult, BindResult, ProviderBinding, StoreOptions } from "../types.ts";
import { KEY_CHANGES_CHANNEL, pgKeyCache } from "./keyCache.ts";
import { pgLedgerStore, type BatchFailed } from "./ledger.ts";
import { postgresMigrations } from "./migrations.ts";
import { bytes, num, numOrNull, toBinding, toCatalogEntry } from "./rows.ts";

type Row = Record<string, unknown>;
type Tx = SQL;

export interface PostgresStoreOptions extends StoreOptions {
  /** Pool size (connections). Default 16. */
  maxConnections?: number;
  /** Seconds to wait for a connection before an operation fails. Default 5. */
  connectionTimeoutSeconds?: number;
  /** Told when a batch of settlements or admissions failed (its calls are then retried one by one). */
  onBatchFailed?: BatchFailed;
  /**
   * The cluster node incarnation writing through this store: its connections carry it (gateway.writer),
   * the attempts it opens are its own, and a write of one another node adopted since is refused
   * (migration 11; docs/scale-out.md, "Fencing"). Absent: nothing is checked (operator CLI, no Redis).
   */
  writer?: string;
}

export { isStoreUnavailable };

const ACCOUNT_COLUMNS = "id AS account_id, name, tier, created_at_ms";
const KEY_COLUMNS = "id AS key_id, account_id, display_prefix, label, created_at_ms, last_used_at_ms, revoked_at_ms";
const CATALOG_COLUMNS = "seq, catalog_id, body, signature, body_digest, public_key, issued_at_ms, expires_at_ms, accepted_at_ms";
const BINDING_COLUMNS = "provider_id, public_key, pinned, banned, first_admitted_at_ms, updated_at_ms";

const toAccount = (r: Row): AccountRow => ({
  account_id: r.account_id as string,
  name: (r.name as string | null) ?? null,
  tier: r.tier as AccountRow["tier"],
  created_at_ms: num(r.created_at_ms),
});
const toKey = (r: Row): ApiKeyRow => ({
  key_id: r.key_id as string,
  account_id: r.account_id as string,
  display_prefix: r.display_prefix as string,
  label: (r.label as string | null) ?? null,
  created_at_ms: num(r.created_at_ms),
  last_used_at_ms: numOrNull(r.last_used_at_ms),
  revoked_at_ms: numOrNull(r.revoked_at_ms),
});
const toFeedback = (r: Row): FeedbackRow => ({
  request_id: r.request_id as string,
  account_id: r.account_id as string,
  rating: r.rating as FeedbackRating,
  comment: (r.comment as string | null) ?? null,
  created_at_ms: num(r.created_at_ms),
  updated_at_ms: num(r.updated_at_ms),
});

/** Applies every PostgreSQL migration not yet recorded, under an advisory lock (nodes may start at once). */
export async function migratePostgres(sql: SQL, migrations: readonly string[] = postgresMigrations): Promise<number> {
  return sql.begin((tx) => applyMigrations(tx, migrations));
}

/** migratePostgres inside a transaction the caller holds (store migrate: schema and rows commit together). */
export async function applyMigrations(tx: SQL, migrations: readonly string[] = postgresMigrations): Promise<number> {
  {
    await tx`SELECT pg_advisory_xact_lock(hashtextextended('gateway:migrations', 0))`;
    await tx`CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`;
    const [row] = await tx`SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations`;
    const current = num((row as Row).v);
    if (current > migrations.length) {
      throw new Error(`database schema version ${current} is newer than this build supports (${migrations.length})`);
    }
    for (let version = current + 1; version <= migrations.length; version++) {
      await tx.unsafe(migrations[version - 1]!);
      await tx`INSERT INTO schema_migrations (version, applied_at) VALUES (${version}, ${Date.now()})`;
    }
    return migrations.length;
  }
}

/**
 * Connects to the PostgreSQL database at `url`, applies its migrations and returns the store.
 * Rejects when the database cannot be reached or holds a newer schema.
 */
export async function openPostgresStore(url: string, options: PostgresStoreOptions = {}): Promise<AsyncStore> {
  const keyPrefix = options.keyPrefix ?? "gw";
  if (!KEY_PREFIX_PATTERN.test(keyPrefix)) throw new Error(`invalid API key prefix ${JSON.stringify(keyPrefix)}`);
  const clock = options.now ?? Date.now;
  const random: RandomBytes = options.randomBytes ?? cryptoRandomBytes;
  const sql = new SQL(url, {
    max: options.maxConnections ?? 16,
    connectionTimeout: options.connectionTimeoutSeconds ?? 5,
    idleTimeout: 60,
    onconnect: () => {},
    ...(options.writer === undefined ? {} : { connection: { "gateway.writer": options.writer } }),
  });
  try {
    await migratePostgres(sql);
    // The writer is known to the database before it writes (migration 13): whoever finds it not alive
    // can mark it without Redis naming it (docs/scale-out.md, "Fencing").
    if (options.writer !== undefined) await sql`SELECT gateway_writer_started(${clock()})`;
  } catch (error) {
    await sql.close().catch(() => {});
    throw error;
  }
  return postgresStore(sql, keyPrefix, clock, random, options.onBatchFailed);
}

async function insertAccount(tx: Tx, random: RandomBytes, name: string | null, tier: string, now_ms: number): Promise<string> {
  const account_id = newId("acct", random);
  await tx`INSERT INTO accounts (id, name, tier, created_at_ms) VALUES (${account_id}, ${name}, ${tier}, ${now_ms})`;
  return account_id;
}

async function insertKey(
  tx: Tx,
  random: RandomBytes,
  keyPrefix: string,
  account_id: string,
  label: string | null,
  now_ms: number,
): Promise<{ key_id: string; api_key: string }> {
  const key_id = newId("key", random);
  const { api_key, display_prefix } = newApiKey(keyPrefix, random);
  await tx`INSERT INTO api_keys (id, account_id, key_hash, display_prefix, label, created_at_ms)
    VALUES (${key_id}, ${account_id}, ${hashApiKey(api_key)}, ${display_prefix}, ${label}, ${now_ms})`;
  return { key_id, api_key };
}

async function bindingOf(tx: Tx, provider_id: string): Promise<ProviderBinding | null> {
  const [row] = await tx.unsafe(`SELECT ${BINDING_COLUMNS} FROM provider_bindings WHERE provider_id = $1`, [provider_id]);
  return row === undefined ? null : toBinding(row as Row);
}

function assertPublicKey(public_key: Uint8Array): void {
  if (public_key.length !== 32) throw new Error(`Ed25519 public key must be 32 bytes, got ${public_key.length}`);
}

/** Methods whose first argument names a request (or is an object with request_id): applied in call order per request. */
const PER_REQUEST = new Set(["reserve", "recordRouteSnapshot", "recordAcceptedMeasurement", "recordAttemptEnd", "recordReceiptArrival", "settleAttempt", "markRequestEnded"]);
/** How often a store whose database went away checks whether it is back. */
const PROBE_MS = 500;

function postgresStore(sql: SQL, keyPrefix: string, clock: () => number, random: RandomBytes, onBatchFailed?: BatchFailed): AsyncStore {
  // Writes in flight, all of them and by request: afterCommit runs an effect once those it follows are
  // settled (committed or failed). An effect of one request (its job leaving, its last byte) follows
  // only that request's writes: waiting for all of them made every dispatch wait for other requests'
  // settlements, a convoy that grew with the load (docs/scale-out.md, "Measured").
  const inflight = new Set<Promise<unknown>>();
  const inflightByRequest = new Map<string, Set<Promise<unknown>>>();
  const track = <T>(promise: Promise<T>, request_id?: string): Promise<T> => {
    inflight.add(promise);
    let mine: Set<Promise<unknown>> | undefined;
    if (request_id !== undefined) {
      mine = inflightByRequest.get(request_id);
      if (mine === undefined) inflightByRequest.set(request_id, (mine = new Set()));
      mine.add(promise);
    }
    const done = () => {
      inflight.delete(promise);
      if (mine === undefined) return;
      mine.delete(promise);
      if (mine.size === 0 && inflightByRequest.get(request_id!) === mine) inflightByRequest.delete(request_id!);
    };
    promise.then(done, done);
    return promise;
  };
  // The request path may hand writes over without awaiting each (the settlement edge does): those of
  // one request must still apply in the order they were made, whatever pool connection runs them.
  const tails = new Map<string, Promise<unknown>>();
  const inOrder = <T>(request_id: string, run: () => Promise<T>): Promise<T> => {
    const before = tails.get(request_id);
    const next = before === undefined ? run() : before.then(run, run);
    tails.set(request_id, next);
    const forget = () => {
      if (tails.get(request_id) === next) tails.delete(request_id);
    };
    next.then(forget, forget);
    return next;
  };
  // Key lookups cached while the change feed is heard (postgres/keyCache.ts). A change this process
  // makes drops the cache before and after its write, so this process never answers from the old row.
  const keys = pgKeyCache();
  const forgettingKeys = <T>(write: PromiseLike<T>): Promise<T> => {
    keys.forget();
    return Promise.resolve(write).finally(() => keys.forget());
  };
  let listening: Promise<SQL.ListenSubscription | null> = Promise.resolve(null);
  let closed = false;
  // (Re)subscribes: the cache answers again only once the LISTEN is acknowledged.
  const hearKeyChanges = () => {
    keys.hearing(false);
    listening = listening.then(async (old) => {
      await old?.unlisten().catch(() => {});
      if (closed) return null;
      return sql.listen(KEY_CHANGES_CHANNEL, () => keys.forget(), () => keys.hearing(true)).catch(() => null);
    });
  };

  // Up or down, from the answers themselves; while down, a probe notices the database's return.
  let health: StoreHealth = { backend: "postgres", up: true, since_ms: null };
  let probe: Timer | null = null;
  const mark = (up: boolean) => {
    if (health.up === up) return;
    health = { backend: "postgres", up, since_ms: clock() };
    // Notifications sent while the database was out of reach may be lost: listen again from scratch.
    if (up) hearKeyChanges();
    else keys.hearing(false);
    if (!up && probe === null) {
      probe = setInterval(() => {
        sql`SELECT 1`.then(
          () => mark(true),
          () => {},
        );
      }, PROBE_MS);
      probe.unref();
    }
    if (up && probe !== null) {
      clearInterval(probe);
      probe = null;
    }
  };
  const observe = <T>(promise: Promise<T>): Promise<T> => {
    promise.then(
      () => mark(true),
      (error) => {
        if (isStoreUnavailable(error)) mark(false);
      },
    );
    return promise;
  };
  const afterCommit = (effect: (committed: boolean) => void, request_id?: string) => {
    const writes = request_id === undefined ? inflight : inflightByRequest.get(request_id);
    if (writes === undefined || writes.size === 0) return effect(true);
    void Promise.allSettled([...writes]).then((results) => effect(results.every((r) => r.status === "fulfilled")));
  };

  const ledger = pgLedgerStore(sql, clock, onBatchFailed);
  hearKeyChanges();

  const store: Omit<AsyncStore, "backend" | "health" | "afterCommit" | "afterLazyCommit" | "flushCommits" | "acquireRequestSlot" | "releaseRequestSlot" | "requestSlotsInUse" | "close"> = {
    async createAccount(input, now_ms = clock()) {
      return { account_id: await insertAccount(sql, random, input.name ?? null, input.tier, now_ms) };
    },
    async listAccounts() {
      return ((await sql.unsafe(`SELECT ${ACCOUNT_COLUMNS} FROM accounts ORDER BY created_at_ms, n`)) as Row[]).map(toAccount);
    },
    async getAccount(account_id) {
      const [row] = await sql.unsafe(`SELECT ${ACCOUNT_COLUMNS} FROM accounts WHERE id = $1`, [account_id]);
      return row === undefined ? null : toAccount(row as Row);
    },
    async setAccountTier(account_id, tier) {
      const [row] = await forgettingKeys(sql.unsafe(`UPDATE accounts SET tier = $1 WHERE id = $2 RETURNING ${ACCOUNT_COLUMNS}`, [tier, account_id]));
      return row === undefined ? null : toAccount(row as Row);
    },

    createApiKey: (input, now_ms = clock()) => insertKey(sql, random, keyPrefix, input.account_id, input.label ?? null, now_ms),
    async authenticateApiKey(api_key, now_ms = clock()) {
      if (!api_key.startsWith(`${keyPrefix}_`)) return null;
      const hash = hashApiKey(api_key);
      const cacheId = Buffer.from(hash).toString("base64");
      const cached = keys.hit(cacheId, now_ms);
      if (cached !== undefined) return cached;
      const ticket = keys.ticket();
      const [found] = await sql`
        SELECT k.id AS key_id, k.account_id, a.tier, k.key_hash, k.last_used_at_ms, k.revoked_at_ms
          FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.key_hash = ${hash}`;
      const row = found as Row | undefined;
      const stored = row === undefined ? null : bytes(row.key_hash);
      if (row === undefined || stored!.length !== hash.length || !timingSafeEqual(stored!, hash) || row.revoked_at_ms !== null) {
        keys.keep(ticket, cacheId, null, now_ms);
        return null;
      }
      let lastUsed = numOrNull(row.last_used_at_ms);
      if (lastUsed === null || now_ms - lastUsed >= LAST_USED_RESOLUTION_MS) {
        await sql`UPDATE api_keys SET last_used_at_ms = ${now_ms}
          WHERE id = ${row.key_id as string} AND (last_used_at_ms IS NULL OR last_used_at_ms <= ${now_ms - LAST_USED_RESOLUTION_MS})`;
        lastUsed = now_ms;
      }
      const key = { account_id: row.account_id as string, key_id: row.key_id as string, tier: row.tier as AccountRow["tier"] };
      keys.keep(ticket, cacheId, key, lastUsed);
      return key;
    },
    async revokeApiKey(key_id, now_ms = clock()) {
      const res = await forgettingKeys(sql`UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, ${now_ms}) WHERE id = ${key_id}`);
      return res.count > 0;
    },
    async listApiKeys(account_id) {
      const rows =
        account_id === undefined
          ? await sql.unsafe(`SELECT ${KEY_COLUMNS} FROM api_keys ORDER BY created_at_ms, n`)
          : await sql.unsafe(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE account_id = $1 ORDER BY created_at_ms, n`, [account_id]);
      return (rows as Row[]).map(toKey);
    },

    getProviderBinding: (provider_id) => bindingOf(sql, provider_id),
    async bindProvisionalProvider(provider_id, public_key, now_ms = clock()): Promise<BindResult> {
      assertPublicKey(public_key);
      return sql.begin(async (tx) => {
        const res = await tx`
          INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, first_admitted_at_ms, updated_at_ms)
          VALUES (${provider_id}, ${public_key}, false, false, ${now_ms}, ${now_ms})
          ON CONFLICT (provider_id) DO UPDATE
            SET public_key = excluded.public_key, first_admitted_at_ms = excluded.first_admitted_at_ms, updated_at_ms = excluded.updated_at_ms
            WHERE provider_bindings.public_key IS NULL`;
        const binding = (await bindingOf(tx, provider_id))!;
        return res.count > 0 ? { ok: true, binding } : { ok: false, code: "already_bound", binding };
      });
    },
    async countFirstAdmissionsSince(since_ms) {
      const [row] = await sql`SELECT COUNT(*) AS n FROM provider_bindings WHERE first_admitted_at_ms >= ${since_ms}`;
      return num((row as Row).n);
    },
    async pinProvider(provider_id, public_key, now_ms = clock()) {
      assertPublicKey(public_key);
      const [row] = await sql.unsafe(
        `INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, updated_at_ms) VALUES ($1, $2, true, false, $3)
         ON CONFLICT (provider_id) DO UPDATE SET public_key = excluded.public_key, pinned = true, updated_at_ms = excluded.updated_at_ms
         RETURNING ${BINDING_COLUMNS}`,
        [provider_id, public_key, now_ms],
      );
      return toBinding(row as Row);
    },
    async unpinProvider(provider_id, now_ms = clock()) {
      const [row] = await sql.unsafe(
        `UPDATE provider_bindings SET pinned = false, updated_at_ms = $1 WHERE provider_id = $2 RETURNING ${BINDING_COLUMNS}`,
        [now_ms, provider_id],
      );
      return row === undefined ? null : toBinding(row as Row);
    },
    async banProvider(provider_id, now_ms = clock()) {
      const [row] = await sql.unsafe(
        `INSERT INTO provider_bindings (provider_id, public_key, pinned, banned, updated_at_ms) VALUES ($1, NULL, false, true, $2)
         ON CONFLICT (provider_id) DO UPDATE SET banned = true, updated_at_ms = excluded.updated_at_ms
         RETURNING ${BINDING_COLUMNS}`,
        [provider_id, now_ms],
      );
      return toBinding(row as Row);
    },
    async unbanProvider(provider_id, now_ms = clock()) {
      const [row] = await sql.unsafe(
        `UPDATE provider_bindings SET banned = false, updated_at_ms = $1 WHERE provider_id = $2 RETURNING ${BINDING_COLUMNS}`,
        [now_ms, provider_id],
      );
      return row === undefined ? null : toBinding(row as Row);
    },
    async listProviders() {
      return ((await sql.unsafe(`SELECT ${BINDING_COLUMNS} FROM provider_bindings ORDER BY provider_id COLLATE "C"`)) as Row[]).map(toBinding);
    },

    async getOrCreateSecret(name, byteLength) {
      if (!Number.isInteger(byteLength) || byteLength < 1) throw new Error(`invalid secret length ${byteLength}`);
      await sql`INSERT INTO secrets (name, value) VALUES (${name}, ${random(byteLength)}) ON CONFLICT (name) DO NOTHING`;
      const [row] = await sql`SELECT value FROM secrets WHERE name = ${name}`;
      const value = bytes((row as Row).value);
      if (value.length !== byteLength) throw new Error(`secret ${name} holds ${value.length} bytes, caller expects ${byteLength}`);
      return value;
    },

    async appendCatalog(input, now_ms = clock()): Promise<AppendCatalogResult> {
      const verified = verifyCatalogFeed(input.body, input.signature, input.public_key, { now_ms });
      if (!verified.ok) return verified;
      const feed = verified.feed;
      return sql.begin(async (tx): Promise<AppendCatalogResult> => {
        // One appender at a time, so expect_latest_seq is checked against the true latest.
        await tx`LOCK TABLE catalog_history IN SHARE ROW EXCLUSIVE MODE`;
        const [existing] = await tx.unsafe(`SELECT ${CATALOG_COLUMNS} FROM catalog_history WHERE catalog_id = $1 OR body_digest = $2`, [
          feed.body.catalog_id,
          feed.digest,
        ]);
        if (existing !== undefined) {
          const entry = toCatalogEntry(existing as Row);
          if (entry.body_digest === feed.digest) return { ok: true, entry, duplicate: true };
          return { ok: false, code: "catalog_id_taken", message: `catalog id ${feed.body.catalog_id} is already in the history with another body` };
        }
        if (input.expect_latest_seq !== undefined) {
          const [latest] = await tx`SELECT COALESCE(MAX(seq), 0) AS seq FROM catalog_history`;
          const seq = num((latest as Row).seq);
          if (seq !== input.expect_latest_seq) {
            return { ok: false, code: "conflict", message: `catalog changed concurrently (latest seq ${seq}, expected ${input.expect_latest_seq})` };
          }
        }
        const [row] = await tx.unsafe(
          `INSERT INTO catalog_history (catalog_id, body, signature, body_digest, public_key, issued_at_ms, expires_at_ms, accepted_at_ms)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ${CATALOG_COLUMNS}`,
          [feed.body.catalog_id, feed.bytes, feed.signature, feed.digest, input.public_key, feed.issued_at_ms, feed.expires_at_ms, now_ms],
        );
        return { ok: true, entry: toCatalogEntry(row as Row), duplicate: false };
      });
    },
    async latestCatalog() {
      const [row] = await sql.unsafe(`SELECT ${CATALOG_COLUMNS} FROM catalog_history ORDER BY seq DESC LIMIT 1`);
      return row === undefined ? null : toCatalogEntry(row as Row);
    },
    async latestCatalogSeq() {
      const [row] = await sql`SELECT COALESCE(MAX(seq), 0) AS seq FROM catalog_history`;
      return num((row as Row).seq);
    },
    async getCatalog(catalog_id) {
      const [row] = await sql.unsafe(`SELECT ${CATALOG_COLUMNS} FROM catalog_history WHERE catalog_id = $1`, [catalog_id]);
      return row === undefined ? null : toCatalogEntry(row as Row);
    },
    async listCatalogHistory(after_seq = 0) {
      const rows = await sql.unsafe(`SELECT ${CATALOG_COLUMNS} FROM catalog_history WHERE seq > $1 ORDER BY seq`, [after_seq]);
      return (rows as Row[]).map(toCatalogEntry);
    },

    // Identities and account sessions (sign-up).
    async savePendingLogin(login: PendingLogin, now_ms = clock()) {
      await sql.begin(async (tx) => {
        await tx`DELETE FROM oidc_pending_logins WHERE expires_at_ms <= ${now_ms}`;
        await tx`INSERT INTO oidc_pending_logins (state, idp, browser_hash, code_verifier, nonce, created_at_ms, expires_at_ms)
          VALUES (${login.state}, ${login.idp}, ${login.browser_hash}, ${login.code_verifier}, ${login.nonce}, ${login.created_at_ms}, ${login.expires_at_ms})`;
      });
    },
    async takePendingLogin(state, now_ms = clock()) {
      const [found] = await sql`DELETE FROM oidc_pending_logins WHERE state = ${state} RETURNING *`;
      if (found === undefined) return null;
      const r = found as Row;
      const login: PendingLogin = {
        state: r.state as string,
        idp: r.idp as string,
        browser_hash: bytes(r.browser_hash),
        code_verifier: r.code_verifier as string,
        nonce: r.nonce as string,
        created_at_ms: num(r.created_at_ms),
        expires_at_ms: num(r.expires_at_ms),
      };
      return login.expires_at_ms <= now_ms ? null : login;
    },
    async signIn(input, seal, now_ms = clock()): Promise<SignInResult> {
      return sql.begin(async (tx) => {
        // One sign-in per identity at a time: two first logins of one subject make one account.
        await tx`SELECT pg_advisory_xact_lock(hashtextextended(${`i:${input.issuer}\n${input.subject}`}, 0))`;
        const [linked] = await tx`SELECT account_id FROM oidc_identities WHERE issuer = ${input.issuer} AND subject = ${input.subject}`;
        let account_id: string;
        let reveal: Uint8Array | null = null;
        if (linked !== undefined) {
          account_id = (linked as Row).account_id as string;
          await tx`UPDATE oidc_identities SET last_login_at_ms = ${now_ms}, email = COALESCE(${input.email}::text, email)
            WHERE issuer = ${input.issuer} AND subject = ${input.subject}`;
        } else {
          account_id = await insertAccount(tx, random, input.email, "free", now_ms);
          await tx`INSERT INTO oidc_identities (issuer, subject, account_id, idp, email, created_at_ms, last_login_at_ms)
            VALUES (${input.issuer}, ${input.subject}, ${account_id}, ${input.idp}, ${input.email}, ${now_ms}, ${now_ms})`;
          const { api_key } = await insertKey(tx, random, keyPrefix, account_id, SIGNUP_KEY_LABEL, now_ms);
          reveal = seal(api_key);
        }
        await tx`INSERT INTO account_sessions (id_hash, account_id, created_at_ms, expires_at_ms, reveal, reveal_expires_at_ms)
          VALUES (${input.session_hash}, ${account_id}, ${now_ms}, ${input.session_expires_at_ms}, ${reveal}, ${reveal ? now_ms + input.reveal_ttl_ms : null})`;
        return { account_id, created: linked === undefined };
      });
    },
    async listIdentities(account_id) {
      const rows = await sql`SELECT * FROM oidc_identities WHERE account_id = ${account_id} ORDER BY created_at_ms`;
      return (rows as Row[]).map(
        (r): IdentityRow => ({
          issuer: r.issuer as string,
          subject: r.subject as string,
          account_id: r.account_id as string,
          idp: r.idp as string,
          email: (r.email as string | null) ?? null,
          created_at_ms: num(r.created_at_ms),
          last_login_at_ms: num(r.last_login_at_ms),
        }),
      );
    },
    async getAccountSession(session_hash, now_ms = clock()) {
      const [row] = await sql`SELECT account_id, created_at_ms, expires_at_ms FROM account_sessions
        WHERE id_hash = ${session_hash} AND ended_at_ms IS NULL AND expires_at_ms > ${now_ms}`;
      if (row === undefined) return null;
      const r = row as Row;
      return { account_id: r.account_id as string, created_at_ms: num(r.created_at_ms), expires_at_ms: num(r.expires_at_ms) };
    },
    async takeKeyReveal(session_hash, now_ms = clock()) {
      // The old values, read and cleared in one statement: two page loads cannot both get the key.
      const [row] = await sql`
        UPDATE account_sessions s SET reveal = NULL, reveal_expires_at_ms = NULL
          FROM (SELECT id_hash, reveal, reveal_expires_at_ms FROM account_sessions WHERE id_hash = ${session_hash} FOR UPDATE) old
         WHERE s.id_hash = old.id_hash AND old.reveal IS NOT NULL
        RETURNING old.reveal, old.reveal_expires_at_ms`;
      if (row === undefined) return null;
      const r = row as Row;
      return num(r.reveal_expires_at_ms) > now_ms ? bytes(r.reveal) : null;
    },
    async endAccountSession(session_hash, now_ms = clock()) {
      await sql`UPDATE account_sessions SET ended_at_ms = ${now_ms}, reveal = NULL, reveal_expires_at_ms = NULL
        WHERE id_hash = ${session_hash} AND ended_at_ms IS NULL`;
    },
    async issueAccountKey(input, seal, now_ms = clock()): Promise<IssueKeyResult> {
      return forgettingKeys(sql.begin(async (tx): Promise<IssueKeyResult> => {
        // The live-key count and the insert must not interleave with another issue for the account.
        await tx`SELECT pg_advisory_xact_lock(hashtextextended(${`k:${input.account_id}`}, 0))`;
        let label: string | null = null;
        if (input.replaces_key_id !== undefined) {
          const [old] = await tx`SELECT label FROM api_keys WHERE id = ${input.replaces_key_id} AND account_id = ${input.account_id} AND revoked_at_ms IS NULL`;
          if (old === undefined) return { ok: false, code: "not_found" };
          label = ((old as Row).label as string | null) ?? null;
          await tx`UPDATE api_keys SET revoked_at_ms = ${now_ms} WHERE id = ${input.replaces_key_id}`;
        } else {
          const [count] = await tx`SELECT COUNT(*) AS n FROM api_keys WHERE account_id = ${input.account_id} AND revoked_at_ms IS NULL`;
          if (num((count as Row).n) >= input.max_live_keys) return { ok: false, code: "too_many_keys" };
        }
        const { key_id, api_key } = await insertKey(tx, random, keyPrefix, input.account_id, label, now_ms);
        await tx`UPDATE account_sessions SET reveal = ${seal(api_key)}, reveal_expires_at_ms = ${now_ms + input.reveal_ttl_ms}
          WHERE id_hash = ${input.session_hash}`;
        return { ok: true, key_id };
      }));
    },
    async revokeAccountKey(account_id, key_id, now_ms = clock()) {
      const res = await forgettingKeys(sql`UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, ${now_ms}) WHERE id = ${key_id} AND account_id = ${account_id}`);
      return res.count > 0;
    },

    async issueDemoSession(input, now_ms = clock()): Promise<DemoSessionResult> {
      return sql.begin(async (tx): Promise<DemoSessionResult> => {
        await tx`SELECT pg_advisory_xact_lock(hashtextextended(${`d:${input.ip_key}`}, 0))`;
        const since = now_ms - input.window_ms;
        await tx`DELETE FROM demo_sessions WHERE issued_at_ms <= ${since}`;
        const [row] = await tx`SELECT COUNT(*) AS n, MIN(issued_at_ms) AS oldest FROM demo_sessions WHERE ip_key = ${input.ip_key} AND issued_at_ms > ${since}`;
        const n = num((row as Row).n);
        if (n >= input.limit) {
          return { ok: false, code: "too_many_sessions", retry_at_ms: (numOrNull((row as Row).oldest) ?? now_ms) + input.window_ms };
        }
        const session_id = Buffer.from(random(12)).toString("base64url");
        const expires_at_ms = now_ms + input.ttl_ms;
        await tx`INSERT INTO demo_sessions (id, ip_key, issued_at_ms, expires_at_ms) VALUES (${session_id}, ${input.ip_key}, ${now_ms}, ${expires_at_ms})`;
        return { ok: true, session_id, issued_at_ms: now_ms, expires_at_ms, remaining: input.limit - n - 1 };
      });
    },

    async recordFeedback(input, now_ms = clock()): Promise<RecordFeedbackResult> {
      return sql.begin(async (tx): Promise<RecordFeedbackResult> => {
        const [owner] = await tx`SELECT account_id FROM reservations WHERE request_id = ${input.request_id}
          UNION ALL SELECT account_id FROM settlements WHERE request_id = ${input.request_id} LIMIT 1`;
        if (owner === undefined || (owner as Row).account_id !== input.account_id) return { ok: false, code: "unknown_request" };
        await tx`SELECT pg_advisory_xact_lock(hashtextextended(${`f:${input.ip_key}`}, 0))`;
        const since = now_ms - input.window_ms;
        await tx`DELETE FROM feedback_submissions WHERE submitted_at_ms <= ${since}`;
        const [count] = await tx`SELECT COUNT(*) AS n, MIN(submitted_at_ms) AS oldest FROM feedback_submissions
          WHERE ip_key = ${input.ip_key} AND submitted_at_ms > ${since}`;
        if (num((count as Row).n) >= input.limit) {
          return { ok: false, code: "too_many_submissions", retry_at_ms: (numOrNull((count as Row).oldest) ?? now_ms) + input.window_ms };
        }
        await tx`INSERT INTO feedback_submissions (ip_key, submitted_at_ms) VALUES (${input.ip_key}, ${now_ms})`;
        const [existing] = await tx`SELECT 1 FROM feedback WHERE request_id = ${input.request_id}`;
        const [row] = await tx`
          INSERT INTO feedback (request_id, account_id, rating, comment, created_at_ms, updated_at_ms)
          VALUES (${input.request_id}, ${input.account_id}, ${input.rating}, ${input.comment}, ${now_ms}, ${now_ms})
          ON CONFLICT (request_id) DO UPDATE SET rating = excluded.rating, comment = excluded.comment, updated_at_ms = excluded.updated_at_ms
          RETURNING *`;
        return { ok: true, feedback: toFeedback(row as Row), replaced: existing !== undefined };
      });
    },
    async listFeedback(filter = {}) {
      const where: string[] = [];
      const args: (string | number)[] = [];
      if (filter.account_id !== undefined) {
        args.push(filter.account_id);
        where.push(`account_id = $${args.length}`);
      }
      if (filter.since_ms !== undefined) {
        args.push(filter.since_ms);
        where.push(`updated_at_ms >= $${args.length}`);
      }
      const limit = filter.limit === undefined ? "" : ` LIMIT ${Math.max(0, Math.floor(filter.limit))}`;
      const rows = await sql.unsafe(
        `SELECT * FROM feedback ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY updated_at_ms DESC, request_id COLLATE "C"${limit}`,
        args,
      );
      return (rows as Row[]).map(toFeedback);
    },
    async feedbackSummary(account_id) {
      const rows = await sql`SELECT rating, COUNT(*) AS n FROM feedback WHERE account_id = ${account_id} GROUP BY rating`;
      const summary = { up: 0, down: 0 };
      for (const r of rows as Row[]) summary[r.rating as FeedbackRating] = num(r.n);
      return summary;
    },

    async dailyTokens(account_id, day) {
      const q = await dayFigures(sql, account_id, day);
      return { used: q.used, reserved: q.reserved };
    },
    async accountUsage(account_id, day): Promise<AccountUsage> {
      return sql.begin("ISOLATION LEVEL REPEATABLE READ READ ONLY", async (tx) => {
        const quota = await dayFigures(tx, account_id, day);
        // The trigger-kept sum of the account's held buyer reservations (migration 10).
        const [held] = await tx`SELECT COALESCE((SELECT held_credits FROM reservation_holds WHERE account_id = ${account_id}), 0) AS c`;
        const labels: Record<SettlementLabel, number> = { pending: 0, verified: 0, quarantined: 0, zero_settled: 0 };
        for (const r of (await tx`SELECT label, COUNT(*) AS n FROM settlements WHERE account_id = ${account_id} GROUP BY label`) as Row[]) {
          labels[r.label as SettlementLabel] = num(r.n);
        }
        const models = (
          (await tx`
            SELECT (r.snapshot::jsonb ->> 'model_id') AS model,
                   COUNT(DISTINCT s.request_id) AS requests, COUNT(*) AS attempts,
                   COALESCE(SUM(s.billed_prompt_tokens), 0) AS billed_prompt_tokens,
                   COALESCE(SUM(s.billed_completion_tokens), 0) AS billed_completion_tokens,
                   COALESCE(SUM(CASE s.payer WHEN 'buyer' THEN s.debit_credits ELSE 0 END), 0) AS charged_credits
              FROM settlements s JOIN route_snapshots r USING (request_id, attempt_n)
             WHERE s.account_id = ${account_id}
             GROUP BY 1 ORDER BY (r.snapshot::jsonb ->> 'model_id') COLLATE "C"`) as Row[]
        ).map(
          (r): ModelUsage => ({
            model: r.model as string,
            requests: num(r.requests),
            attempts: num(r.attempts),
            billed_prompt_tokens: num(r.billed_prompt_tokens),
            billed_completion_tokens: num(r.billed_completion_tokens),
            charged_credits: num(r.charged_credits),
          }),
        );
        return {
          day,
          daily_tokens_used: quota.used,
          daily_tokens_reserved: quota.reserved,
          held_credits: num((held as Row).c),
          spent_credits_total: models.reduce((n, m) => n + m.charged_credits, 0),
          spent_credits_day: quota.spent_day,
          labels,
          models,
        };
      });
    },

    ...ledger,
  };

  // Every durable method's promise is tracked, so afterCommit waits for the writes it follows.
  const face: Record<string, unknown> = { backend: "postgres", health: () => health };
  for (const [name, value] of Object.entries(store)) {
    const method = value as (...args: unknown[]) => Promise<unknown>;
    face[name] = PER_REQUEST.has(name)
      ? (...args: unknown[]) => {
          const first = args[0];
          const request_id = typeof first === "string" ? first : ((first as { request_id?: string }).request_id ?? "");
          return track(observe(inOrder(request_id, () => method(...args))), request_id);
        }
      : (...args: unknown[]) => track(observe(method(...args)));
  }
  return Object.assign(face, requestSlotStore(), {
    forgetCachedKeys: keys.forget,
    afterCommit,
    afterLazyCommit: afterCommit,
    writesAfter: (request_id: string, gate: Promise<void>) => void track(inOrder(request_id, () => gate), request_id),
    flushCommits: () => {},
    close: async () => {
      if (probe !== null) clearInterval(probe);
      closed = true;
      // A LISTEN still waiting for an unreachable server is cut by sql.close() below.
      const subscription = Bun.peek(listening);
      if (subscription !== null && !(subscription instanceof Promise)) await subscription.unlisten().catch(() => {});
      await Promise.allSettled([...inflight]);
      await sql.close();
    },
  }) as unknown as AsyncStore;
}

async function dayFigures(sql: Tx, account_id: string, day: string) {
  const [row] = await sql`
    SELECT COALESCE(SUM(CASE state WHEN 'finalised' THEN used_tokens ELSE 0 END), 0) AS used,
           COALESCE(SUM(CASE state WHEN 'held' THEN tokens ELSE 0 END), 0) AS reserved,
           COALESCE(SUM(CASE WHEN state = 'finalised' AND payer = 'buyer' THEN used_credits ELSE 0 END), 0) AS spent_day
      FROM reservations WHERE account_id = ${account_id} AND day = ${day}`;
  const r = row as Row;
  return { used: num(r.used), reserved: num(r.reserved), spent_day: num(r.spent_day) };
}
