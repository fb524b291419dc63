// The receipt outbox on disk: a snapshot and a journal of the changes since it.
//
// - `FILE` (the snapshot): the JSON array of the held entries, oldest first — the whole format of the
//   outbox before the journal, so an outbox written by an earlier runtime loads as a snapshot with no
//   journal. Replaced only atomically: temp file, fsync, rename, fsync of the folder.
// - `FILE.journal`: one JSON line per change after the snapshot, appended through one open descriptor: a
//   kept entry (the same JSON as in the snapshot) or a removal (`{request_id, attempt_n, removed: true}`).
//   The lines of one batch (every change of an event-loop turn, or made while the previous batch was
//   being written) go out in one write and, if the batch keeps a receipt, one fdatasync: a batch of
//   removals only is not synced by itself (see append).
//
// Load = the snapshot, then each journal line in order (a keep re-inserts: Map order stays age order).
// A line that does not parse is skipped: only a crash mid-append leaves one, and only in the batch
// that was not yet synced, whose changes no caller was told were on disk.
//
// Compaction writes the state as a new snapshot and empties the journal, at startup (the first write
// of every outbox) and when the journal outgrows JOURNAL_LIVE_FACTOR × the snapshot's size. A crash
// before the rename leaves the old snapshot and the whole journal; after it, the new snapshot and the
// old journal, whose replay over the new snapshot changes nothing (the snapshot already ends where the
// journal ends: each key's last line decides it, in both). The journal is emptied, and that made
// durable, only once the rename is, so no order of crashes pairs the old snapshot with a journal that
// lacks lines it needs.
import * as fs from "node:fs";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { promisify } from "node:util";
import type { LogFn } from "./events.ts";

/** The journal grows to this many times the live entries' size (and at least the floor) before compaction. */
export const JOURNAL_LIVE_FACTOR = 4;
export const JOURNAL_MIN_CHARS = 1 << 20;

export const journalFileOf = (file: string): string => `${file}.journal`;

/** Which attempt an outbox entry belongs to. */
export interface OutboxIds {
  request_id: string;
  attempt_n: number;
}

export const keyOf = (ids: OutboxIds): string => `${ids.attempt_n}/${ids.request_id}`;

export interface PersistedEntry extends OutboxIds {
  receipt: string;
  deadline_ms: number;
}

/** The journal line that removes an entry (settled, expired or dropped). */
export const removalLine = (ids: OutboxIds): string =>
  `{"request_id":${JSON.stringify(ids.request_id)},"attempt_n":${ids.attempt_n},"removed":true}`;

function isPersistedEntry(value: unknown): value is PersistedEntry {
  const v = value as Partial<PersistedEntry> | null;
  return (
    typeof v === "object" &&
    v !== null &&
    typeof v.request_id === "string" &&
    Number.isInteger(v.attempt_n) &&
    typeof v.receipt === "string" &&
    typeof v.deadline_ms === "number"
  );
}

function isRemoval(value: unknown): value is OutboxIds {
  const v = value as (Partial<OutboxIds> & { removed?: unknown }) | null;
  return typeof v === "object" && v !== null && v.removed === true && typeof v.request_id === "string" && Number.isInteger(v.attempt_n);
}

