// An attempt's final label written to the ledger — the charge decided by src/ledger/charges.ts — in one
// transaction, and announced to its provider (`settled`) once that transaction is durable.
import { billedUsage, type FinalLabel, type SettlementMode } from "../../ledger/charges.ts";
import { observedBilling } from "../../ledger/money.ts";
import type { Log } from "../../log.ts";
import type { SettleInput, SettleResult, SettlementRow } from "../../store/index.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import type { DurableWrites } from "./durableWrites.ts";
import { encodeFrame } from "../../wire/codec.ts";
import type { OpenAttempt } from "./attempt.ts";
import { attemptKey } from "../registry.ts";

export interface OutcomeDeps {
  store: Store;
  writes: DurableWrites;
  now: () => number;
  mode: SettlementMode;
  log: Log;
  /** Sends a frame to the provider id's live session, when it has one. */
  sendToProvider: (providerId: string, frame: Uint8Array) => void;
  /** Called once per attempt with its final label (metrics). */
  onSettled?: (label: FinalLabel, providerId: string) => void;
  /** A cluster node's record that it owns the attempt and its request (src/cluster/node.ts, `own`), given up here. */
  ownership?: { settled(key: string): void; requestEnded(requestId: string): void };
}

/** What the attempt is charged for: the usage the gateway observed, or the verified receipt's. */
function chargedUsage(mode: SettlementMode, label: FinalLabel, att: OpenAttempt) {
  return billedUsage(label, mode, {
    observed: () =>
      observedBilling({
        delivered_tokens: att.delivered?.tokens ?? 0,
        reported_input_tokens: att.end?.usage.input_tokens ?? att.judged?.billable?.prompt_tokens ?? 0,
        prompt_token_bound: att.snapshot.prompt_token_bound,
      }),
    verified: att.judged?.billable ?? null,
  });
}

/** Persists the delivered record if the settlement did not (the attempt now waits for its receipt). */
export function writeDeliveredRecord(deps: Pick<OutcomeDeps, "store" | "writes">, att: OpenAttempt): void {
  const end = att.unwrittenEnd;
  if (end === null) return;
  // Kept as unwritten until the write lands: an outcome written meanwhile carries it too (the store
  // keeps the first delivered record of an attempt, whichever write brings it).
  void deps.writes
    .run("attempt_end", { request_id: att.requestId, attempt_n: att.attemptN }, () =>
      deps.store.recordAttemptEnd(att.requestId, att.attemptN, end.delivered, end.pending_deadline_at_ms, end.ended_at_ms, att.acceptedHash),
    )
    .then((written) => {
      if (written !== null && att.unwrittenEnd === end) att.unwrittenEnd = null;
    });
}

/**
 * The settlement actor reached a final state: one ledger transaction, then the `settled` frame. With
 * `endRequest`, the request has ended and this was its last open attempt: the transaction ends it too,
 * and `endRequest` writes the end on its own when the outcome is not written.
 */
export function writeOutcome(deps: OutcomeDeps, att: OpenAttempt, label: FinalLabel, reason: string | null, endRequest: (() => void) | null = null): void {
  // The outcome charges for the delivered record: it waits, as the record does, for the bytes to leave.
  if (att.heldWrites !== null) {
    att.heldWrites.push(() => writeOutcome(deps, att, label, reason, endRequest));
    return;
  }
  const settledAt = deps.now();
  const billed = chargedUsage(deps.mode, label, att);
  const write = (arrivalId: number | null) => {
    const judged = att.judged;
    const receipt = judged
      ? { envelope: judged.envelope, received_at_ms: judged.receivedAtMs, ...(arrivalId === null ? {} : { arrival_id: arrivalId }) }
      : undefined;
    const input: SettleInput = {
      request_id: att.requestId,
      attempt_n: att.attemptN,
      label,
      reason,
      receipt,
      billed,
      ended: att.unwrittenEnd ?? undefined,
      accepted_model_hash: att.acceptedHash,
    };
    if (endRequest !== null) input.end_request = true;
    // The embedded store writes it before this returns (the same turn's group commit, as before).
    void deps.writes
      .run("settlement", { request_id: att.requestId, attempt_n: att.attemptN }, () => deps.store.settleAttempt(input, settledAt))
      .then((result) => {
        if (endRequest !== null && result?.ok !== true) endRequest();
        if (result !== null) outcomeWritten(deps, att, label, reason, result, endRequest !== null);
      });
  };
  // The receipt's arrival row is referred to once it is written.
  const arrivalId = att.judged?.arrivalId ?? null;
  if (arrivalId instanceof Promise) void arrivalId.then(write);
  else write(arrivalId);
}

/** The settlement transaction's answer: the outcome is announced once it is durable. */
function outcomeWritten(deps: OutcomeDeps, att: OpenAttempt, label: FinalLabel, reason: string | null, result: SettleResult, endsRequest: boolean): void {
  if (!result.ok) {
    // Final already (another node settled it): nothing is left to own.
    if (result.code === "already_settled") deps.ownership?.settled(attemptKey(att.requestId, att.attemptN));
    deps.log.error("settlement_not_written", { request_id: att.requestId, attempt_n: att.attemptN, code: result.code });
    // Nothing was written: the delivered record still is, as it would have been without the outcome.
    writeDeliveredRecord(deps, att);
    return;
  }
  att.unwrittenEnd = null;
  // The outcome is announced only once it is durable; no buyer waits for it, so it rides the next
  // group commit instead of asking for one (src/store/groupCommit.ts).
  deps.store.afterLazyCommit((committed) => {
    if (!committed) {
      deps.log.error("settlement_not_written", { request_id: att.requestId, attempt_n: att.attemptN, code: "commit_failed" });
      return;
    }
    // Owned until the outcome is durable: a node killed before leaves the attempt pending in the store,
    // and only the owned set tells a survivor to resolve it (docs/scale-out.md, "Leases and failure").
    deps.ownership?.settled(attemptKey(att.requestId, att.attemptN));
    if (endsRequest) deps.ownership?.requestEnded(att.requestId);
    announceSettled(deps, att, label, reason, result.settlement);
  }, att.requestId);
}

function announceSettled(deps: OutcomeDeps, att: OpenAttempt, label: FinalLabel, reason: string | null, settlement: SettlementRow): void {
  deps.onSettled?.(label, att.providerId);
  deps.log.info("attempt_settled", {
    request_id: att.requestId,
    attempt_n: att.attemptN,
    provider_id: att.providerId,
    label,
    reason,
    debit_credits: settlement.debit_credits,
    provider_credits: settlement.provider_credits,
  });
  sendSettled(deps, att.providerId, att.requestId, att.attemptN, label, reason, settlement.provider_credits);
}

/** The `settled` frame of an attempt's final outcome (also the answer to a receipt that came after it). */
export function sendSettled(
  deps: Pick<OutcomeDeps, "sendToProvider">,
  providerId: string,
  requestId: string,
  attemptN: number,
  label: FinalLabel,
  reason: string | null,
  providerCredits: number,
): void {
  deps.sendToProvider(providerId, encodeFrame({ type: "settled", request_id: requestId, attempt_n: attemptN, label, reason, provider_credits: providerCredits }));
}
