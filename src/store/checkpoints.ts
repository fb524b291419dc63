// Background WAL checkpoints for the gateway's store (issue 7).
//
// With SQLite's automatic checkpoint, the commit that takes the WAL past 1,000 pages copies them all
// into the database file and fsyncs it, on the committing thread: every few dozen requests one commit
// stalled the event loop for milliseconds (the request path's p99). Here the main connection never
// checkpoints; a worker thread with its own connection runs a PASSIVE checkpoint every intervalMs,
// which never blocks the writer (it copies only what is committed and stops at active readers). The
// WAL stays bounded as long as the worker keeps up; if the worker fails, the main connection takes
// automatic checkpoints back, so the WAL can never grow without bound. Durability is unchanged: every
// commit is still fsynced in the WAL before it counts.
import type { Database } from "bun:sqlite";

/** SQLite's default automatic checkpoint threshold (pages), restored when the worker stops or fails. */
const AUTOCHECKPOINT_PAGES = 1000;

// A Blob worker: no separate entry file, so the single-binary build needs nothing extra.
const WORKER_SOURCE = `
import { Database } from "bun:sqlite";
let db = null;
self.onmessage = (event) => {
  const { path, intervalMs } = event.data;
  try {
    db = new Database(path);
    db.exec("PRAGMA busy_timeout = 5000");
    db.exec("PRAGMA synchronous = FULL");
    const checkpoint = db.query("PRAGMA wal_checkpoint(PASSIVE)");
    setInterval(() => {
      try {
        checkpoint.get();
      } catch (error) {
        postMessage({ failed: String(error) });
      }
    }, intervalMs);
    postMessage({ started: true });
  } catch (error) {
    postMessage({ failed: String(error) });
  }
};
`;

export interface BackgroundCheckpoints {
  stop(): void;
}

/**
 * Moves `db`'s WAL checkpoints to a worker thread (a file database in WAL mode only). `onFailure`
 * hears why the worker gave up; the main connection then checkpoints automatically again.
 */
export function startBackgroundCheckpoints(
  db: Database,
  path: string,
  options: { intervalMs?: number; onFailure?: (reason: string) => void } = {},
): BackgroundCheckpoints {
  const url = URL.createObjectURL(new Blob([WORKER_SOURCE], { type: "application/javascript" }));
  const worker = new Worker(url);
  worker.unref();
  let running = true;
  const restoreAutomatic = () => {
    try {
      db.exec(`PRAGMA wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`);
    } catch {}
  };
  const stop = () => {
    if (!running) return;
    running = false;
    worker.terminate();
    URL.revokeObjectURL(url);
    restoreAutomatic();
  };
  worker.onmessage = (event: MessageEvent<{ started?: boolean; failed?: string }>) => {
    if (event.data.failed === undefined || !running) return;
    options.onFailure?.(event.data.failed);
    stop();
  };
  worker.onerror = (event) => {
    if (!running) return;
    options.onFailure?.(event.message);
    stop();
  };
  db.exec("PRAGMA wal_autocheckpoint = 0");
  worker.postMessage({ path, intervalMs: options.intervalMs ?? 100 });
  return { stop };
}