/** Reads `ENOENT` as nothing; any other failure is logged and read as nothing too. */
async function readIfAny(file: string, log: LogFn): Promise<string | null> {
  try {
    return await readFile(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") log("receipt_outbox_unreadable", { file });
    return null;
  }
}

/**
 * The entries the files hold (snapshot, then journal replayed), oldest first, expired ones included.
 * Never fails: an unreadable snapshot counts as empty, unparseable journal lines are skipped (logged).
 */
export async function readOutboxFiles(file: string, log: LogFn): Promise<PersistedEntry[]> {
  const entries = new Map<string, PersistedEntry>();
  const snapshot = await readIfAny(file, log);
  if (snapshot !== null) {
    let parsed: unknown = [];
    try {
      parsed = JSON.parse(snapshot);
    } catch {
      log("receipt_outbox_unreadable", { file });
    }
    for (const item of Array.isArray(parsed) ? parsed : []) if (isPersistedEntry(item)) entries.set(keyOf(item), item);
  }
  const journalFile = journalFileOf(file);
  const journal = await readIfAny(journalFile, log);
  let skipped = 0;
  for (const line of journal === null ? [] : journal.split("\n")) {
    if (line === "") continue;
    let record: unknown;
    try {
      record = JSON.parse(line);
    } catch {
      skipped++;
      continue;
    }
    if (isPersistedEntry(record)) {
      entries.delete(keyOf(record)); // re-insert: a re-kept entry is the youngest
      entries.set(keyOf(record), record);
    } else if (isRemoval(record)) entries.delete(keyOf(record));
    else skipped++;
  }
  if (skipped > 0) log("receipt_outbox_lines_skipped", { file: journalFile, lines: skipped });
  return [...entries.values()];
}

// The journal is held by a bare descriptor, not a FileHandle: Bun fails on a FileHandle collected
// unclosed, and the outbox has no close (its file stays open for the life of the process).
const openFd = promisify(fs.open);
const fdatasync = promisify(fs.fdatasync);
const fsync = promisify(fs.fsync);
const ftruncate = promisify(fs.ftruncate);

/** What the journal has done since it was made (tests, diagnostics). */
export interface JournalStats {
  /** Batches appended: one write each. */
  appends: number;
  /** fsync/fdatasync calls, compactions' included. */
  syncs: number;
  compactions: number;
}

export interface OutboxJournalOptions {
  file: string;
  log: LogFn;
  /** The snapshot text of the state now, with every change appended so far. */
  snapshot: () => string;
  /** The size of that text, kept up to date by the caller (compared with the journal's size). */
  liveChars: () => number;
}

/** The writer: batches appended lines, compacts, and tells when everything so far is on disk. */
export class OutboxJournal {
  readonly stats: JournalStats = { appends: 0, syncs: 0, compactions: 0 };
  private readonly journalFile: string;
  private fd: number | null = null;
  /** Lines not yet handed to a write, without their newlines. */
  private pending: string[] = [];
  /** Whether a pending line must be synced (see append). */
  private pendingSync = false;
  private journalChars = 0;
  /**
   * The next write replaces the snapshot instead of appending: at first (the journal on disk belongs
   * to the snapshot of another process) and after a failed write (the journal may miss lines).
   */
  private mustCompact = true;
  private draining: Promise<void> | null = null;

  constructor(private readonly options: OutboxJournalOptions) {
    this.journalFile = journalFileOf(options.file);
  }

  /**
   * `mustSync`: the line must be on disk before saved() resolves (a kept receipt). A removal need not
   * be: lost in a crash, it leaves a receipt the gateway already settled, re-sent once and a no-op there.
   */
  append(line: string, mustSync: boolean): void {
    this.pending.push(line);
    this.pendingSync ||= mustSync;
    this.draining ??= this.drain();
  }

  /** Writes the state as a new snapshot and empties the journal; resolves when that is on disk. */
  compact(): Promise<void> {
    this.mustCompact = true;
    this.draining ??= this.drain();
    return this.draining;
  }

  /** Resolves once every line appended so far is written and every `mustSync` one synced (or its write failed, which is logged). */
  saved(): Promise<void> {
    return this.draining ?? Promise.resolve();
  }

  private async drain(): Promise<void> {
    // The rest of this turn's changes join the batch.
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.pending.length > 0 || this.mustCompact) {
      const text = this.pending.length > 0 ? `${this.pending.join("\n")}\n` : "";
      const mustSync = this.pendingSync;
      this.pending = [];
      this.pendingSync = false;
      try {
        const bound = Math.max(JOURNAL_MIN_CHARS, JOURNAL_LIVE_FACTOR * this.options.liveChars());
        // A snapshot taken now holds this batch's changes too, so it replaces the append.
        if (this.mustCompact || this.journalChars + text.length > bound) await this.rewrite(this.options.snapshot());
        else await this.appendBatch(text, mustSync);
      } catch (error) {
        this.mustCompact = true;
        this.options.log("receipt_outbox_write_failed", { file: this.options.file, error: (error as NodeJS.ErrnoException).code ?? "error" });
        break; // the next change retries, as a compaction
      }
    }
    this.draining = null;
  }

  private async appendBatch(text: string, mustSync: boolean): Promise<void> {
    const fd = this.fd!; // opened by the compaction every journal starts with
    // A write into the page cache is cheap: done here rather than as a thread-pool round trip (two
    // thread wake-ups), which costs more than the write itself (docs/benchmarks.md).
    fs.appendFileSync(fd, text, "utf8");
    this.stats.appends++;
    this.journalChars += text.length;
    if (!mustSync) return;
    await fdatasync(fd); // also covers any unsynced removals written before
    this.stats.syncs++;
  }

  private async rewrite(snapshot: string): Promise<void> {
    const { file } = this.options;
    const temp = `${file}.${process.pid}.tmp`;
    // Mode 0600 like the key file beside it: receipts name request ids and the account scope.
    const tempHandle = await open(temp, "w", 0o600);
    try {
      await tempHandle.writeFile(snapshot, "utf8");
      await tempHandle.sync();
      this.stats.syncs++;
    } finally {
      await tempHandle.close();
    }
    try {
      await rename(temp, file);
    } catch (error) {
      await unlink(temp).catch(() => {});
      throw error;
    }
    const folder = await open(dirname(file), "r");
    try {
      await folder.sync(); // the rename, before the journal it makes redundant is emptied
      this.stats.syncs++;
    } finally {
      await folder.close();
    }
    this.fd ??= await openFd(this.journalFile, "a", 0o600);
    await ftruncate(this.fd, 0);
    await fsync(this.fd); // emptied before any later line lands in it
    this.stats.syncs++;
    this.stats.compactions++;
    this.journalChars = 0;
    this.mustCompact = false;
  }
}
