// Receipts the gateway may not have: kept until the attempt is settled or its pending deadline passes,
// and re-sent as `receipt` frames on later sessions (DESIGN §3: a `receipt` is accepted for any
// still-pending attempt of the same provider id, from any of its sessions).
//
// Whether an `end` that was written to a socket reached the gateway cannot be known when that socket
// dies right after. So every receipt that matters (something was delivered) stays here until the
// gateway's `settled` frame for its attempt says the settlement is final, and every session but the
// one it was last sent on gets it once. A duplicate costs the gateway a no-op (the first terminal
// outcome is final); a missing one costs the provider the attempt's credit.
//
// Optionally persisted to a JSON file (mode 0600) so a provider restarted within the deadline still
// delivers them. Entries hold only ids and the envelope (hashes and counts): no prompt, no output.
import { open, readFile, rename, unlink } from "node:fs/promises";
import type { ProviderFrame, ReceiptFrame } from "../wire/frames.ts";
import type { LogFn } from "./events.ts";

/** DESIGN §4: the gateway waits this long for a receipt before it quarantines the attempt. */
export const DEFAULT_RECEIPT_DEADLINE_MS = 300_000;
/** More entries than this means the gateway has not settled anything for a long time; oldest go first. */
export const DEFAULT_OUTBOX_MAX_ENTRIES = 10_000;

export interface OutboxIds {
  request_id: string;
  attempt_n: number;
}

interface Entry extends OutboxIds {
  receipt: string;
  /** Wall-clock ms after which the gateway no longer accepts the receipt. */
  deadline_ms: number;
  /** The session (an opaque token) it was last sent on; null = not sent on any live session. */
  sentOn: object | null;
  /** The entry as it is persisted (JSON), made once: the whole outbox is rewritten after each change. */
  json: string;
}

export interface ReceiptOutboxOptions {
  now?: () => number;
  log?: LogFn;
  /** Pending deadline counted from the attempt's terminal time (default 300 s). */
  deadlineMs?: number;
  maxEntries?: number;
  /** Persist to this file (rewritten atomically after each change). */
  file?: string;
}

const keyOf = (ids: OutboxIds) => `${ids.attempt_n}/${ids.request_id}`;

function entryOf(request_id: string, attempt_n: number, receipt: string, deadline_ms: number, sentOn: object | null): Entry {
  const persisted: PersistedEntry = { request_id, attempt_n, receipt, deadline_ms };
  return { request_id, attempt_n, receipt, deadline_ms, sentOn, json: JSON.stringify(persisted) };
}

interface PersistedEntry extends OutboxIds {
  receipt: string;
  deadline_ms: number;
}

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

export class ReceiptOutbox {
  private readonly entries = new Map<string, Entry>();
  private readonly now: () => number;
  private readonly log: LogFn;
  private readonly deadlineMs: number;
  private readonly maxEntries: number;
  private saving: Promise<void> = Promise.resolve();
  private dirty = false;
  /** No entry expires before this (wall-clock ms; may be early, never late): expire() skips its scan until then. */
  private nextExpiryMs = Number.POSITIVE_INFINITY;

  constructor(private readonly options: ReceiptOutboxOptions = {}) {
    this.now = options.now ?? Date.now;
    this.log = options.log ?? (() => {});
    this.deadlineMs = options.deadlineMs ?? DEFAULT_RECEIPT_DEADLINE_MS;
    this.maxEntries = options.maxEntries ?? DEFAULT_OUTBOX_MAX_ENTRIES;
  }

