// Token counting for the openai engine (docs/operator.md, docs/receipts.md). Pure.
import type { JobFrame } from "../../wire/frames.ts";
import { promptTokenBound } from "../../receipts/hashes.ts";

// The bound a provider must never report above (docs/receipts.md): the same function the gateway verifies with.
export { promptTokenBound };

/**
 * Input tokens to report: the upstream's `prompt_tokens` when it sent one, else a conservative
 * estimate (UTF-8 bytes of the contents / 4, at least 1) — never above the gateway's bound.
 */
export function inputTokens(job: Pick<JobFrame, "messages" | "params">, reported: number | null): number {
  const bound = promptTokenBound(job.messages, job.params.tools);
  if (reported !== null) return Math.min(Math.max(0, Math.floor(reported)), bound);
  let bytes = 0;
  for (const m of job.messages) bytes += m.content ? Buffer.byteLength(m.content, "utf8") : 0;
  return Math.min(bound, Math.max(1, Math.ceil(bytes / 4)));
}

/**
 * Output tokens per relayed chunk. docs/operator.md: one token per upstream content (or tool-call) delta,
 * unless the upstream reports per-chunk counts. Upstreams that do report a *cumulative* generated
 * count on every chunk (vLLM `continuous_usage_stats`: `usage.completion_tokens`; llama.cpp
 * `timings_per_token`: `timings.predicted_n`); a chunk then carries the difference since the last one.
 *
 * Counting mode is fixed by the first chunk that carries a delta: if it has a count, counts are used;
 * if a later delta chunk lacks one or the count goes backwards, counting falls back to one per
 * delta for the rest of the stream. Tokens spent on reasoning (which is not relayed) advance the
 * baseline without being charged, so the buyer pays only for what it receives.
 */
export class OutputTokenCounter {
  private mode: "undecided" | "counted" | "per_delta" = "undecided";
  private baseline = 0;

  /** Tokens for a chunk that relays output (`relayed`) or only reasoning; `cumulative` as reported, or null. */
  count(relayed: boolean, cumulative: number | null): number {
    if (this.mode === "undecided") this.mode = cumulative !== null ? "counted" : "per_delta";
    if (this.mode === "counted") {
      if (cumulative !== null && cumulative >= this.baseline) {
        const n = Math.floor(cumulative - this.baseline);
        this.baseline = cumulative;
        return relayed ? n : 0;
      }
      this.mode = "per_delta";
    }
    return relayed ? 1 : 0;
  }
}
