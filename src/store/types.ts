// The store's public types: one narrow interface for every durable read and write (docs/architecture.md), so a
// PostgreSQL implementation can sit behind the same face later. Every method is synchronous because
// bun:sqlite is, and a transaction must never span an `await`.

import type { SyncWal } from "./walSync.ts";
import type { FeedErrorCode } from "../catalog/feed.ts";

import type { IdentityStore } from "./identities.ts";
import type { DemoSessionStore } from "./demoSessions.ts";
import type { LedgerStore } from "./ledgerTypes.ts";
import type { FeedbackStore } from "./feedback.ts";
import type { RequestSlotStore } from "./requestSlots.ts";
import type { UsageStore } from "./usage.ts";

export type { AccountRow, AccountTier, ApiKeyRow, AuthenticatedKey } from "./accountTypes.ts";
import type { AccountRow, AccountTier, ApiKeyRow, ApiKeyLookup } from "./accountTypes.ts";

export interface ProviderBinding {
  provider_id: string;
  /** Raw 32-byte Ed25519 public key; null only for an id banned before it was ever bound. */
  public_key: Uint8Array | null;
  pinned: boolean;
  banned: boolean;
  /** When the id was first admitted provisionally; null when it never was (e.g. pinned first). */
  first_admitted_at_ms: number | null;
  updated_at_ms: number;
}

/** Outcome of a provisional bind; `already_bound` carries the binding that won. */
export type BindResult =
  | { ok: true; binding: ProviderBinding }
  | { ok: false; code: "already_bound"; binding: ProviderBinding };

/** One accepted catalog feed (docs/catalog.md), as kept in the append-only history. */
export interface CatalogHistoryEntry {
  /** Position in the history, from 1; a later feed has a larger seq. */
  seq: number;
  catalog_id: string;
  /** The exact signed bytes of catalog.json. */
  body: Uint8Array;
  /** Standard padded base64 of the detached Ed25519 signature over `body`. */
  signature: string;
  /** catalog_body_digest: sha256 hex of `body`. */
  body_digest: string;
  /** Raw 32-byte Ed25519 key the signature verified under at acceptance. */
  public_key: Uint8Array;
  issued_at_ms: number;
  expires_at_ms: number;
  accepted_at_ms: number;
}

export interface AppendCatalogInput {
  body: Uint8Array;
  signature: string;
  /** Raw 32-byte Ed25519 operator public key to verify `signature` under. */
  public_key: Uint8Array;
  /** When set, append only if the history's latest seq is still this (0 = empty); else `conflict`. */
  expect_latest_seq?: number;
}

/** `duplicate`: this exact feed was already in the history (nothing appended). */
export type AppendCatalogResult =
  | { ok: true; entry: CatalogHistoryEntry; duplicate: boolean }
  | { ok: false; code: FeedErrorCode | "conflict" | "catalog_id_taken"; message: string };

export interface StoreOptions {
  /** Service prefix of API keys (`<prefix>_…`); letters and digits only. Default `gw`. */
  keyPrefix?: string;
  /** Clock used when a method is not given `now_ms`. Default `Date.now`. */
  now?: () => number;
  /** Randomness for ids, keys and secrets. Default node:crypto `randomBytes`. */
  randomBytes?: (length: number) => Uint8Array;
  /**
   * Group commit (src/store/groupCommit.ts): the request path's ledger writes of one event-loop turn
   * share one transaction, committed at the end of the turn; effects wait with `afterCommit`. Only
   * for a long-running process (the gateway): a short one could exit before the turn ends.
   */
  groupCommit?: boolean;
  /** Runs an open group's lazy commit (default: LAZY_COMMIT_MS later, src/store/groupCommit.ts); tests pass their own clock. */
  lazyCommitTimer?: (run: () => void) => void;
  /** Runs a group's end-of-turn commit (default setImmediate); the simulation passes its own (test/sim/). */
  endOfTurn?: (run: () => void) => void;
  /** Syncs the WAL off the event loop (default: an fdatasync of the file's -wal on the thread pool); null: none. */
  syncWal?: SyncWal | null;
  /** Asked before each group COMMIT; true makes that commit fail as a disk error would (fault injection, test/sim/). */
  commitFails?: () => boolean;
  /** Called when a group COMMIT failed, before its effects hear `false` (the gateway's fail-stop, docs/decisions.md). */
  onCommitFailed?: () => void;
}

