// Group commit and cached key lookups for the gateway's own store (issue 7, docs/benchmarks.md).
//
// Group commit. Every request writes the ledger several times (reservation, route snapshot, accepted
// measurement, delivered record, receipt, settlement, request end), each a synchronous=FULL commit —
// one fsync each (0.2 ms p50 here, milliseconds at p99), which made SQLite most of the gateway's CPU
// profile. With group commit the first of these writes in an event-loop turn opens one BEGIN IMMEDIATE
// transaction, every other one of the turn joins it (a bun:sqlite nested transaction is a SAVEPOINT,
// so an operation that fails still rolls back alone), and the transaction commits once, at the end
// of the turn (setImmediate) — or, when no effect waits for it, up to LAZY_COMMIT_MS later (below). Invariants:
// - a write's outside effect waits for its commit: callers hand the effect to `afterCommit` (the job
//   frame sent to a provider after its route snapshot and reservation, the `settled` frame after the
//   settlement posting). Nothing leaves the process on the strength of an uncommitted write;
// - every other store method first commits the open group (`flush`), so it runs exactly as before
//   (autocommit, on committed state) — other processes and non-ledger paths never see a difference;
// - reads inside the group see its writes (one connection), exactly as if the writes had been serial.
// A group nothing waits for (e.g. a turn whose only write is an attempt's accepted measurement) is not
// committed at the end of its turn: it stays open for at most LAZY_COMMIT_MS, so the writes of the
// following turns join it, and it commits at the end of the first turn that hands it an effect. At one
// request at a time this takes one fsync (0.2–0.4 ms here, blocking the event loop) off the path between
// a provider's `accepted` and its first chunk. Nothing is acknowledged on the strength of a lazy write:
// every outside effect still waits for the commit.
// If the COMMIT itself fails (disk error), the group is rolled back and every waiting effect is told
// `false`: the job is not sent, the settled frame is not sent (the provider re-sends its receipt).
//
// Cached key lookups. authenticateApiKey (SHA-256 + an indexed join) runs on every buyer request; a
// hit in this cache costs one `PRAGMA data_version` instead. Revocation still takes effect at once:
// - in this process, any store call that may revoke a key or change a tier clears the cache first
//   (everything except the hot ledger writes, the in-memory slot counters and lookups themselves);
// - in other processes (the operator CLI: `gateway keys revoke`), any commit changes this connection's
//   `data_version`, which empties the cache before the next lookup is answered.
// Entries are keyed by the key's SHA-256 (never the raw key); last use is still written once a minute.
import type { Database } from "bun:sqlite";
import { hashApiKey } from "./ids.ts";
import { LAST_USED_RESOLUTION_MS } from "./accounts.ts";
import type { AuthenticatedKey } from "./types.ts";

/** Ledger writes of the request path: they join the open group instead of committing alone. */
const GROUPED = new Set([
  "reserve",
  "recordRouteSnapshot",
  "recordAcceptedMeasurement",
  "recordAttemptEnd",
  "recordReceiptArrival",
  "settleAttempt",
  "markRequestEnded",
]);
/** Methods that touch no SQL (process-memory counters): neither flush nor clear anything. */
const MEMORY = new Set(["acquireRequestSlot", "releaseRequestSlot", "requestSlotsInUse", "afterCommit", "afterLazyCommit", "flushCommits", "forgetCachedKeys"]);
const CACHE_LIMIT = 10_000;
/** The longest a group that no effect waits for stays open before it commits anyway. */
export const LAZY_COMMIT_MS = 10;

export interface GroupCommitPort {
  /**
   * Runs `effect(true)` once every write made so far is durable — synchronously when none is waiting
   * for a commit — or `effect(false)` when their commit failed.
   */
  afterCommit(effect: (committed: boolean) => void): void;
  /**
   * `afterCommit` for an effect nobody waits on (the `settled` frame): it asks for no commit of its own
   * and rides the group's next one — the next urgent effect's, or the lazy one within LAZY_COMMIT_MS.
   */
  afterLazyCommit(effect: (committed: boolean) => void): void;
  /** Commits the open group now (tests, shutdown); runs the waiting effects. */
  flushCommits(): void;
  /** Drops every cached key lookup (another node announced a key or tier change). */
  forgetCachedKeys(): void;
}

/** The port for a store without grouping: every write is already committed when it returns. */
export const immediateCommits: GroupCommitPort = {
  afterCommit: (effect) => effect(true),
  afterLazyCommit: (effect) => effect(true),
  flushCommits: () => {},
  forgetCachedKeys: () => {},
};

