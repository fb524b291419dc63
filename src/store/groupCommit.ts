// Group commit for the gateway's own store (docs/benchmarks.md). Every request writes the ledger
// several times (reservation, route snapshot, accepted measurement, delivered record, receipt, settlement, request end), each a synchronous=FULL commit —
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

import type { Database } from "bun:sqlite";
import type { ApiKeyLookup } from "./accountTypes.ts";
import type { LedgerStore } from "./ledgerTypes.ts";
import type { RequestSlotStore } from "./requestSlots.ts";
import type { GroupCommitPort } from "./types.ts";

/** Ledger writes of the request path: they join the open group instead of committing alone. */
const GROUPED: ReadonlySet<string> = new Set<keyof LedgerStore>([
  "reserve",
  "recordRouteSnapshot",
  "recordAcceptedMeasurement",
  "recordAttemptEnd",
  "recordReceiptArrival",
  "settleAttempt",
  "markRequestEnded",
]);
/**
 * Methods that neither commit the group nor forget cached keys: process-memory counters, the commit
 * port itself, and the (cached) key lookup, which reads inside the open group.
 */
const AS_IS: ReadonlySet<string> = new Set<keyof RequestSlotStore | keyof GroupCommitPort | keyof ApiKeyLookup>([
  "acquireRequestSlot",
  "releaseRequestSlot",
  "requestSlotsInUse",
  "afterCommit",
  "afterLazyCommit",
  "flushCommits",
  "authenticateApiKey",
]);
/** The longest a group that no effect waits for stays open before it commits anyway. */
export const LAZY_COMMIT_MS = 10;

/** The port for a store without grouping: every write is already committed when it returns. */
export const immediateCommits: GroupCommitPort = {
  afterCommit: (effect) => effect(true),
  afterLazyCommit: (effect) => effect(true),
  flushCommits: () => {},
};

export interface GroupCommitOptions {
  /** Runs before every call that commits the group first (any call that may revoke a key or change a tier). */
  beforeOtherCall?: () => void;
  /** Runs the commit at the end of the turn (default setImmediate). */
  schedule?: (run: () => void) => void;
  /** Runs the lazy commit (default after LAZY_COMMIT_MS). */
  scheduleLazy?: (run: () => void) => void;
}

/** Wraps a store's methods (an object of functions over `db`) with group commit. */
export function withGroupCommit<S extends object>(store: S, db: Database, options: GroupCommitOptions = {}): S & GroupCommitPort {
  const schedule = options.schedule ?? ((run) => void setImmediate(run));
  const scheduleLazy = options.scheduleLazy ?? ((run) => void setTimeout(run, LAZY_COMMIT_MS).unref());
  const beforeOtherCall = options.beforeOtherCall ?? (() => {});
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

  const wrapped: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(store) as [string, (...args: unknown[]) => unknown][]) {
    if (typeof value !== "function") wrapped[name] = value;
    else if (GROUPED.has(name)) {
      wrapped[name] = (...args: unknown[]) => {
        join();
        return value(...args);
      };
    } else if (AS_IS.has(name)) wrapped[name] = value;
    else {
      wrapped[name] = (...args: unknown[]) => {
        flushCommits();
        beforeOtherCall();
        return value(...args);
      };
    }
  }
  wrapped.afterCommit = afterCommit;
  wrapped.afterLazyCommit = afterLazyCommit;
  wrapped.flushCommits = flushCommits;
  return wrapped as S & GroupCommitPort;
}
