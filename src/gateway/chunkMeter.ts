// Per-attempt chunk accounting at the edge of the request actor (docs/decisions.md, Performance). Chunks after an attempt's
// first one never pass through the machine: this counter checks their order and the max_tokens cap and
// keeps the delivered counts, and the edge tells the machine only what changes its state — a bad
// sequence, the length cap, and at most one `stream.progress` per idle-check window.
import { outputTokenBound, toolCallDeltaBytes } from "../receipts/index.ts";
import type { ChunkFrame } from "../wire/frames.ts";

/**
 * What the edge does with a chunk: relay it, or end the attempt (the chunk itself is never relayed).
 * `tokens_inflated`: the attempt's tokens would pass what its delivered bytes can hold (docs/receipts.md's
 * output-token bound) — a provider failure, like a bad seq.
 */
export type ChunkVerdict = "relay" | "seq_error" | "tokens_inflated" | "length_limited";

export class ChunkMeter {
  /** The seq the next chunk must carry (the protocol counts from 0 per attempt). */
  expectedSeq = 0;
  /** Tokens of the chunks relayed so far (the usage's completion tokens). */
  deliveredTokens = 0;
  /** UTF-8 bytes of the relayed content (the cancel frame's `delivered_output_bytes`). */
  deliveredBytes = 0;
  /** UTF-8 bytes of the relayed tool-call names and arguments. */
  deliveredToolCallBytes = 0;
  /** Whether the current idle-check window already reported progress to the machine. */
  private progressReported = false;

  constructor(readonly maxTokens: number) {}

  /** True once a chunk of this attempt was accepted: later chunks stay at the edge. */
  get started(): boolean {
    return this.expectedSeq > 0;
  }

  /**
   * Checks one chunk and, when it may be relayed, counts it. The order matches the request machine's
   * first-chunk guards: a wrong seq, then tokens past the output bound, are provider failures before the
   * cap is looked at; a chunk that would take the delivered tokens past max_tokens ends the attempt
   * length-limited and is not counted.
   */
  accept(frame: ChunkFrame): ChunkVerdict {
    if (frame.seq !== this.expectedSeq) return "seq_error";
    const bytes = frame.content === undefined ? 0 : Buffer.byteLength(frame.content, "utf8");
    const toolCallBytes = frame.tool_calls === undefined ? 0 : toolCallDeltaBytes(frame.tool_calls);
    const tokens = this.deliveredTokens + frame.tokens;
    if (tokens > outputTokenBound(this.deliveredBytes + bytes, this.deliveredToolCallBytes + toolCallBytes)) return "tokens_inflated";
    if (tokens > this.maxTokens) return "length_limited";
    this.expectedSeq++;
    this.deliveredTokens = tokens;
    this.deliveredBytes += bytes;
    this.deliveredToolCallBytes += toolCallBytes;
    return "relay";
  }

  /** Whether an attempt's first chunk passes the output-token bound (the machine judges its seq and cap). */
  static inflatesFirst(frame: ChunkFrame): boolean {
    const bytes = frame.content === undefined ? 0 : Buffer.byteLength(frame.content, "utf8");
    return frame.tokens > outputTokenBound(bytes, frame.tool_calls === undefined ? 0 : toolCallDeltaBytes(frame.tool_calls));
  }

  /** Notes progress; true only for the first progress of the window (the one the machine must hear of). */
  markProgress(): boolean {
    if (this.progressReported) return false;
    this.progressReported = true;
    return true;
  }

  /** The machine's idle check closed a window: the next progress must be reported again. */
  openWindow(): void {
    this.progressReported = false;
  }

  /** The attempt's buffered output was dropped (non-streaming failover): none of it was delivered. */
  discard(): void {
    this.deliveredTokens = 0;
    this.deliveredBytes = 0;
    this.deliveredToolCallBytes = 0;
  }
}
