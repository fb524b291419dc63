// The store as every caller sees it: each durable operation returns a Promise, because PostgreSQL
// (Bun.SQL) answers over a socket; the embedded SQLite store answers at once (its Promise is already
// settled), so its group commit still sees every write of a turn (docs/decisions.md, "One async store
// interface"). Process-memory parts (concurrency slots) and the commit port stay synchronous.

import type { RequestSlotStore } from "./requestSlots.ts";
import type { Store } from "./types.ts";

/** Whether `error` means the store's database could not be reached (PostgreSQL down or restarting), as
 * opposed to a statement it refused: callers answer 503 retryable, nothing having been written. */
export function isStoreUnavailable(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== "string") return false;
  return (
    code.startsWith("ERR_POSTGRES_CONNECTION") ||
    code === "ERR_POSTGRES_IDLE_TIMEOUT" ||
    code === "ERR_POSTGRES_LIFETIME_TIMEOUT" ||
    code === "ECONNREFUSED" ||
    code === "ECONNRESET" ||
    // admin_shutdown, crash_shutdown, cannot_connect_now (the server is starting or stopping)
    ["57P01", "57P02", "57P03"].includes((error as { errno?: string }).errno ?? "")
  );
}

/**
 * Whether the store refused a write as no longer this cluster node's (docs/scale-out.md, "Fencing"): an
 * attempt another node adopted (migration 11), or an opening or reservation of a writer a survivor
 * reaped (migration 12). Nothing of it was written.
 */
export function isAdoptedElsewhere(error: unknown): boolean {
  return (error as { errno?: string } | null)?.errno === "GWF01";
}

/**
 * Whether PostgreSQL aborted the transaction for a conflict with another one (deadlock_detected 40P01,
 * serialization_failure 40001): nothing was written, and the same transaction tried again succeeds.
 */
export function isTransientConflict(error: unknown): boolean {
  return ["40P01", "40001"].includes((error as { errno?: string } | null)?.errno ?? "");
}

/** Which engine holds the durable state. */
export type StoreBackend = "sqlite" | "postgres";

type Sync = keyof RequestSlotStore | "afterCommit" | "afterLazyCommit" | "flushCommits" | "close";

type Promised<T> = {
  [K in keyof T]: T[K] extends (...args: infer A) => infer R ? (...args: A) => Promise<R> : T[K];
};

/** Whether the store's database answers: /healthz and /metrics show it (docs/postgres-store.md). */
export interface StoreHealth {
  backend: StoreBackend;
  up: boolean;
  /** When `up` last changed (ms since the epoch); null when it never did. */
  since_ms: number | null;
}

export type AsyncStore = Promised<Omit<Store, Sync>> &
  Pick<Store, Exclude<Sync, "close">> & {
    readonly backend: StoreBackend;
    health(): StoreHealth;
    close(): Promise<void>;
    /**
     * The request's writes made after this call wait for `gate` (which never rejects), and so do the
     * effects waiting on them (`afterCommit`). Only a store whose writes leave at once needs it (the
     * PostgreSQL store); the embedded store's group commit runs at the end of the turn anyway.
     */
    writesAfter?(request_id: string, gate: Promise<void>): void;
    /**
     * Takes over a pending attempt another cluster node opened (it died): from now on its writes of it
     * are refused (docs/scale-out.md, "Fencing"). Only a store shared by nodes needs it.
     */
    claimAttempt?(request_id: string, attempt_n: number): Promise<void>;
    /** Takes over every pending attempt (a cold start of the whole cluster resumes them all). */
    claimPending?(): Promise<void>;
    /**
     * Marks a dead cluster node incarnation's writer reaped, before anything of it is read or resolved:
     * returns once its attempt openings and reservations in flight are committed, and refuses every
     * later one it made before it learned of the reap (GWF01; docs/scale-out.md, "Fencing").
     */
    writerReaped?(writer: string, now_ms?: number): Promise<void>;
    /**
     * Marks reaped, as writerReaped does, every writer registered in the store that may still write, other
     * than this store's own and `live` (the live nodes' incarnations): where no owned set names the dead
     * (Redis lost its data; a cold start of the whole cluster). Returns how many were marked.
     */
    writersReapedExcept?(live: readonly string[], now_ms?: number): Promise<number>;
  };

/** Methods of the synchronous store that stay synchronous in the async face. */
const SYNC = new Set<string>(["acquireRequestSlot", "releaseRequestSlot", "requestSlotsInUse", "afterCommit", "afterLazyCommit", "flushCommits"]);

/**
 * The async face of the embedded SQLite store: each method runs synchronously (its transaction never
 * spans an await) and hands back a settled Promise; a thrown error becomes a rejected one.
 */
export function asyncStore(store: Store): AsyncStore {
  // A local file: it is up while the process runs (a failing disk shows as failing writes instead).
  const face: Record<string, unknown> = { backend: "sqlite", health: (): StoreHealth => ({ backend: "sqlite", up: true, since_ms: null }) };
  for (const [name, value] of Object.entries(store) as [string, unknown][]) {
    if (typeof value !== "function") face[name] = value;
    else if (SYNC.has(name)) face[name] = value;
    else {
      const method = value as (...args: unknown[]) => unknown;
      face[name] = (...args: unknown[]) => {
        try {
          return Promise.resolve(method(...args));
        } catch (error) {
          return Promise.reject(error);
        }
      };
    }
  }
  return face as unknown as AsyncStore;
}
