// What the HTTP layer and the gateway agree on for one chat request: the normalised request every
// entrypoint produces, the responder every facade implements and the gateway drives, and the failure
// codes the gateway reports (http/ maps them to statuses and envelopes: src/http/errors.ts).
import type { ChunkFrame, JobMessage, JobParams } from "../wire/frames.ts";

/** A buyer's chat request in the form a provider job carries. */
export interface NormalizedChat {
  model: string;
  messages: JobMessage[];
  params: JobParams;
  stream: boolean;
  includeUsage: boolean;
}

/** Why the gateway could not serve a request. */
export type FailureCode =
  | "internal_error"
  | "model_not_available"
  | "coordinator_unavailable"
  | "context_length_exceeded"
  | "unsupported_parameter"
  | "provider_disconnected";

/** A request failure as the gateway reports it; `message` is buyer-facing text. */
export interface RequestFailure {
  code: FailureCode;
  message: string;
}

export interface ChatUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

export interface ChatOutcome {
  finishReason: string;
  usage: ChatUsage;
}

/**
 * Writes one request's answer in an entrypoint's wire format. The gateway drives it with
 * `RequestFailure`s; a facade implements it over its own error values (`Failure`), and the pipeline
 * maps one to the other (src/http/pipeline.ts).
 */
export interface ChatResponder<Failure = RequestFailure> {
  /** Resolves once the buyer-visible response can start (or has failed before its first byte). */
  readonly response: Promise<Response>;
  relay(frame: ChunkFrame): void;
  /** Forgets buffered output of a failed attempt (JSON responses only buffer). */
  discard(): void;
  /**
   * The answer is final but may not go out yet (its charge is not committed): a responder that writes
   * it in one piece builds it now and returns it unsent, so the retry-replay copy can keep it before
   * the charge does (docs/receipts.md, "Crashes"); `succeed` then sends exactly that response. Returns a
   * promise when that copy is kept in another process (a cluster node's Redis) and answered later: it
   * settles, never rejecting, once it is, and the request's writes that charge wait for it.
   */
  prepare?(outcome: ChatOutcome): void | Promise<void>;
  /**
   * A stream's output that the buyer's socket has not taken yet (a slow reader's, held in the
   * process): settles once the socket has, or once the stream's stall bound has passed; null when
   * nothing waits.
   */
  unsent?(): Promise<void> | null;
  succeed(outcome: ChatOutcome): void;
  fail(failure: Failure): void;
  failMidStream(failure: Failure): void;
}
