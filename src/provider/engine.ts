// What a provider runtime needs from an inference engine. The runtime owns the protocol (accepted,
// seq numbers, end, cancel); an engine only turns one job into content deltas and a terminal result.
import type { DeclineCode, JobFrame, TerminalState, ToolCallDelta } from "../wire/frames.ts";

export interface EngineChunk {
  content?: string;
  tool_calls?: ToolCallDelta[];
  /** Output tokens in this chunk. */
  tokens: number;
}

export interface EngineJob {
  job: JobFrame;
  /**
   * Aborted when the gateway cancels the attempt (reason "buyer_cancel" | "gateway_timeout") or the
   * session is lost. The engine stops promptly and returns `ended`.
   */
  signal: AbortSignal;
  /**
   * Commits to the job: the runtime sends `accepted`. Idempotent, and implied by the first `emit`.
   * Until then the engine may still return `declined` (e.g. after asking an upstream server).
   */
  accept(): void;
  /** Sends one chunk. Ignored after the signal is aborted. */
  emit(chunk: EngineChunk): void;
  /**
   * Simulates the provider dying abruptly (fault injection only): in a child process this exits it,
   * in-process it drops the socket without a close handshake. May not return.
   */
  die(): void;
}

export interface EngineResult {
  terminal_state: TerminalState;
  finish_reason: string | null;
  usage: { input_tokens: number; output_tokens: number };
}

export type EngineOutcome = { kind: "declined"; code: DeclineCode } | { kind: "ended"; result: EngineResult };

export interface Engine {
  readonly name: string;
  /** Runs one job to its end. Rejections are treated as `provider_error` by the runtime. */
  run(job: EngineJob): Promise<EngineOutcome>;
}

/** The terminal state a cancelled job reports: the abort reason when it is one, else buyer_cancel. */
export function cancelTerminalState(signal: AbortSignal): TerminalState {
  const reason: unknown = signal.reason;
  return reason === "gateway_timeout" || reason === "upstream_transport_disconnect" || reason === "provider_error"
    ? reason
    : "buyer_cancel";
}
