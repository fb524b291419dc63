// The provider's local earnings log: one JSON line per `settled` frame (docs/protocol.md), in
// `earnings.jsonl` next to the key file, mode 0600. It lets a machine's owner see what the gateway
// credited and why an attempt was quarantined (`gateway provider earnings`). Ids, labels, reasons and
// credits only: never a prompt, an output or a receipt.
import { appendFileSync, statSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { SettledFrame } from "../wire/frames.ts";
import type { LogFn } from "./events.ts";

export const EARNINGS_FILE = "earnings.jsonl";

/** The earnings log that belongs to a key file (same folder). */
export const earningsPathFor = (keyFile: string): string => join(dirname(keyFile), EARNINGS_FILE);

export interface EarningRecord {
  /** When the runtime received the `settled` frame (ISO 8601, UTC). */
  ts: string;
  provider_id: string;
  request_id: string;
  attempt_n: number;
  label: SettledFrame["label"];
  reason: string | null;
  provider_credits: number;
}

export interface EarningsLog {
  /** Appends one record; resolves when it is written (failures are logged, never thrown). */
  append(frame: SettledFrame): Promise<void>;
  /** Resolves once every append so far is written (before the process exits). */
  flushed(): Promise<void>;
}

/**
 * An append-only writer. The records of one event-loop turn are appended together when it ends, in
 * order, so lines never interleave; the file is created with mode 0600 (an existing file readable by
 * group or others is reported once, not changed). The file is opened per batch, so a log rotated
 * away is simply started again.
 */
export function createEarningsLog(options: { file: string; providerId: string; now?: () => number; log?: LogFn }): EarningsLog {
  const now = options.now ?? Date.now;
  const log = options.log ?? (() => {});
  /** Lines waiting for the end of the turn, and the promise of their write (null: none queued). */
  let queued: string[] = [];
  let nextWrite: Promise<void> | null = null;
  let last: Promise<void> = Promise.resolve();
  let modeChecked = false;
  // Written synchronously: a small append to the page cache costs less than the thread-pool round
  // trips of an asynchronous open, append and close (docs/benchmarks.md). Not synced: the gateway's
  // ledger is the record; this log is the owner's view of it.
  const writeQueued = () => {
    const text = queued.join("");
    queued = [];
    nextWrite = null;
    try {
      appendFileSync(options.file, text, { encoding: "utf8", mode: 0o600 });
      if (!modeChecked && process.platform !== "win32") {
        modeChecked = true;
        if ((statSync(options.file).mode & 0o077) !== 0) log("earnings_file_insecure_mode", { file: options.file });
      }
    } catch (error) {
      log("earnings_write_failed", { file: options.file, error: (error as NodeJS.ErrnoException).code ?? "error" });
    }
  };
  return {
    append(frame) {
      const record: EarningRecord = {
        ts: new Date(now()).toISOString(),
        provider_id: options.providerId,
        request_id: frame.request_id,
        attempt_n: frame.attempt_n,
        label: frame.label,
        reason: frame.reason,
        provider_credits: frame.provider_credits,
      };
      queued.push(`${JSON.stringify(record)}\n`);
      nextWrite ??= last = new Promise<void>((resolve) =>
        setImmediate(() => {
          writeQueued();
          resolve();
        }),
      );
      return nextWrite;
    },
    flushed: () => last,
  };
}

function isRecord(value: unknown): value is EarningRecord {
  const v = value as Partial<EarningRecord> | null;
  return (
    typeof v === "object" &&
    v !== null &&
    typeof v.request_id === "string" &&
    Number.isInteger(v.attempt_n) &&
    typeof v.label === "string" &&
    (v.reason === null || typeof v.reason === "string") &&
    Number.isSafeInteger(v.provider_credits)
  );
}

/** Reads the log; unparsable lines (e.g. a torn last line after a crash) are counted, not fatal. */
export async function readEarnings(file: string): Promise<{ records: EarningRecord[]; malformed: number; insecureMode: boolean }> {
  let text: string;
  let insecureMode = false;
  try {
    text = await readFile(file, "utf8");
    insecureMode = process.platform !== "win32" && ((await stat(file)).mode & 0o077) !== 0;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return { records: [], malformed: 0, insecureMode };
    throw error;
  }
  const records: EarningRecord[] = [];
  let malformed = 0;
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    try {
      const parsed: unknown = JSON.parse(line);
      if (isRecord(parsed)) records.push(parsed);
      else malformed++;
    } catch {
      malformed++;
    }
  }
  return { records, malformed, insecureMode };
}

export interface EarningsSummary {
  /** Attempts with at least one `settled` record. */
  attempts: number;
  /** Sum of provider credits over final outcomes. */
  provider_credits: number;
  by_label: Record<SettledFrame["label"], { attempts: number; provider_credits: number }>;
  /** Quarantined attempts by reason (docs/receipts.md's reason list). */
  quarantine_reasons: Record<string, number>;
  /** Zero-settled attempts by reason (normally nothing_delivered). */
  zero_settled_reasons: Record<string, number>;
}

/**
 * Totals per attempt: the first final record of an attempt counts (the gateway's first terminal
 * outcome is final, so a repeated `settled` frame must not count twice); a `pending` record counts
 * only while no final one exists.
 */
export function summarizeEarnings(records: readonly EarningRecord[]): EarningsSummary {
  const byAttempt = new Map<string, EarningRecord>();
  for (const r of records) {
    const key = `${r.provider_id ?? ""}\n${r.attempt_n}\n${r.request_id}`;
    const seen = byAttempt.get(key);
    if (seen === undefined || (seen.label === "pending" && r.label !== "pending")) byAttempt.set(key, r);
  }
  const summary: EarningsSummary = {
    attempts: byAttempt.size,
    provider_credits: 0,
    by_label: {
      verified: { attempts: 0, provider_credits: 0 },
      quarantined: { attempts: 0, provider_credits: 0 },
      zero_settled: { attempts: 0, provider_credits: 0 },
      pending: { attempts: 0, provider_credits: 0 },
    },
    quarantine_reasons: {},
    zero_settled_reasons: {},
  };
  for (const r of byAttempt.values()) {
    const bucket = summary.by_label[r.label];
    if (bucket === undefined) continue; // a label this build does not know; never guessed at
    bucket.attempts++;
    if (r.label !== "pending") {
      bucket.provider_credits += r.provider_credits;
      summary.provider_credits += r.provider_credits;
    }
    const reason = r.reason ?? "unknown";
    if (r.label === "quarantined") summary.quarantine_reasons[reason] = (summary.quarantine_reasons[reason] ?? 0) + 1;
    if (r.label === "zero_settled") summary.zero_settled_reasons[reason] = (summary.zero_settled_reasons[reason] ?? 0) + 1;
  }
  return summary;
}

/** Human-readable lines of a summary (the `earnings` command without --json). */
export function formatEarnings(summary: EarningsSummary, file: string): string[] {
  const lines = [`earnings log: ${file}`, `attempts: ${summary.attempts}   provider credits: ${summary.provider_credits}`];
  for (const [label, b] of Object.entries(summary.by_label)) {
    lines.push(`  ${label.padEnd(13)} ${String(b.attempts).padStart(8)} attempts  ${String(b.provider_credits).padStart(12)} credits`);
  }
  const reasons = Object.entries(summary.quarantine_reasons).sort((a, b) => b[1] - a[1]);
  if (reasons.length > 0) {
    lines.push("quarantine reasons:");
    for (const [reason, n] of reasons) lines.push(`  ${reason.padEnd(26)} ${n}`);
  }
  return lines;
}
