// Live reload: the gateway's handle on the catalog in force. `reload()` is cheap when nothing changed
// (one `SELECT MAX(seq)` on the history's primary key), so it can be polled every second or two and
// called on SIGHUP; a `gateway catalog add` in another process (or on another node of a cluster)
// commits a new history row, and the next poll sees the larger seq.
import type { AsyncStore } from "../store/asyncStore.ts";
import { catalogHealth, catalogStateFromEntry, type CatalogHealth, type CatalogState } from "./state.ts";

export type CatalogReload =
  | { ok: true; changed: false }
  | { ok: true; changed: true; state: CatalogState; previous: CatalogState | null }
  | { ok: false; code: string; message: string; seq: number };

export interface CatalogLive {
  /** The catalog in force (null only before any feed was accepted or when none verifies). */
  current(): CatalogState | null;
  /** Loads the latest history entry when its seq differs from the one in force. Never throws. */
  reload(): Promise<CatalogReload>;
  /** ok, or degraded with a reason (expired, missing, or the latest entry failed to verify). */
  health(now_ms: number): CatalogHealth | { status: "degraded"; reason: "catalog_invalid"; message: string };
  /** Raw 32-byte operator public key the catalog is verified under (GET /v1/catalog/pubkey). */
  readonly publicKeyRaw: Uint8Array;
}

/**
 * Creates the handle and loads the latest feed at once. The history's latest row is the catalog in
 * force even when it has expired since (it was fresh when accepted): health() then says degraded.
 * A latest row that does not verify under `publicKeyRaw` (edited database, other key) is not used;
 * the previous state stays in force and health() reports `catalog_invalid` until a good row arrives.
 */
export async function createCatalogLive(deps: {
  store: Pick<AsyncStore, "latestCatalogSeq" | "latestCatalog">;
  publicKeyRaw: Uint8Array;
}): Promise<CatalogLive> {
  let state: CatalogState | null = null;
  // The seq last examined, good or bad: a bad row is reported once, not re-verified on every poll.
  let seenSeq = 0;
  let failure: { code: string; message: string } | null = null;

  // One reload at a time: a poll that finds one running shares its answer.
  let running: Promise<CatalogReload> | null = null;
  const reload = (): Promise<CatalogReload> => {
    running ??= reloadOnce().finally(() => (running = null));
    return running;
  };
  const reloadOnce = async (): Promise<CatalogReload> => {
    let seq: number;
    try {
      seq = await deps.store.latestCatalogSeq();
      if (seq === seenSeq) return { ok: true, changed: false };
      const entry = await deps.store.latestCatalog();
      if (entry === null) return { ok: true, changed: false };
      seq = entry.seq;
      seenSeq = seq;
      const loaded = catalogStateFromEntry(entry, deps.publicKeyRaw);
      if (!loaded.ok) {
        failure = { code: loaded.code, message: loaded.message };
        return { ok: false, code: loaded.code, message: loaded.message, seq };
      }
      const previous = state;
      state = loaded.state;
      failure = null;
      return { ok: true, changed: true, state, previous };
    } catch (error) {
      // e.g. SQLITE_BUSY past busy_timeout, PostgreSQL unreachable: try again at the next poll.
      return { ok: false, code: "store_error", message: error instanceof Error ? error.message : String(error), seq: seenSeq };
    }
  };

  await reload();
  return {
    current: () => state,
    reload,
    health: (now_ms) => (failure !== null ? { status: "degraded", reason: "catalog_invalid", message: failure.message } : catalogHealth(state, now_ms)),
    publicKeyRaw: deps.publicKeyRaw,
  };
}

/** Timer functions, injected so a simulated clock can drive polling in tests. */
export interface PollTimers {
  setInterval: (fn: () => void, ms: number) => unknown;
  clearInterval: (handle: unknown) => void;
}

/** Default poll period: "a running gateway on the same data dir picks it up within seconds". */
export const CATALOG_POLL_MS = 2000;

/**
 * Polls `live.reload()` every `intervalMs` and reports each result other than "unchanged" to
 * `onReload` (log it; refresh anything derived from the catalog). Returns a stop function. SIGHUP
 * wiring belongs to the composition root: `process.on("SIGHUP", () => onReload(live.reload()))`.
 */
export function pollCatalog(
  live: CatalogLive,
  onReload: (result: Exclude<CatalogReload, { ok: true; changed: false }>) => void,
  options: { intervalMs?: number; timers?: PollTimers } = {},
): () => void {
  const timers = options.timers ?? { setInterval: (fn, ms) => setInterval(fn, ms), clearInterval: (h) => clearInterval(h as Timer) };
  const handle = timers.setInterval(() => {
    void live.reload().then((result) => {
      if (!(result.ok && !result.changed)) onReload(result);
    });
  }, options.intervalMs ?? CATALOG_POLL_MS);
  return () => timers.clearInterval(handle);
}