  /** An outbox restored from `options.file` (missing or unreadable file → empty, logged). */
  static async load(options: ReceiptOutboxOptions & { file: string }): Promise<ReceiptOutbox> {
    const outbox = new ReceiptOutbox(options);
    let text: string;
    try {
      text = await readFile(options.file, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") outbox.log("receipt_outbox_unreadable", { file: options.file });
      return outbox;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      outbox.log("receipt_outbox_unreadable", { file: options.file });
      return outbox;
    }
    const now = outbox.now();
    for (const item of Array.isArray(parsed) ? parsed : []) {
      if (!isPersistedEntry(item) || item.deadline_ms < now) continue;
      outbox.entries.set(keyOf(item), entryOf(item.request_id, item.attempt_n, item.receipt, item.deadline_ms, null));
      outbox.nextExpiryMs = Math.min(outbox.nextExpiryMs, item.deadline_ms);
    }
    if (outbox.entries.size > 0) outbox.log("receipt_outbox_restored", { receipts: outbox.entries.size });
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

  /**
   * Keeps a receipt until its attempt is settled. `sentOn`: the session it was just sent on (in
   * `end`), or null when it could not be sent.
   */
  keep(ids: OutboxIds, receipt: string, terminalAtMs: number, sentOn: object | null): void {
    this.expire();
    const entry = entryOf(ids.request_id, ids.attempt_n, receipt, terminalAtMs + this.deadlineMs, sentOn);
    this.nextExpiryMs = Math.min(this.nextExpiryMs, entry.deadline_ms);
    this.entries.delete(keyOf(ids)); // re-insert: Map order is age order, used when trimming
    this.entries.set(keyOf(ids), entry);
    while (this.entries.size > this.maxEntries) {
      const oldest = this.entries.values().next().value as Entry;
      this.entries.delete(keyOf(oldest));
      this.log("receipt_dropped", { request_id: oldest.request_id, attempt_n: oldest.attempt_n, why: "outbox_full" });
    }
    this.changed();
  }

  /** The gateway's `settled` frame: a final label means the receipt is no longer needed. */
  settled(ids: OutboxIds, label: string): void {
    if (label === "pending") return;
    if (this.entries.delete(keyOf(ids))) this.changed();
  }

  /**
   * Sends every kept receipt not yet sent on `session` as a `receipt` frame. `send` returns false when
   * the frame could not be handed to the socket; such entries stay unsent for the next try.
   */
  flush(session: object, send: (frame: ProviderFrame) => boolean): number {
    this.expire();
    let sent = 0;
    for (const entry of this.entries.values()) {
      if (entry.sentOn === session) continue;
      const frame: ReceiptFrame = { type: "receipt", request_id: entry.request_id, attempt_n: entry.attempt_n, receipt: entry.receipt };
      if (!send(frame)) break;
      entry.sentOn = session;
      sent++;
      this.log("receipt_resent", { request_id: entry.request_id, attempt_n: entry.attempt_n });
    }
    return sent;
  }

  /** Resolves once every change so far is on disk (no-op without a file). */
  async saved(): Promise<void> {
    await this.saving;
  }

  private expire(): void {
    const now = this.now();
    if (this.nextExpiryMs >= now) return;
    this.nextExpiryMs = Number.POSITIVE_INFINITY;
    let removed = false;
    for (const [key, entry] of this.entries) {
      if (entry.deadline_ms >= now) {
        this.nextExpiryMs = Math.min(this.nextExpiryMs, entry.deadline_ms);
        continue;
      }
      this.entries.delete(key);
      removed = true;
      // The gateway has quarantined the attempt (no_receipt) by now; sending it would be `late`.
      this.log("receipt_expired", { request_id: entry.request_id, attempt_n: entry.attempt_n });
    }
    if (removed) this.changed();
  }

  private changed(): void {
    const file = this.options.file;
    if (file === undefined) return;
    // Coalesce: one write in flight, at most one more queued, each writing the latest state.
    if (this.dirty) return;
    this.dirty = true;
    this.saving = this.saving.then(async () => {
      this.dirty = false;
      await this.write(file).catch((error: unknown) =>
        this.log("receipt_outbox_write_failed", { file, error: (error as NodeJS.ErrnoException).code ?? "error" }),
      );
    });
  }

  private async write(file: string): Promise<void> {
    // The same text as JSON.stringify of the entries' array, from each entry's JSON made once.
    const parts: string[] = [];
    for (const entry of this.entries.values()) parts.push(entry.json);
    const text = `[${parts.join(",")}]`;
    const temp = `${file}.${process.pid}.tmp`;
    // Mode 0600 like the key file beside it: receipts name request ids and the account scope.
    const handle = await open(temp, "w", 0o600);
    try {
      await handle.writeFile(text, "utf8");
      await handle.sync();
    } finally {
      await handle.close();
    }
    try {
      await rename(temp, file);
    } catch (error) {
      await unlink(temp).catch(() => {});
      throw error;
    }
  }
}
