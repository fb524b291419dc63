// What an open attempt delivered, as the gateway saw it: the provider's measurement, the chunks that
// reached the buyer, a cancel, the provider's `end`, and the delivered record fixed at release.
import { attemptTerminalState } from "../../ledger/charges.ts";
import { deliveredNothing, DeliveredPrefixBuilder, judgeAcceptedMeasurement } from "../../receipts/index.ts";
import type { DeliveredRecord } from "../../store/index.ts";
import type { ChunkFrame, EndFrame } from "../../wire/frames.ts";
import type { OutputGate } from "../outputSent.ts";
import { attemptKey } from "../registry.ts";
import type { OpenAttempts } from "./attempt.ts";
import { judgeReceipt, receiptArrived, type JudgingDeps } from "./judging.ts";
import { writeDeliveredRecord } from "./outcome.ts";

export interface DeliveryDeps extends JudgingDeps {
  pendingDeadlineMs: number;
}

/**
 * `accepted`: keeps the measurement, which the attempt's delivered record (or its outcome) persists
 * with it — one write less a request; one that comes after the release is written alone. Nothing
 * reads it from the store before then: a restart resumes only attempts with a delivered record, and
 * the audit re-verifies settled ones (docs/decisions.md, "The accepted measurement"). False when it
 * contradicts the catalog (the attempt must end).
 */
export function accepted(deps: DeliveryDeps, requestId: string, attemptN: number, modelHash: string): boolean {
  const att = deps.open.get(attemptKey(requestId, attemptN));
  if (!att || att.acceptedHash !== null) return true;
  att.acceptedHash = modelHash;
  if (att.delivered !== null) {
    void deps.writes.run("accepted_measurement", { request_id: requestId, attempt_n: attemptN }, () =>
      deps.store.recordAcceptedMeasurement(requestId, attemptN, modelHash),
    );
  }
  const refusal = judgeAcceptedMeasurement(att.snapshot, modelHash);
  if (refusal === null) return true;
  deps.log.warn("measurement_mismatch", { request_id: requestId, attempt_n: attemptN, provider_id: att.providerId, reason: refusal });
  // The reason judgeAcceptedMeasurement names (docs/receipts.md): the measured hash is not the catalog's.
  att.actor.send({ type: "attempt.rejected", reason: refusal });
  return false;
}

/**
 * The attempt's sink for relayed chunks: each chunk that reached the buyer (streaming) or the buyer's
 * pending body (non-streaming) is added to its delivered prefix. Bound once per attempt, so the
 * per-chunk path builds and looks up no key; reads the builder at each call, since `discarded`
 * replaces it.
 */
export function relayerFor(open: OpenAttempts, requestId: string, attemptN: number): (frame: ChunkFrame) => void {
  const att = open.get(attemptKey(requestId, attemptN));
  return att ? (frame) => att.builder.add(frame) : () => {};
}

/** The attempt's buffered output was dropped (failover, or an abandoning cancel): nothing of it was delivered. */
export function discarded(open: OpenAttempts, requestId: string, attemptN: number): void {
  const att = open.get(attemptKey(requestId, attemptN));
  if (att && !att.delivered) att.builder = new DeliveredPrefixBuilder(0);
}

export function cancelSent(open: OpenAttempts, requestId: string, attemptN: number, reason: "buyer_cancel" | "gateway_timeout"): void {
  const att = open.get(attemptKey(requestId, attemptN));
  if (att && att.cancelReason === null) att.cancelReason = reason;
}

/**
 * The provider's `end` for an attempt of this provider (live or already released). An `end` after the
 * gateway released the attempt, naming another terminal state than the one its record expects (the
 * cancel's reason), crossed the gateway's cancel (docs/receipts.md, "A cancel that crosses `end`").
 */
export function endReceived(deps: JudgingDeps, providerId: string, frame: EndFrame): boolean {
  const att = deps.open.get(attemptKey(frame.request_id, frame.attempt_n));
  if (!att || att.providerId !== providerId || att.end) return false;
  att.end = frame;
  if (att.delivered !== null && frame.terminal_state !== att.delivered.terminal_state) {
    att.crossedEnd = true;
    deps.log.info("cancel_crossed_end", { request_id: att.requestId, attempt_n: att.attemptN, provider_id: providerId, end_state: frame.terminal_state });
  }
  if (frame.receipt !== undefined) receiptArrived(deps, providerId, frame.request_id, frame.attempt_n, frame.receipt);
  return true;
}

/**
 * The gateway is done with the attempt: nothing more reaches the buyer from it. Fixes the delivered
 * record, persists it with the pending deadline, and lets the actor move on. With `outputLeft` (a
 * stream's: its last deltas may still be inside the process), the record, and an outcome that would
 * carry it, are written only once that gate opens, the bytes having left: a record never covers a delta
 * a kill -9 kept from the buyer (docs/receipts.md, "Crashes").
 */
export function released(deps: DeliveryDeps, requestId: string, attemptN: number, outputLeft: OutputGate | null = null): void {
  const att = deps.open.get(attemptKey(requestId, attemptN));
  if (!att || att.delivered) return;
  const terminal = attemptTerminalState(att.end?.terminal_state ?? null, att.cancelReason);
  const finishReason = att.end && att.end.terminal_state === terminal ? att.end.finish_reason : null;
  const prefix = att.builder.finish(terminal, finishReason);
  att.delivered = prefix;
  const now = deps.now();
  att.deadlineAtMs = now + deps.pendingDeadlineMs;
  const record: DeliveredRecord = {
    output_hash: prefix.output_hash,
    start_byte: prefix.start_byte,
    end_byte: prefix.end_byte,
    tokens: prefix.tokens,
    terminal_state: prefix.terminal_state,
    finish_reason: prefix.finish_reason,
    tool_calls_delivered: prefix.tool_calls_delivered,
    tool_call_bytes: prefix.tool_call_bytes,
    reported_input_tokens: att.end ? att.end.usage.input_tokens : null,
  };
  // Written with the outcome when the actor settles right away (one UPDATE instead of two), else below.
  att.unwrittenEnd = { delivered: record, ended_at_ms: now, pending_deadline_at_ms: att.deadlineAtMs };
  let verdictDue = false;
  if (att.earlyReceipt !== null) {
    const envelope = att.earlyReceipt;
    att.earlyReceipt = null;
    verdictDue = judgeReceipt(deps, att, envelope);
  }
  // Held before the actor hears of the end: it may settle at once, and its outcome must wait too.
  const held: (() => void)[] | null = outputLeft === null ? null : [];
  att.heldWrites = held;
  att.actor.send({ type: "attempt.ended", deliveredNothing: deliveredNothing(prefix), verdictDue });
  if (outputLeft === null || held === null) return writeDeliveredRecord(deps, att);
  outputLeft.whenOpen(() => {
    att.heldWrites = null;
    for (const write of held) write();
    writeDeliveredRecord(deps, att);
  });
}
