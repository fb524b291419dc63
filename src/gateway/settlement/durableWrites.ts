// Settlement writes the gateway hands over without a buyer waiting on them (measurement, delivered
// record, outcome, request end). Each is one store transaction, so a try that failed left nothing:
// while the database is unreachable (a cluster node's PostgreSQL restarting), or when it aborted the
// transaction as a deadlock or serialization failure (two nodes' batches locking the same rows), the
// write is tried again every RETRY_MS until it lands, and the settlement carries on where it stood
// (docs/postgres-store.md).
import type { Log } from "../../log.ts";
import { isAdoptedElsewhere, isStoreUnavailable, isTransientConflict } from "../../store/asyncStore.ts";

/** While the database is unreachable, how long a settlement write waits before it tries again. */
export const RETRY_MS = 500;

export interface DurableWrites {
  /**
   * Runs `write` until it lands (its result), or until stop() (null: a restart's recovery finishes
   * the job). A failure other than an unreachable database or a transient conflict is logged once and gives null.
   */
  run<T>(what: string, ids: { request_id: string; attempt_n?: number }, write: () => Promise<T>): Promise<T | null>;
  stop(): void;
}

/**
 * `adoptedElsewhere` hears of a write the store refused because another cluster node adopted the attempt
 * (docs/scale-out.md, "Fencing"): nothing was written, and nothing of it is this node's to write any more.
 */
export function durableWrites(log: Log, sleep: (ms: number) => Promise<void> = Bun.sleep, adoptedElsewhere?: (ids: { request_id: string; attempt_n?: number }) => void): DurableWrites {
  let stopped = false;
  return {
    async run(what, ids, write) {
      for (let tries = 0; !stopped; tries++) {
        try {
          return await write();
        } catch (error) {
          if (isAdoptedElsewhere(error)) {
            log.warn("settlement_write_refused", { ...ids, write: what, reason: "adopted_elsewhere" });
            adoptedElsewhere?.(ids);
            return null;
          }
          if (!isStoreUnavailable(error) && !isTransientConflict(error)) {
            log.error("settlement_write_failed", { ...ids, write: what, error: String(error) });
            return null;
          }
          if (tries === 0) log.warn("settlement_write_waiting", { ...ids, write: what, error: String(error) });
          await sleep(RETRY_MS);
        }
      }
      return null;
    },
    stop: () => {
      stopped = true;
    },
  };
}