interface CachedKey {
  key: AuthenticatedKey;
  /** When this process last wrote last_used_at_ms for it (or found it written). */
  lastUsedAt: number;
}

/**
 * Wraps a store's methods (an object of functions over `db`) with group commit and the key cache.
 * `schedule` runs the commit at the end of the turn (setImmediate) and `scheduleLazy` after
 * LAZY_COMMIT_MS; a test may pass its own.
 */
export function withGroupCommit<S extends object>(
  store: S & { authenticateApiKey(api_key: string, now_ms?: number): AuthenticatedKey | null },
  db: Database,
  keyPrefix: string,
  clock: () => number,
  schedule: (run: () => void) => void = (run) => void setImmediate(run),
  scheduleLazy: (run: () => void) => void = (run) => void setTimeout(run, LAZY_COMMIT_MS).unref(),
): S & GroupCommitPort {
  let open = false;
  /** Counts groups, so a scheduled commit of an already committed group does nothing. */
  let group = 0;
  /** Whether the open group's end-of-turn commit is scheduled (an effect waits for it). */
  let urgent = false;
  let waiting: ((committed: boolean) => void)[] = [];

  const flushCommits = () => {
    if (!open) return;
    open = false;
    urgent = false;
    const effects = waiting;
    waiting = [];
    let committed = true;
    try {
      db.exec("COMMIT");
    } catch {
      committed = false;
      try {
        db.exec("ROLLBACK");
      } catch {}
    }
    for (const effect of effects) effect(committed);
  };
  const join = () => {
    // Another transaction of this connection is running (inside a store method): it owns its commit.
    if (open || db.inTransaction) return;
    db.exec("BEGIN IMMEDIATE");
    open = true;
    const opened = ++group;
    scheduleLazy(() => commitGroup(opened));
  };
  const commitGroup = (which: number) => {
    if (open && group === which) flushCommits();
  };
  // The open group always has its lazy commit scheduled (join), so a lazy effect waits at most that.
  const afterLazyCommit = (effect: (committed: boolean) => void) => {
    if (!open) return effect(true);
    waiting.push(effect);
  };
  // The same, and the group commits at the end of this turn.
  const afterCommit = (effect: (committed: boolean) => void) => {
    afterLazyCommit(effect);
    if (!open || urgent) return;
    urgent = true;
    const which = group;
    schedule(() => commitGroup(which));
  };

  const cache = new Map<string, CachedKey>();
  let seenVersion = -1;
  const versionQuery = db.query("PRAGMA data_version");
  const authenticateApiKey = (api_key: string, now_ms = clock()): AuthenticatedKey | null => {
    if (!api_key.startsWith(`${keyPrefix}_`)) return null;
    // Another connection committed since the last lookup (e.g. `gateway keys revoke`): forget all.
    const version = (versionQuery.get() as { data_version: number }).data_version;
    if (version !== seenVersion) {
      cache.clear();
      seenVersion = version;
    }
    const id = Buffer.from(hashApiKey(api_key)).toString("base64");
    const hit = cache.get(id);
    if (hit && now_ms - hit.lastUsedAt < LAST_USED_RESOLUTION_MS) return hit.key;
    const key = store.authenticateApiKey(api_key, now_ms);
    if (key === null) {
      cache.delete(id);
      return null;
    }
    if (cache.size >= CACHE_LIMIT) cache.clear();
    cache.set(id, { key, lastUsedAt: now_ms });
    return key;
  };

  const wrapped: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(store) as [string, (...args: unknown[]) => unknown][]) {
    if (typeof value !== "function") wrapped[name] = value;
    else if (GROUPED.has(name)) {
      wrapped[name] = (...args: unknown[]) => {
        join();
        return value(...args);
      };
    } else if (MEMORY.has(name)) wrapped[name] = value;
    else if (name === "authenticateApiKey") wrapped[name] = authenticateApiKey;
    else {
      wrapped[name] = (...args: unknown[]) => {
        flushCommits();
        // Any other call may revoke a key or change a tier: forget every cached lookup first.
        cache.clear();
        return value(...args);
      };
    }
  }
  wrapped.afterCommit = afterCommit;
  wrapped.afterLazyCommit = afterLazyCommit;
  wrapped.flushCommits = flushCommits;
  wrapped.forgetCachedKeys = () => cache.clear();
  return wrapped as S & GroupCommitPort;
}
