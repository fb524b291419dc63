// The provider runtime's receipts (docs/receipts.md): which chunks a receipt binds and with what usage. The
// hashing and signing are src/receipts' (shared with the gateway's verifier and checked against
// independent vectors in test/receipts); this file only decides the facts fed to them.
import {
  chunksWithinBytes,
  deliveredNothing,
  deliveredPrefixOf,
  promptTokenBound,
  type DeliveredChunk,
  type DeliveredPrefix,
  type ReceiptSigner,
} from "../receipts/index.ts";
import type { ReceiptBody } from "../receipts/schema.ts";
import type { JobFrame, TerminalState } from "../wire/frames.ts";

/** How an attempt ended, as far as its receipt is concerned. */
export interface AttemptEnding {
  job: Pick<JobFrame, "request_id" | "attempt_n" | "model_id" | "route" | "messages" | "params">;
  /** The hash sent in `accepted` (this machine's measurement at request start). */
  modelHash: string;
  /** Every chunk handed to the gateway's socket, in seq order. */
  sent: readonly DeliveredChunk[];
  terminal_state: TerminalState;
  finish_reason: string | null;
  /**
   * `delivered_output_bytes` of the gateway's `cancel`, when the attempt was cancelled: the receipt
   * then binds exactly the chunks within those bytes, the prefix the buyer received.
   */
  cancelDeliveredBytes: number | null;
  /** Prompt tokens the engine reported (any number; capped here). */
  engineInputTokens: number;
  terminalAtMs: number;
  issuedAtMs: number;
}

export interface IssuedReceipt {
  envelope: string;
  body: ReceiptBody;
  prefix: DeliveredPrefix;
  /** True when nothing reached the buyer: the gateway settles such an attempt zero_settled at once. */
  deliveredNothing: boolean;
}

/**
 * Prompt tokens a receipt may claim: the engine's count, never above the gateway's own bound for the
 * prompt (docs/receipts.md). Tokenizers can count special tokens the bound does not; claiming more would
 * quarantine the whole attempt (`input_tokens_inflated`), so the runtime caps rather than risk it.
 */
export function observedInputTokens(job: Pick<JobFrame, "messages" | "params">, engineInputTokens: number): number {
  const reported = Number.isFinite(engineInputTokens) ? Math.max(0, Math.floor(engineInputTokens)) : 0;
  return Math.min(reported, promptTokenBound(job.messages, job.params.tools));
}

/** The chunks a receipt binds: after a cancel the delivered prefix, otherwise every chunk sent. */
export function boundChunks<C extends DeliveredChunk>(sent: readonly C[], cancelDeliveredBytes: number | null): C[] {
  return cancelDeliveredBytes === null ? [...sent] : chunksWithinBytes(sent, cancelDeliveredBytes);
}

/**
 * Signs the receipt of one ended attempt. Output usage is the bound chunks' tokens (observed =
 * billable: a provider is paid for what was delivered, nothing more). Input: observed = the capped
 * engine count, and billable = observed — also for a partial attempt, whose whole prompt was
 * processed; the gateway still charges only attempts that delivered something.
 */
export function issueReceipt(signer: ReceiptSigner, ending: AttemptEnding): IssuedReceipt {
  const chunks = ending.cancelDeliveredBytes === null ? ending.sent : chunksWithinBytes(ending.sent, ending.cancelDeliveredBytes);
  // Offsets start at 0: failover happens only before the first buyer-visible byte (docs/architecture.md).
  const prefix = deliveredPrefixOf(chunks, ending.terminal_state, ending.finish_reason, 0);
  const facts = {
    job: ending.job,
    model_hash: ending.modelHash,
    prefix,
    observed_input_tokens: observedInputTokens(ending.job, ending.engineInputTokens),
    terminal_state_ts_unix_ms: Math.max(0, Math.floor(ending.terminalAtMs)),
    issued_at_unix_ms: Math.max(0, Math.floor(ending.issuedAtMs)),
  };
  const body = signer.body(facts);
  return { envelope: signer.signBody(body), body, prefix, deliveredNothing: deliveredNothing(prefix) };
}
