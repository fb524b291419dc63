// Receipts reaching an open attempt: kept until the attempt is released, judged by the pure verifier
// (src/receipts/verify.ts) on the judging thread, and the verdict handed to the attempt's actor.
import { parseEnvelope } from "../../receipts/index.ts";
import type { JudgedReceipt, ReceiptJudge } from "../../receipts/judge.ts";
import type { Log } from "../../log.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import type { SettlementRow } from "../../store/index.ts";
import type { FinalLabel } from "../../ledger/charges.ts";
import type { DurableWrites } from "./durableWrites.ts";
import { attemptKey } from "../registry.ts";
import { sendSettled } from "./outcome.ts";
import type { JudgedEnvelope, OpenAttempt, OpenAttempts } from "./attempt.ts";

export interface JudgingDeps {
  store: Store;
  writes: DurableWrites;
  now: () => number;
  log: Log;
  judge: ReceiptJudge;
  open: OpenAttempts;
  /** Sends a frame to the provider id's live session, when it has one. */
  sendToProvider: (providerId: string, frame: Uint8Array) => void;
}

/** What became of a receipt: stored (and judged), or only counted and why. */
export type ReceiptArrival = "stored" | "duplicate" | "after_final" | "unknown_attempt";

/**
 * A receipt (in `end` or a late `receipt` frame) for an attempt of this provider id (from any of its
 * sessions). Only the first receipt of an open attempt is stored: kept until release when the attempt
 * is still live, judged otherwise. Any other is counted by the caller (the disposition says why) and
 * never stored, so a provider cannot grow the database with them. One for an attempt that already has
 * its final outcome is answered with that outcome's `settled` frame, so the provider's runtime drops
 * it instead of re-sending it on every reconnect.
 */
export function receiptArrived(
  deps: JudgingDeps,
  providerId: string,
  requestId: string,
  attemptN: number,
  envelope: string,
): ReceiptArrival | Promise<ClosedAttemptArrival> {
  const att = deps.open.get(attemptKey(requestId, attemptN));
  if (!att || att.providerId !== providerId) {
    const known = deps.store.getSettlement(requestId, attemptN);
    // Answered at once by the embedded store: in this very turn, as before.
    if (Bun.peek.status(known) === "fulfilled") return answerClosedAttempt(deps, providerId, Bun.peek(known) as SettlementRow | null);
    return known.then(
      (row) => answerClosedAttempt(deps, providerId, row),
      (error): "unknown_attempt" => {
        deps.log.warn("receipt_lookup_failed", { request_id: requestId, attempt_n: attemptN, error: String(error) });
        return "unknown_attempt";
      },
    );
  }
  // The first receipt decides; the attempt's `settled` frame answers the duplicates too once it settles.
  if (att.judged || att.earlyReceipt !== null) return "duplicate";
  if (!att.delivered) {
    att.earlyReceipt = envelope;
    return "stored";
  }
  if (att.crossedEnd && bindsOtherEnd(envelope, att.delivered.terminal_state)) {
    // The receipt of an `end` that crossed our cancel binds output the buyer never got: the provider
    // answers the cancel with one bound to the delivered prefix, which is awaited until the deadline.
    deps.log.info("receipt_superseded", { request_id: requestId, attempt_n: attemptN, provider_id: providerId });
    return "duplicate"; // counted, never stored
  }
  if (judgeReceipt(deps, att, envelope)) att.actor.send({ type: "receipt.arrived" });
  return "stored";
}

/** What became of a receipt for an attempt that is not open here: answered, or unknown. */
export type ClosedAttemptArrival = "after_final" | "unknown_attempt";

/** A receipt for an attempt with a final outcome is answered with that outcome's `settled` frame. */
function answerClosedAttempt(deps: JudgingDeps, providerId: string, known: SettlementRow | null): ClosedAttemptArrival {
  if (!known || known.provider_id !== providerId || known.label === "pending") return "unknown_attempt";
  // Announced only once durable, like the first `settled` frame (the row may be this turn's).
  deps.store.afterLazyCommit((committed) => {
    if (committed) sendSettled(deps, providerId, known.request_id, known.attempt_n, known.label as FinalLabel, known.reason, known.provider_credits);
  }, known.request_id);
  return "after_final";
}

/** Whether a readable receipt names a terminal state other than `expected` (an unreadable one is judged). */
function bindsOtherEnd(envelope: string, expected: string): boolean {
  const parsed = parseEnvelope(envelope);
  return parsed.ok && parsed.envelope.body.terminal_state !== expected;
}

/**
 * Judges a receipt on the judging thread (or where `deps.judge` says). Everything a duplicate receipt
 * reads (`judged`) is fixed now; the verdict and the billable usage come with the judgement. Returns
 * whether that is later: the caller then tells the actor (`attempt.ended` or `receipt.arrived`),
 * which holds the pending deadline for it.
 */
export function judgeReceipt(deps: JudgingDeps, att: OpenAttempt, envelope: string): boolean {
  const arrival = deps.now();
  const written = deps.store.recordReceiptArrival(
    { request_id: att.requestId, attempt_n: att.attemptN, provider_id: att.providerId, envelope, disposition: "judged" },
    arrival,
  );
  // Already answered (the embedded store): the outcome can be written in this very turn, as before.
  const arrivalId =
    Bun.peek.status(written) === "fulfilled"
      ? (Bun.peek(written) as number)
      : written.catch((error): null => {
          deps.log.warn("receipt_arrival_not_logged", { request_id: att.requestId, attempt_n: att.attemptN, error: String(error) });
          return null;
        });
  const record: JudgedEnvelope = { envelope, arrivalId, receivedAtMs: arrival, billable: null };
  att.judged = record;
  return deps.judge.judge(
    {
      envelope,
      sessionPublicKey: att.providerPublicKey,
      snapshot: att.snapshot,
      snapshotDigest: att.digest,
      acceptedModelHash: att.acceptedHash,
      delivered: att.delivered!,
      promptTokenBound: att.snapshot.prompt_token_bound,
      requestStartMs: att.snapshot.request_started_at_unix_ms,
      arrivalMs: arrival,
      expected: {
        request_id: att.requestId,
        attempt_n: att.attemptN,
        provider_id: att.providerId,
        account_scope: att.snapshot.account_scope,
      },
      pendingDeadlineMs: att.deadlineAtMs ?? undefined,
    },
    (result) => {
      record.billable = result.billable;
      verdictReached(deps, att, result.verdict);
    },
  );
}

/**
 * A receipt's verdict reaches the attempt's actor — unless the attempt is no longer open: it settled
 * meanwhile (zero_settled), or the settlements stopped, and then nothing is sent or written.
 */
function verdictReached(deps: JudgingDeps, att: OpenAttempt, verdict: JudgedReceipt["verdict"]): void {
  if (verdict.label === "quarantined") {
    deps.log.warn("receipt_quarantined", { request_id: att.requestId, attempt_n: att.attemptN, provider_id: att.providerId, reason: verdict.reason });
  }
  if (deps.open.get(attemptKey(att.requestId, att.attemptN)) === att) att.actor.send({ type: "receipt.judged", verdict });
}
