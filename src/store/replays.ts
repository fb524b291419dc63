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

export interface ReplayFileOptions {
  now: () => number;
  windowMs: number;
  /** Runs the end-of-turn write of the turn's results (default setImmediate). */
  endOfTurn?: (run: () => void) => void;
  /** The end-of-turn write failed: those results are not replayed after a restart (a retry runs again). */
  onWriteFailed?: (error: unknown) => void;
}

export function openReplayFile(path: string, options: ReplayFileOptions): ReplayFile {
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

  // The results finished in one event-loop turn are written together, in one transaction at the end
  // of that turn (a commit each cost a WAL append each). Reads and close write them first.
  const endOfTurn = options.endOfTurn ?? ((run) => void setImmediate(run));
  type Finished = { keyId: string | null; fingerprint: string; result: StoredResult | null; at: number };
  let unwritten: Finished[] = [];
  const writeTurn = db.transaction((turn: Finished[]) => {
    const now = turn.at(-1)!.at;
    if (now - prunedAt >= PRUNE_EVERY_MS) {
      prune.run(now - options.windowMs);
      prunedAt = now;
    }
    for (const { keyId, fingerprint, result, at } of turn) {
      if (result === null) {
        if (keyId !== null) remove.run(`k:${keyId}`);
        remove.run(`b:${fingerprint}`);
        continue;
      }
      if (keyId !== null) write(`k:${keyId}`, result, at);
      write(`b:${fingerprint}`, result, at);
    }
  });
  let closed = false;
  const flush = () => {
    if (unwritten.length === 0 || closed) return;
    const turn = unwritten;
    unwritten = [];
    writeTurn(turn);
  };
  const flushAtEndOfTurn = () => {
    try {
      flush();
    } catch (error) {
      options.onWriteFailed?.(error);
    }
  };

  const read = (id: string): SharedEntry | null => {
    flush();
    const row = select.get(id, options.now() - options.windowMs);
    if (!row) return null;
    const body = new Uint8Array(row.body);
    return { state: "succeeded", fingerprint: row.fingerprint, status: row.status, headers: JSON.parse(row.headers) as string[], body: body.buffer };
  };
  let prunedAt = -Infinity;
  const write = (id: string, result: StoredResult, at: number) =>
    upsert.run(id, result.fingerprint, result.status, JSON.stringify(result.headers), new Uint8Array(result.body), at);

  return {
    // No run survives a restart, so nothing is ever in flight here: only finished results are found.
    claim: async (keyId) => read(`k:${keyId}`),
    latest: async (fingerprint) => read(`b:${fingerprint}`),
    // A newer run of the same body is this process's memory's to know; a failed one removes the entry.
    started: () => {},
    finished(keyId, fingerprint, result) {
      if (unwritten.length === 0) endOfTurn(flushAtEndOfTurn);
      unwritten.push({ keyId, fingerprint, result, at: options.now() });
    },
    count: () => {
      flush();
      return (db.query("SELECT COUNT(*) AS n FROM replay_results").get() as { n: number }).n;
    },
    close: () => {
      flush();
      closed = true;
      db.close();
    },
  };
}
