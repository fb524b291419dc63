// Receipts the gateway may not have: kept until the attempt is settled or its pending deadline passes,
// and re-sent as `receipt` frames on later sessions (docs/protocol.md: a `receipt` is accepted for any
// still-pending attempt of the same provider id, from any of its sessions).
//
// Whether an `end` that was written to a socket reached the gateway cannot be known when that socket
// dies right after. So every receipt that matters (something was delivered) stays here until the
// gateway's `settled` frame for its attempt says the settlement is final, and every session but the
// one it was last sent on gets it once. A duplicate costs the gateway a no-op (the first terminal
// outcome is final); a missing one costs the provider the attempt's credit.
//
// Optionally persisted (mode 0600) so a provider restarted within the deadline still delivers them: a
// snapshot file and a journal of the changes since it (outboxJournal.ts). Entries hold only ids and the
// envelope (hashes and counts): no prompt, no output.
import type { ProviderFrame, ReceiptFrame } from "../wire/frames.ts";
import type { LogFn } from "./events.ts";
import { keyOf, OutboxJournal, readOutboxFiles, removalLine, type JournalStats, type OutboxIds, type PersistedEntry } from "./outboxJournal.ts";

/** docs/receipts.md: the gateway waits this long for a receipt before it quarantines the attempt. */
export const DEFAULT_RECEIPT_DEADLINE_MS = 300_000;
/** More entries than this means the gateway has not settled anything for a long time; oldest go first. */
export const DEFAULT_OUTBOX_MAX_ENTRIES = 10_000;


interface Entry extends OutboxIds {
  receipt: string;
  /** Wall-clock ms after which the gateway no longer accepts the receipt. */
  deadline_ms: number;
  /** The session (an opaque token) it was last sent on; null = not sent on any live session. */
  sentOn: object | null;
  /** The entry as it is persisted (JSON), made once: its journal line and its part of every snapshot. */
  json: string;
}

export interface ReceiptOutboxOptions {
  now?: () => number;
  log?: LogFn;
  /** Pending deadline counted from the attempt's terminal time (default 300 s). */
  deadlineMs?: number;
  maxEntries?: number;
  /** Persist to this file (the snapshot) and `FILE.journal`; the first change replaces what they held. */
  file?: string;
}

function entryOf(request_id: string, attempt_n: number, receipt: string, deadline_ms: number, sentOn: object | null): Entry {
  const persisted: PersistedEntry = { request_id, attempt_n, receipt, deadline_ms };
  return { request_id, attempt_n, receipt, deadline_ms, sentOn, json: JSON.stringify(persisted) };
}

export class ReceiptOutbox {
  private readonly entries = new Map<string, Entry>();
  private readonly now: () => number;
  private readonly log: LogFn;
  private readonly deadlineMs: number;
  private readonly maxEntries: number;
  private readonly journal: OutboxJournal | null;
  /** Length of the snapshot text of the entries (their JSON and a separator each), for compaction. */
  private liveChars = 2;
  /** No entry expires before this (wall-clock ms; may be early, never late): expire() skips its scan until then. */
  private nextExpiryMs = Number.POSITIVE_INFINITY;

  constructor(options: ReceiptOutboxOptions = {}) {
    this.now = options.now ?? Date.now;
    this.log = options.log ?? (() => {});
    this.deadlineMs = options.deadlineMs ?? DEFAULT_RECEIPT_DEADLINE_MS;
    this.maxEntries = options.maxEntries ?? DEFAULT_OUTBOX_MAX_ENTRIES;
    this.journal =
      options.file === undefined
        ? null
        : new OutboxJournal({ file: options.file, log: this.log, snapshot: () => this.snapshot(), liveChars: () => this.liveChars });
  }

  /**
   * An outbox restored from `options.file` and its journal (missing or unreadable → empty, logged),
   * compacted before it returns: the files then hold exactly the restored, unexpired entries.
   */
  static async load(options: ReceiptOutboxOptions & { file: string }): Promise<ReceiptOutbox> {
    const outbox = new ReceiptOutbox(options);
    const now = outbox.now();
    for (const item of await readOutboxFiles(options.file, outbox.log)) {
      if (item.deadline_ms < now) continue;
      outbox.put(entryOf(item.request_id, item.attempt_n, item.receipt, item.deadline_ms, null));
    }
    if (outbox.entries.size > 0) outbox.log("receipt_outbox_restored", { receipts: outbox.entries.size });
    await outbox.journal!.compact();
    return outbox;
  }

