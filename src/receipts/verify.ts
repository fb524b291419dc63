// The settlement verdict for one receipt (docs/receipts.md): pure — every input is a value the gateway
// persisted before the receipt arrived, so a receipt judged after a restart gets the same verdict.
import { parseEnvelope, verifySignature, type ParsedEnvelope } from "./envelope.ts";
import { outputTokenBound, receiptKeyId, type DeliveredPrefix } from "./hashes.ts";
import type { ReceiptBody } from "./schema.ts";
import type { RouteSnapshot } from "./snapshot.ts";

/**
 * Every reason an attempt settles other than `verified`, one list for the whole system (receipts
 * list, `settled` frames, the buyer's receipt view, docs/receipts.md). Short snake_case words.
 */
export const SETTLEMENT_REASONS = [
  // envelope and field set
  "malformed", // not base64(JCS).base64(sig) with a 64-byte signature
  "not_canonical", // payload not UTF-8 JSON in RFC 8785 canonical form
  "field_set", // a field of T (or T.usage) missing or extra
  "field_invalid", // a field of T with the wrong type or value (e.g. receipt_version ≠ "4")
  // who signed
  "wrong_key", // provider_receipt_key_id is not the key the session authenticated with
  "bad_signature", // signature does not verify under the session's key
  // binding to this attempt
  "replayed", // request_id, attempt_n, provider_id or account_scope of another attempt or account
  "echo_mismatch", // a route.* field or model_id differs from the persisted snapshot
  // the model
  "measurement_mismatch", // model_hash ≠ the `accepted` measurement (or no measurement was taken)
  "model_hash_not_in_catalog", // model_hash ≠ the snapshot's catalog hash, or the catalog did not know the model
  // the delivered output
  "terminal_state_mismatch", // terminal_state ≠ how the gateway saw the attempt end
  "byte_range", // output_prefix_*_byte / delivered_output_bytes ≠ what the gateway delivered
  "output_mismatch", // output_hash ≠ the hash of what the gateway delivered
  "output_tokens_inflated", // output tokens above the delivered chunk tokens, or billable above the bytes' bound
  "output_tokens_mismatch", // observed output tokens below the delivered chunk tokens
  "input_tokens_inflated", // billable prompt tokens above the gateway's own bound for the prompt
  "billable_above_observed", // billable input or output above observed
  "billable_not_observed", // normal_done with billable ≠ observed
  // time
  "issued_at_out_of_window", // issued_at outside [request start − 60 s, arrival + 60 s]
  "late", // arrived after the pending deadline
  // outcomes without a verdict on a receipt
  "no_receipt", // no receipt by the pending deadline
  "nothing_delivered", // zero_settled: no byte and no tool call reached the buyer
  "hedge_lost", // zero_settled: a hedged attempt of the same request delivered first (docs/routing.md)
  "interrupted", // the gateway lost its own delivered record (stopped mid-attempt): never charged
] as const;
export type SettlementReason = (typeof SETTLEMENT_REASONS)[number];

/** Quarantine reasons a receipt verification can give (everything but the no-receipt outcomes). */
export type QuarantineReason = Exclude<SettlementReason, "no_receipt" | "nothing_delivered" | "interrupted">;

/** Clock tolerance of the issued_at window on both sides (docs/receipts.md). */
export const ISSUED_AT_TOLERANCE_MS = 60_000;

export interface VerifyReceiptInput {
  envelope: string;
  /** Raw 32-byte Ed25519 key the provider's session authenticated with (never one from the receipt). */
  sessionPublicKey: Uint8Array;
  /** The snapshot persisted before dispatch, and its persisted digest. */
  snapshot: RouteSnapshot;
  snapshotDigest: string;
  /** `accepted.model_hash`, persisted when it arrived; null when the attempt was never accepted. */
  acceptedModelHash: string | null;
  /**
   * What the gateway itself delivered for this attempt. The output-token bound needs its tool-call
   * bytes: known when the record says no tool call was delivered (0), or when `tool_call_bytes` is
   * given; otherwise (a record persisted without them) only the edge's per-chunk check applied.
   */
  delivered: Pick<DeliveredPrefix, "output_hash" | "start_byte" | "end_byte" | "tokens" | "terminal_state"> &
    Partial<Pick<DeliveredPrefix, "tool_calls_delivered" | "tool_call_bytes">>;
  /** The gateway's own prompt-token bound for this prompt. */
  promptTokenBound: number;
  requestStartMs: number;
  /** When the receipt reached the gateway. */
  arrivalMs: number;
  /** The attempt being settled, from the gateway's own records. */
  expected: { request_id: string; attempt_n: number; provider_id: string; account_scope: string };
  /** Absolute pending deadline; a receipt arriving after it is `late`. Omit when not applicable. */
  pendingDeadlineMs?: number;
}

