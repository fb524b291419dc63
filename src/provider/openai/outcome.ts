// How an upstream call ends → the engine's outcome (the spec's rule). Pure, table-tested.
import type { DeclineCode, TerminalState } from "../../wire/frames.ts";
import type { EngineOutcome } from "../engine.ts";

/** Why reading the upstream stopped. */
export type StreamEnd =
  /** `data: [DONE]` arrived (or a complete non-streaming body was read). */
  | { kind: "done" }
  /** The body ended cleanly but without `[DONE]`. */
  | { kind: "eof" }
  /** Connection refused or reset, or the body broke off mid-read. */
  | { kind: "transport" }
  /** No output within the first-token timeout, or silence longer than the idle timeout after it. */
  | { kind: "timeout"; which: "first_token" | "idle" }
  /** A non-2xx answer, or an error object/field in the body. */
  | { kind: "upstream_error"; code: DeclineCode }
  /** A payload that is not JSON or not a chunk, or an oversize line. */
  | { kind: "malformed" }
  /** The gateway cancelled the attempt (or the session was lost). */
  | { kind: "cancelled"; terminalState: TerminalState };

export interface StreamFacts {
  /** Chunks relayed to the gateway so far (the buyer may already hold their bytes). */
  relayedChunks: number;
  /** The upstream's finish reason, once one was seen. */
  finishReason: string | null;
  inputTokens: number;
}

/** Short snake_case label of a stream end, for logs (never upstream text). */
export function endLabel(end: StreamEnd): string {
  return end.kind === "timeout" ? `${end.which}_timeout` : end.kind;
}

/**
 * The outcome rule:
 * - `normal_done` only when the upstream finished the answer (a finish_reason) and then ended the
 *   stream, with `[DONE]` or a clean close: the finish chunk is the answer's last, and some servers
 *   (mlx_lm, Ollama on errors) close without `[DONE]` (fixtures README rule 5). A stream with no
 *   finish_reason is truncated and never reported as normal, even when `[DONE]` follows.
 * - Before any output, every failure is `declined` so the gateway fails over (the code says why).
 * - After output, transport failures (reset, cut, stall, end without `[DONE]`) end as
 *   `upstream_transport_disconnect`; errors the upstream reported or garbled output as `provider_error`.
 *   The gateway ends the buyer's stream with the in-band `provider_disconnected` error either way.
 * - A cancel ends with the cancel's own terminal state.
 */
export function decideOutcome(end: StreamEnd, facts: StreamFacts): EngineOutcome {
  const ended = (terminal_state: TerminalState, finish_reason: string | null): EngineOutcome => ({
    kind: "ended",
    // output_tokens is filled in by the runtime from the chunks actually sent.
    result: { terminal_state, finish_reason, usage: { input_tokens: facts.inputTokens, output_tokens: 0 } },
  });
  if (end.kind === "cancelled") return ended(end.terminalState, null);
  if ((end.kind === "done" || end.kind === "eof") && facts.finishReason !== null) return ended("normal_done", facts.finishReason);
  if (facts.relayedChunks === 0) {
    return { kind: "declined", code: end.kind === "upstream_error" ? end.code : "internal" };
  }
  switch (end.kind) {
    case "eof":
    case "transport":
    case "timeout":
      return ended("upstream_transport_disconnect", null);
    case "done": // [DONE] without any finish_reason: the upstream did not say the answer was complete
    case "upstream_error":
    case "malformed":
      return ended("provider_error", null);
  }
}
