// The embedded mode's retry results on disk (issue 21 item 3): successful results a retry may be
// replayed, kept for the replay window in their own SQLite file beside the ledger (`replays.db`), so
// a retry that crosses a restart is replayed instead of billed again. Its own file because it holds
// output text, which the ledger never does, and because losing it costs nothing but a re-run:
// synchronous=NORMAL (a process crash loses nothing; power loss may lose the last results).
import { Database } from "bun:sqlite";
import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import type { ReplayBackend, SharedEntry, StoredResult } from "./replayBackend.ts";

export interface ReplayFile extends ReplayBackend {
  /** Results held (tests, diagnostics). */
  count(): number;
  close(): void;
}

interface Row {
  fingerprint: string;
  status: number;
  headers: string;
  body: Uint8Array;
  at_ms: number;
}

/**
 * Expired rows are deleted at most this often, not with every write: a read never returns a row past
 * the window, so a row left a little longer changes no answer, and each write saves a DELETE.
 */
export const PRUNE_EVERY_MS = 1_000;

export function openReplayFile(path: string, options: { now: () => number; windowMs: number }): ReplayFile {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path, { create: true, strict: true });
  db.exec("PRAGMA busy_timeout = 5000");
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = NORMAL");
  db.exec(`CREATE TABLE IF NOT EXISTS replay_results (
    id          TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status      INTEGER NOT NULL,
    headers     TEXT NOT NULL,
    body        BLOB NOT NULL,
    at_ms       INTEGER NOT NULL
  ) STRICT`);
  db.exec("CREATE INDEX IF NOT EXISTS replay_results_at ON replay_results (at_ms)");
  const select = db.query<Row, [string, number]>("SELECT fingerprint, status, headers, body, at_ms FROM replay_results WHERE id = ? AND at_ms > ?");
  const upsert = db.query("INSERT OR REPLACE INTO replay_results (id, fingerprint, status, headers, body, at_ms) VALUES (?, ?, ?, ?, ?, ?)");
  const remove = db.query("DELETE FROM replay_results WHERE id = ?");
  const prune = db.query("DELETE FROM replay_results WHERE at_ms <= ?");

  const read = (id: string): SharedEntry | null => {
    const row = select.get(id, options.now() - options.windowMs);
    if (!row) return null;
    const body = new Uint8Array(row.body);
    return { state: "succeeded", fingerprint: row.fingerprint, status: row.status, headers: JSON.parse(row.headers) as string[], body: body.buffer };
  };
  let prunedAt = -Infinity;
  const write = (id: string, result: StoredResult, at: number) =>
    upsert.run(id, result.fingerprint, result.status, JSON.stringify(result.headers), new Uint8Array(result.body), at);

  return {
    // A templated stream's body is kept compact, about a tenth of its bytes and WAL pages (docs/benchmarks.md,
    // "End-of-stream work pass"): only this process's own code reads this file.
    keepsCompact: true,
    // No run survives a restart, so nothing is ever in flight here: only finished results are found.
    claim: async (keyId) => read(`k:${keyId}`),
    latest: async (fingerprint) => read(`b:${fingerprint}`),
    // A newer run of the same body is this process's memory's to know; a failed one removes the entry.
    started: () => {},
    finished(keyId, fingerprint, result) {
      const now = options.now();
      db.transaction(() => {
        if (now - prunedAt >= PRUNE_EVERY_MS) {
          prune.run(now - options.windowMs);
          prunedAt = now;
        }
        if (result === null) {
          if (keyId !== null) remove.run(`k:${keyId}`);
          remove.run(`b:${fingerprint}`);
          return;
        }
        if (keyId !== null) write(`k:${keyId}`, result, now);
        write(`b:${fingerprint}`, result, now);
      })();
    },
    count: () => (db.query("SELECT COUNT(*) AS n FROM replay_results").get() as { n: number }).n,
    close: () => db.close(),
  };
}