/** A receipt's verdict: verified, or quarantined with the first rule it broke. */
export type ReceiptVerdict = { label: "verified" } | { label: "quarantined"; reason: QuarantineReason };

/** A verdict with the receipt body it was read from (null when the envelope could not be read). */
export type ReceiptJudgement =
  | (Extract<ReceiptVerdict, { label: "verified" }> & { receipt: ReceiptBody })
  | (Extract<ReceiptVerdict, { label: "quarantined" }> & { receipt: ReceiptBody | null });

/** The route fields a receipt echoes verbatim (docs/receipts.md), compared with the snapshot. */
const ECHOED = [
  "model_id",
  "catalog_id",
  "catalog_body_digest",
  "expected_catalog_model_hash",
  "route_snapshot_mode",
  "route_snapshot_policy_version",
  "prompt_hash",
] as const satisfies readonly (keyof ReceiptBody & keyof RouteSnapshot)[];

/**
 * A receipt judged on every rule but its signature. `signature` is null when a rule before the
 * signature's place already decided `verdict`; otherwise `verdict` (from the rules after it) holds
 * only when the signature verifies, and the receipt is `bad_signature` when it does not.
 */
export interface ReceiptCheck {
  verdict: ReceiptJudgement;
  signature: { envelope: ParsedEnvelope; publicKey: Uint8Array } | null;
}

/**
 * Applies every rule of docs/receipts.md to one receipt except the signature, whose verification is left to
 * the caller — `verifyReceipt` checks it synchronously, the gateway off its main thread — and folded
 * in by `verdictWithSignature`.
 * Rules are checked in a fixed order and the first failing one names the reason, so one receipt
 * always gets one reason. The order: can the envelope be read → whose key → bound to this attempt →
 * the model → the output → the usage → time.
 */
export function checkReceipt(input: VerifyReceiptInput): ReceiptCheck {
  const parsed = parseEnvelope(input.envelope);
  if (!parsed.ok) return { verdict: { label: "quarantined", reason: parsed.code, receipt: null }, signature: null };
  const r = parsed.envelope.body;
  const decided = (reason: QuarantineReason): ReceiptCheck => ({ verdict: { label: "quarantined", reason, receipt: r }, signature: null });

  if (input.pendingDeadlineMs !== undefined && input.arrivalMs > input.pendingDeadlineMs) return decided("late");
  // The key id is checked before the signature so "signed by another provider's key" reads as such.
  if (r.provider_receipt_key_id !== receiptKeyId(input.sessionPublicKey)) return decided("wrong_key");
  return { verdict: afterSignature(input, r), signature: { envelope: parsed.envelope, publicKey: input.sessionPublicKey } };
}

/** The verdict of a check once its signature, when one was left to verify, is known to be valid or not. */
export function verdictWithSignature(check: ReceiptCheck, signatureValid: boolean): ReceiptJudgement {
  if (check.signature === null || signatureValid) return check.verdict;
  return { label: "quarantined", reason: "bad_signature", receipt: check.signature.envelope.body };
}

/** Applies every rule of docs/receipts.md to one receipt, the signature verified synchronously. */
export function verifyReceipt(input: VerifyReceiptInput): ReceiptJudgement {
  const check = checkReceipt(input);
  if (check.signature === null) return check.verdict;
  return verdictWithSignature(check, verifySignature(check.signature.envelope, check.signature.publicKey));
}

