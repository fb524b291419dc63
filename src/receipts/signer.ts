// The provider runtime's side: building and signing a v0.4 receipt for one attempt (docs/receipts.md).
import type { KeyObject } from "node:crypto";
import type { JobFrame } from "../wire/frames.ts";
import { rawPublicKey } from "../wire/handshake.ts";
import { encodeEnvelope } from "./envelope.ts";
import { receiptKeyId, type DeliveredPrefix } from "./hashes.ts";
import { RECEIPT_VERSION, SIGNATURE_KEY_ALG, type ReceiptBody } from "./schema.ts";

export interface ReceiptFacts {
  job: Pick<JobFrame, "request_id" | "attempt_n" | "model_id" | "route">;
  /** The measurement sent in `accepted` (the request-start model hash). */
  model_hash: string;
  /**
   * The prefix this receipt binds: every chunk sent for a normal end, or after `cancel` the chunks
   * within its `delivered_output_bytes` (chunksWithinBytes), built with deliveredPrefixOf.
   */
  prefix: DeliveredPrefix;
  /** Prompt tokens the engine reported. */
  observed_input_tokens: number;
  /**
   * Prompt tokens billed; default = observed. Billable output is always the prefix's chunk tokens:
   * a provider is paid for what was delivered, nothing more.
   */
  billable_input_tokens?: number;
  terminal_state_ts_unix_ms: number;
  issued_at_unix_ms: number;
}

export interface ReceiptSigner {
  readonly providerId: string;
  readonly keyId: string;
  /** T for these facts (unsigned; exposed for tests and the earnings log). */
  body(facts: ReceiptFacts): ReceiptBody;
  /** The signed envelope for these facts. */
  sign(facts: ReceiptFacts): string;
  /** The signed envelope of a body made by `body` (when the caller keeps the body too). */
  signBody(body: ReceiptBody): string;
}

/** A signer bound to one provider id and its receipt key (the key sent in `hello`). */
export function createReceiptSigner(privateKey: KeyObject, providerId: string): ReceiptSigner {
  const keyId = receiptKeyId(rawPublicKey(privateKey));
  const body = (facts: ReceiptFacts): ReceiptBody => {
    const { job, prefix } = facts;
    const observedOutput = prefix.tokens;
    // Members in canonical (JCS) order, so the signature's canonicalisation takes its fast path.
    return {
      account_scope: job.route.account_scope,
      attempt_n: job.attempt_n,
      catalog_body_digest: job.route.catalog_body_digest,
      catalog_id: job.route.catalog_id,
      expected_catalog_model_hash: job.route.expected_catalog_model_hash,
      issued_at_unix_ms: facts.issued_at_unix_ms,
      model_hash: facts.model_hash,
      model_id: job.model_id,
      output_hash: prefix.output_hash,
      output_prefix_end_byte: prefix.end_byte,
      output_prefix_start_byte: prefix.start_byte,
      prompt_hash: job.route.prompt_hash,
      provider_id: providerId,
      provider_receipt_key_id: keyId,
      receipt_version: RECEIPT_VERSION,
      request_id: job.request_id,
      route_snapshot_digest: job.route.route_snapshot_digest,
      route_snapshot_mode: job.route.route_snapshot_mode,
      route_snapshot_policy_version: job.route.route_snapshot_policy_version,
      signature_key_alg: SIGNATURE_KEY_ALG,
      terminal_state: prefix.terminal_state,
      terminal_state_ts_unix_ms: facts.terminal_state_ts_unix_ms,
      usage: {
        billable_input_tokens: facts.billable_input_tokens ?? facts.observed_input_tokens,
        billable_output_tokens: observedOutput,
        delivered_output_bytes: prefix.end_byte - prefix.start_byte,
        observed_input_tokens: facts.observed_input_tokens,
        observed_output_tokens: observedOutput,
      },
    };
  };
  return {
    providerId,
    keyId,
    body,
    sign: (facts) => encodeEnvelope(body(facts), privateKey),
    signBody: (made) => encodeEnvelope(made, privateKey),
  };
}