  get size(): number {
    this.expire();
    return this.entries.size;
  }

  /** Ids of the receipts held now (tests, diagnostics). */
  ids(): OutboxIds[] {
    this.expire();
    return [...this.entries.values()].map(({ request_id, attempt_n }) => ({ request_id, attempt_n }));
  }

  /** Writes, fsyncs and compactions of the file so far (tests, diagnostics); null without a file. */
  journalStats(): Readonly<JournalStats> | null {
    return this.journal?.stats ?? null;
  }

  /**
   * Keeps a receipt until its attempt is settled. `sentOn`: the session it was just sent on (in
   * `end`), or null when it could not be sent. With a file, it is on disk once saved() resolves.
   */
  keep(ids: OutboxIds, receipt: string, terminalAtMs: number, sentOn: object | null): void {
    this.expire();
    const entry = entryOf(ids.request_id, ids.attempt_n, receipt, terminalAtMs + this.deadlineMs, sentOn);
    this.remove(ids); // re-insert: Map order is age order, used when trimming (the journal line re-inserts too)
    this.put(entry);
    this.journal?.append(entry.json, true);
    while (this.entries.size > this.maxEntries) {
      const oldest = this.entries.values().next().value as Entry;
      this.removeChanged(oldest);
      this.log("receipt_dropped", { request_id: oldest.request_id, attempt_n: oldest.attempt_n, why: "outbox_full" });
    }
  }

  /** The gateway's `settled` frame: a final label means the receipt is no longer needed. */
  settled(ids: OutboxIds, label: string): void {
    if (label === "pending") return;
    this.removeChanged(ids);
  }

  /**
   * Sends kept receipts not yet sent on `session` as `receipt` frames, at most `limit`. `send` returns
   * false when the frame could not be handed to the socket; such entries stay unsent for the next try.
   */
  flush(session: object, send: (frame: ProviderFrame) => boolean, limit = Number.POSITIVE_INFINITY): number {
    this.expire();
    let sent = 0;
    for (const entry of this.entries.values()) {
      if (sent >= limit) break;
      if (entry.sentOn === session) continue;
      const frame: ReceiptFrame = { type: "receipt", request_id: entry.request_id, attempt_n: entry.attempt_n, receipt: entry.receipt };
      if (!send(frame)) break;
      entry.sentOn = session;
      sent++;
      this.log("receipt_resent", { request_id: entry.request_id, attempt_n: entry.attempt_n });
    }
    return sent;
  }

  /** Resolves once every change so far is written, and every kept receipt synced (no-op without a file). */
  async saved(): Promise<void> {
    await this.journal?.saved();
  }

  private expire(): void {
    const now = this.now();
    if (this.nextExpiryMs >= now) return;
    this.nextExpiryMs = Number.POSITIVE_INFINITY;
    for (const entry of this.entries.values()) {
      if (entry.deadline_ms >= now) {
        this.nextExpiryMs = Math.min(this.nextExpiryMs, entry.deadline_ms);
        continue;
      }
      this.removeChanged(entry);
      // The gateway has quarantined the attempt (no_receipt) by now; sending it would be `late`.
      this.log("receipt_expired", { request_id: entry.request_id, attempt_n: entry.attempt_n });
    }
  }

  private put(entry: Entry): void {
    this.entries.set(keyOf(entry), entry);
    this.liveChars += entry.json.length + 1;
    this.nextExpiryMs = Math.min(this.nextExpiryMs, entry.deadline_ms);
  }

  private remove(ids: OutboxIds): boolean {
    const key = keyOf(ids);
    const entry = this.entries.get(key);
    if (entry === undefined) return false;
    this.entries.delete(key);
    this.liveChars -= entry.json.length + 1;
    return true;
  }

  /** Removes the entry and journals the removal (a re-kept entry's new line replaces it instead). */
  private removeChanged(ids: OutboxIds): void {
    if (this.remove(ids)) this.journal?.append(removalLine(ids), false);
  }

  /** The same text as JSON.stringify of the entries' array, from each entry's JSON made once. */
  private snapshot(): string {
    const parts: string[] = [];
    for (const entry of this.entries.values()) parts.push(entry.json);
    return `[${parts.join(",")}]`;
  }
}