/** The rules after the signature, in order: a well-signed receipt's verdict. */
function afterSignature(input: VerifyReceiptInput, r: ReceiptBody): ReceiptJudgement {
  const q = (reason: QuarantineReason): ReceiptJudgement => ({ label: "quarantined", reason, receipt: r });
  const { expected, snapshot } = input;
  if (
    r.request_id !== expected.request_id ||
    r.attempt_n !== expected.attempt_n ||
    r.provider_id !== expected.provider_id ||
    r.account_scope !== expected.account_scope
  ) {
    return q("replayed");
  }
  // The snapshot must describe the same attempt; a mismatch here is a gateway bug, never a charge.
  if (
    snapshot.request_id !== expected.request_id ||
    snapshot.attempt_n !== expected.attempt_n ||
    snapshot.provider_id !== expected.provider_id ||
    snapshot.account_scope !== expected.account_scope
  ) {
    return q("echo_mismatch");
  }
  if (r.route_snapshot_digest !== input.snapshotDigest) return q("echo_mismatch");
  for (const field of ECHOED) if (r[field] !== snapshot[field]) return q("echo_mismatch");

  if (input.acceptedModelHash === null || r.model_hash !== input.acceptedModelHash) return q("measurement_mismatch");
  // An empty expected hash (observe mode, uncatalogued model) can never verify.
  if (snapshot.expected_catalog_model_hash === "" || r.model_hash !== snapshot.expected_catalog_model_hash) {
    return q("model_hash_not_in_catalog");
  }

  const d = input.delivered;
  if (r.terminal_state !== d.terminal_state) return q("terminal_state_mismatch");
  if (
    r.output_prefix_start_byte !== d.start_byte ||
    r.output_prefix_end_byte !== d.end_byte ||
    r.usage.delivered_output_bytes !== d.end_byte - d.start_byte
  ) {
    return q("byte_range");
  }
  if (r.output_hash !== d.output_hash) return q("output_mismatch");

  const u = r.usage;
  if (u.observed_output_tokens > d.tokens || u.billable_output_tokens > d.tokens) return q("output_tokens_inflated");
  if (u.billable_output_tokens > deliveredOutputBound(d)) return q("output_tokens_inflated");
  if (u.observed_output_tokens !== d.tokens) return q("output_tokens_mismatch");
  if (u.billable_input_tokens > input.promptTokenBound) return q("input_tokens_inflated");
  if (u.billable_input_tokens > u.observed_input_tokens || u.billable_output_tokens > u.observed_output_tokens) {
    return q("billable_above_observed");
  }
  if (
    r.terminal_state === "normal_done" &&
    (u.billable_input_tokens !== u.observed_input_tokens || u.billable_output_tokens !== u.observed_output_tokens)
  ) {
    return q("billable_not_observed");
  }

  if (
    r.issued_at_unix_ms < input.requestStartMs - ISSUED_AT_TOLERANCE_MS ||
    r.issued_at_unix_ms > input.arrivalMs + ISSUED_AT_TOLERANCE_MS
  ) {
    return q("issued_at_out_of_window");
  }
  return { label: "verified", receipt: r };
}

/** The output-token bound of a delivered record (outputTokenBound), Infinity when its tool-call bytes are unknown. */
export function deliveredOutputBound(d: VerifyReceiptInput["delivered"]): number {
  const toolCallBytes = d.tool_call_bytes ?? (d.tool_calls_delivered === false ? 0 : null);
  return toolCallBytes === null ? Infinity : outputTokenBound(d.end_byte - d.start_byte, toolCallBytes);
}

/**
 * Judges an `accepted` measurement against the snapshot at the moment it arrives (docs/protocol.md): null
 * when the attempt may relay output; otherwise the attempt ends before any byte, fails over, and is
 * quarantined with this reason. In observe mode an uncatalogued model (expected hash "") may run.
 */
export function judgeAcceptedMeasurement(
  snapshot: Pick<RouteSnapshot, "expected_catalog_model_hash">,
  acceptedModelHash: string,
): "model_hash_not_in_catalog" | null {
  if (snapshot.expected_catalog_model_hash === "") return null;
  return acceptedModelHash === snapshot.expected_catalog_model_hash ? null : "model_hash_not_in_catalog";
}