/**
 * Durable state. Time: every method that records a time takes an optional trailing `now_ms`;
 * when absent the store's clock (`StoreOptions.now`) is used.
 */
export interface Store extends IdentityStore, DemoSessionStore, LedgerStore, FeedbackStore, UsageStore, RequestSlotStore, GroupCommitPort, ApiKeyLookup {
  createAccount(input: { name?: string; tier: AccountTier }, now_ms?: number): { account_id: string };
  listAccounts(): AccountRow[];
  getAccount(account_id: string): AccountRow | null;
  /** Moves an account to another tier (its keys follow at once); null when the account is unknown. */
  setAccountTier(account_id: string, tier: AccountTier): AccountRow | null;

  /** Issues a key for an existing account (throws on an unknown account: check first). The raw key
   *  is returned here once and never stored. */
  createApiKey(input: { account_id: string; label?: string }, now_ms?: number): { key_id: string; api_key: string };
  /** True when the key exists (revoking twice keeps the first revocation time); false when unknown. */
  revokeApiKey(key_id: string, now_ms?: number): boolean;
  /** Drops cached key lookups, when the store keeps any (another node announced a key or tier change). */
  forgetCachedKeys?(): void;
  listApiKeys(account_id?: string): ApiKeyRow[];

  getProviderBinding(provider_id: string): ProviderBinding | null;
  /** Binds an unbound id to `public_key` as its first provisional admission; never rebinds. */
  bindProvisionalProvider(provider_id: string, public_key: Uint8Array, now_ms?: number): BindResult;
  /** How many ids were first admitted provisionally at or after `since_ms`. */
  countFirstAdmissionsSince(since_ms: number): number;
  /** Creates or rebinds the id to `public_key` and marks it pinned. */
  pinProvider(provider_id: string, public_key: Uint8Array, now_ms?: number): ProviderBinding;
  /** Clears the pin and keeps the binding; null when the id is unknown. */
  unpinProvider(provider_id: string, now_ms?: number): ProviderBinding | null;
  /** Marks the id banned, creating a keyless row when it was never seen. */
  banProvider(provider_id: string, now_ms?: number): ProviderBinding;
  /** Lifts a ban (the id keeps its key and tier); null when the id has no binding. */
  unbanProvider(provider_id: string, now_ms?: number): ProviderBinding | null;
  listProviders(): ProviderBinding[];

  /** The named secret, generated with `byteLength` random bytes on first use and persisted. */
  getOrCreateSecret(name: string, byteLength: number): Uint8Array;

  /** Appends a feed to the catalog history when its signature verifies under `public_key` and it
   *  has not expired at `now_ms`; never updates or removes a row. */
  appendCatalog(input: AppendCatalogInput, now_ms?: number): AppendCatalogResult;
  /** The most recently accepted feed (the one in force), or null before the first. */
  latestCatalog(): CatalogHistoryEntry | null;
  /** Seq of the most recently accepted feed, 0 before the first: a cheap change check for reloads. */
  latestCatalogSeq(): number;
  getCatalog(catalog_id: string): CatalogHistoryEntry | null;
  /** Every accepted feed with seq > `after_seq` (default 0), oldest first. */
  listCatalogHistory(after_seq?: number): CatalogHistoryEntry[];

  close(): void;
}

/** How a write's outside effect waits for the write to be durable (group commit, src/store/groupCommit.ts). */
export interface GroupCommitPort {
  /**
   * Runs `effect(true)` once every write made so far is durable — synchronously when none is waiting
   * for a commit — or `effect(false)` when their commit failed. With `request_id`, the writes it waits
   * for may be narrowed to that request's own (the PostgreSQL store does: one request's dispatch never
   * waits for another's settlement); the embedded group commit covers every write of the turn anyway.
   */
  afterCommit(effect: (committed: boolean) => void, request_id?: string): void;
  /**
   * `afterCommit` for an effect nobody waits on (the `settled` frame): it asks for no commit of its own
   * and rides the group's next one — the next urgent effect's, or the lazy one within LAZY_COMMIT_MS.
   */
  afterLazyCommit(effect: (committed: boolean) => void, request_id?: string): void;
  /** Commits the open group now (tests, shutdown); runs the waiting effects. */
  flushCommits(): void;
}
