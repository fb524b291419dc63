// After a restart: attempts still pending resume their deadline (a late receipt can still settle
// them); attempts the gateway was still relaying when it stopped have no delivered record and are
// never charged.
import { DeliveredPrefixBuilder, type RouteSnapshot } from "../../receipts/index.ts";
import type { SettlementRow } from "../../store/index.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import type { TerminalState } from "../../wire/frames.ts";
import type { OpenAttempt } from "./attempt.ts";

/** An attempt record, less its actor, resumed from a pending settlement row. */
export type ResumedAttempt = Omit<OpenAttempt, "actor">;

/** Settles the interrupted pending attempts and hands each other one to `resume`, with its deadline. */
export async function recoverPending(
  store: Store,
  now: () => number,
  resume: (att: ResumedAttempt) => void,
): Promise<{ resumed: number; interrupted: number }> {
  let resumed = 0;
  let interrupted = 0;
  // Every other writer is marked reaped first (no other node is alive; docs/scale-out.md, "Fencing"): a
  // previous process's opening or reservation in flight is committed and read below, a later one refused.
  await store.writersReapedExcept?.([], now());
  // Every pending attempt is this process's from now on (a stalled process that wakes cannot write one).
  await store.claimPending?.();
  const pending = await store.listSettlements({ label: "pending" });
  for (const row of pending) {
    const stored = await store.getRouteSnapshot(row.request_id, row.attempt_n);
    const snapshot = stored ? (JSON.parse(stored.snapshot_json) as RouteSnapshot) : null;
    if (!row.delivered || !snapshot || !stored) {
      await store.settleAttempt({ request_id: row.request_id, attempt_n: row.attempt_n, label: "quarantined", reason: "interrupted", billed: null }, now());
      interrupted++;
      continue;
    }
    resume(resumedAttempt(row, snapshot, stored.digest, now()));
    resumed++;
  }
  // No request outlives the process: each of these will start no more attempts, so its reservation
  // resolves with its last settlement (now, for interrupted ones) instead of staying held forever.
  // The same holds for requests cut before or between attempts, which have no pending attempt at all.
  const cut = new Set([...pending.map((row) => row.request_id), ...(await store.unendedHeldReservations())]);
  for (const requestId of cut) await store.markRequestEnded(requestId, now());
  return { resumed, interrupted };
}

/**
 * Takes over one attempt another node owned and can no longer settle (it died): resumed from the
 * store as after a restart — waiting for its receipt when its delivered record was written, else
 * quarantined as interrupted (nothing charged). False when it is not pending (any more).
 */
export async function recoverOne(
  store: Store,
  now: () => number,
  requestId: string,
  attemptN: number,
  resume: (att: ResumedAttempt) => void,
): Promise<boolean> {
  // Claimed before it is read (docs/scale-out.md, "Fencing"): a write the dead node makes after this
  // is refused, and one it made before is in the row read here.
  await store.claimAttempt?.(requestId, attemptN);
  const row = await store.getSettlement(requestId, attemptN);
  if (!row || row.label !== "pending") return false;
  const stored = await store.getRouteSnapshot(requestId, attemptN);
  if (!row.delivered || !stored) {
    await store.settleAttempt({ request_id: requestId, attempt_n: attemptN, label: "quarantined", reason: "interrupted", billed: null }, now());
    return false;
  }
  resume(resumedAttempt(row, JSON.parse(stored.snapshot_json) as RouteSnapshot, stored.digest, now()));
  return true;
}

function resumedAttempt(row: SettlementRow, snapshot: RouteSnapshot, digest: string, nowMs: number): ResumedAttempt {
  const delivered = row.delivered!;
  return {
    requestId: row.request_id,
    attemptN: row.attempt_n,
    providerId: row.provider_id,
    providerPublicKey: new Uint8Array(Buffer.from(snapshot.provider_public_key, "base64")),
    snapshot,
    digest,
    builder: new DeliveredPrefixBuilder(0),
    acceptedHash: row.accepted_model_hash,
    cancelReason: null,
    end:
      delivered.reported_input_tokens === null
        ? null
        : {
            type: "end",
            request_id: row.request_id,
            attempt_n: row.attempt_n,
            terminal_state: delivered.terminal_state as TerminalState,
            finish_reason: delivered.finish_reason,
            usage: { input_tokens: delivered.reported_input_tokens, output_tokens: delivered.tokens },
          },
    delivered: {
      output_hash: delivered.output_hash,
      start_byte: delivered.start_byte,
      end_byte: delivered.end_byte,
      tokens: delivered.tokens,
      terminal_state: delivered.terminal_state as TerminalState,
      tool_calls_delivered: delivered.tool_calls_delivered,
      // Kept since the delivered record stores it: the output-token bound holds after a restart too.
      ...(delivered.tool_call_bytes === null ? {} : { tool_call_bytes: delivered.tool_call_bytes }),
    },
    deadlineAtMs: row.pending_deadline_at_ms ?? nowMs,
    unwrittenEnd: null,
    heldWrites: null,
    earlyReceipt: null,
    crossedEnd: false,
    judged: null,
  };
}
