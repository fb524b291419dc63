// Group commit for the gateway's own store. Every request writes the ledger several times
// (reservation, route snapshot, accepted measurement, delivered record, receipt, settlement, request
// end), each a commit of its own without grouping: one fsync each at synchronous=FULL, which made
// SQLite most of the gateway's CPU profile (docs/benchmarks.md). With group commit the first of these
// writes in an event-loop turn opens one BEGIN IMMEDIATE transaction, every other one of the turn
// joins it (a bun:sqlite nested transaction is a SAVEPOINT, so an operation that fails still rolls
// back alone), and the transaction commits once, at the end of the turn (setImmediate) — or, when no
// effect waits for it, up to LAZY_COMMIT_MS later (below). Invariants:
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
// Durability tiers (docs/decisions.md): given a WAL syncer, a group commits with synchronous=NORMAL —
// a WAL append, which survives a process crash, so the job leaves without waiting for an fsync — and
// the acknowledgements of a group that moved money (the `settled` frame) wait until the WAL is synced
// off the event loop, which is what synchronous=FULL would have bought them.
// If the COMMIT itself fails (disk error), the group is rolled back and every waiting effect is told
// `false`: the job is not sent, the settled frame is not sent. The gateway's own hook (onCommitFailed)
// stops the process first: the group's writes are lost while memory acted on them (docs/decisions.md).

import type { Database } from "bun:sqlite";
import type { ApiKeyLookup } from "./accountTypes.ts";
import type { LedgerStore } from "./ledgerTypes.ts";
import type { RequestSlotStore } from "./requestSlots.ts";
import type { GroupCommitPort } from "./types.ts";
import type { SyncWal } from "./walSync.ts";

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
 * Grouped writes that move money (a settlement's ledger posting): their group's lazy effects (the
 * `settled` frame) wait until the WAL is synced, when the store syncs it off the event loop.
 */
const MONEY_MOVING: ReadonlySet<string> = new Set<keyof LedgerStore>(["settleAttempt"]);
/** Methods that neither commit the group nor forget cached keys: process-memory counters and the commit port itself. */
const AS_IS: ReadonlySet<string> = new Set<keyof RequestSlotStore | keyof GroupCommitPort>([
  "acquireRequestSlot",
  "releaseRequestSlot",
  "requestSlotsInUse",
  "afterCommit",
  "afterLazyCommit",
  "flushCommits",
]);
/**
 * The key lookup reads inside the open group without committing it; outside a group its occasional
 * write (the key's last use) commits on its own, at FULL like every write outside a group.
 */
const READS_IN_GROUP: ReadonlySet<string> = new Set<keyof ApiKeyLookup>(["authenticateApiKey"]);
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
  /**
   * Durability tiers (docs/decisions.md): when given, groups commit with synchronous=NORMAL — a WAL
   * append that survives a process crash, so the job may leave at once — and a group that moved money
   * runs its lazy effects only once this has synced the WAL (power-loss durable) off the event loop.
   * Without it every group commits with the connection's own setting (FULL) and effects follow it.
   */
  syncWal?: SyncWal;
  /** Asked before each COMMIT; true fails it as a disk error would (fault injection). */
  commitFails?: () => boolean;
  /**
   * Called when a COMMIT failed, after the rollback and before the waiting effects hear `false`. The
   * gateway stops there (fail-stop, docs/decisions.md): memory then holds outcomes the disk does not.
   */
  onCommitFailed?: () => void;
}

/** Wraps a store's methods (an object of functions over `db`) with group commit. */
export function withGroupCommit<S extends object>(store: S, db: Database, options: GroupCommitOptions = {}): S & GroupCommitPort {
  const schedule = options.schedule ?? ((run) => void setImmediate(run));
  const scheduleLazy = options.scheduleLazy ?? ((run) => void setTimeout(run, LAZY_COMMIT_MS).unref());
  const beforeOtherCall = options.beforeOtherCall ?? (() => {});
  const syncWal = options.syncWal;
  let open = false;
  /** Counts groups, so a scheduled commit of an already committed group does nothing. */
  let group = 0;
  /** Whether the open group's end-of-turn commit is scheduled (an effect waits for it). */
  let urgent = false;
  /** Whether the open group holds a money-moving write. */
  let movedMoney = false;
  /** Effects that need the group committed (the job leaving): they run right after the COMMIT. */
  let waitingCommit: ((committed: boolean) => void)[] = [];
  /** Effects that acknowledge the group's writes (the `settled` frame): they wait for durability. */
  let waitingDurable: ((committed: boolean) => void)[] = [];

  const commit = (): boolean => {
    try {
      if (options.commitFails?.()) throw new Error("injected commit failure");
      db.exec("COMMIT");
      return true;
    } catch {
      try {
        db.exec("ROLLBACK");
      } catch {}
      return false;
    }
  };
  // SQLite refuses to change the level inside a transaction, and a COMMIT uses the level of its BEGIN:
  // a group sets NORMAL before it begins, a call outside a group sets FULL before it runs, and each
  // only when the level differs — groups that follow each other switch nothing.
  let level: "FULL" | "NORMAL" = "FULL";
  const atLevel = (wanted: "FULL" | "NORMAL") => {
    if (syncWal === undefined || level === wanted || db.inTransaction) return;
    db.exec(`PRAGMA synchronous = ${wanted}`);
    level = wanted;
  };
  const flushCommits = () => {
    if (!open) return;
    open = false;
    urgent = false;
    const forCommit = waitingCommit;
    const forDurable = waitingDurable;
    const mustSync = movedMoney && syncWal !== undefined;
    waitingCommit = [];
    waitingDurable = [];
    movedMoney = false;
    const committed = commit();
    if (!committed) options.onCommitFailed?.();
    for (const effect of forCommit) effect(committed);
    if (committed && (mustSync || syncsInFlight > 0)) whenDurable(forDurable);
    else for (const effect of forDurable) effect(committed);
  };
  /** Runs `effects` once the WAL is synced; while any sync is in flight, every acknowledgement waits. */
  let syncsInFlight = 0;
  const whenDurable = (effects: ((committed: boolean) => void)[]) => {
    syncsInFlight++;
    syncWal!((synced) => {
      syncsInFlight--;
      for (const effect of effects) effect(synced);
    });
  };
  const join = () => {
    // Another transaction of this connection is running (inside a store method): it owns its commit.
    if (open || db.inTransaction) return;
    atLevel("NORMAL");
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
    if (open) waitingDurable.push(effect);
    else if (syncsInFlight > 0) whenDurable([effect]);
    else effect(true);
  };
  // The group commits at the end of this turn, and the effect follows the COMMIT.
  const afterCommit = (effect: (committed: boolean) => void) => {
    if (!open) return effect(true);
    waitingCommit.push(effect);
    if (urgent) return;
    urgent = true;
    const which = group;
    schedule(() => commitGroup(which));
  };

  const wrapped: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(store) as [string, (...args: unknown[]) => unknown][]) {
    if (typeof value !== "function") wrapped[name] = value;
    else if (GROUPED.has(name)) {
      const movesMoney = MONEY_MOVING.has(name);
      wrapped[name] = (...args: unknown[]) => {
        join();
        if (movesMoney) movedMoney = true;
        return value(...args);
      };
    } else if (AS_IS.has(name)) wrapped[name] = value;
    else if (READS_IN_GROUP.has(name)) {
      wrapped[name] = (...args: unknown[]) => {
        if (!open) atLevel("FULL");
        return value(...args);
      };
    } else {
      wrapped[name] = (...args: unknown[]) => {
        flushCommits();
        atLevel("FULL");
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
