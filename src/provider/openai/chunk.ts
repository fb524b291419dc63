// Upstream chunk payloads → what the engine relays. Pure, with per-stream state (token counting and
// tool-call index mapping). Quirks handled here are listed in fixtures/upstreams/README.md.
import type { DeclineCode, ToolCallDelta } from "../../wire/frames.ts";
import { ContentDeltaTemplate } from "./contentTemplate.ts";
import { declineCodeFor, isErrorPayload, parseJson } from "./errors.ts";
import { completionChecker, streamChunkChecker, type ToolCallFragment, type UpstreamUsage } from "./schema.ts";
import { OutputTokenCounter } from "./tokens.ts";

/** What one upstream payload means for the stream. */
export type MappedPayload =
  | {
      kind: "chunk";
      /** Text to relay; absent when the chunk has none (role-only, reasoning-only, finish or usage chunks). */
      content?: string;
      tool_calls?: ToolCallDelta[];
      /** Output tokens of this chunk (0 unless it relays something). */
      tokens: number;
      /** True when the chunk carried reasoning text, which is not relayed (no protocol field holds it). */
      reasoning: boolean;
      finishReason: string | null;
      promptTokens: number | null;
      /**
       * A content delta and nothing else: no tool calls, reasoning, finish reason, usage or reported
       * count. Its payload may serve as the stream's content template (contentTemplate.ts).
       */
      plain?: true;
    }
  | { kind: "error"; code: DeclineCode }
  | { kind: "malformed" };

const FINISH_REASONS: ReadonlySet<string> = new Set(["stop", "length", "tool_calls", "content_filter", "function_call"]);

/**
 * The finish reason as the buyer will see it: `""` and null mean "not finished" (Ollama 2024 sends
 * `""` on every content chunk); OpenAI's values pass through; anything else a server invents is "stop".
 */
export function normalizeFinishReason(value: string | null | undefined): string | null {
  if (value === null || value === undefined || value === "") return null;
  return FINISH_REASONS.has(value) ? value : "stop";
}

function promptTokensOf(usage: UpstreamUsage | null | undefined): number | null {
  return typeof usage?.prompt_tokens === "number" ? usage.prompt_tokens : null;
}

/**
 * Maps upstream tool-call indices to the indices relayed. Ollama 0.20.x sends every parallel call
 * with `index: 0`, telling them apart only by `id`: a new id on a known index starts a new call.
 */
class ToolCallIndices {
  private readonly byUpstream = new Map<number, { id: string | null; index: number }>();
  private next = 0;

  map(fragments: readonly ToolCallFragment[]): ToolCallDelta[] {
    const out: ToolCallDelta[] = [];
    fragments.forEach((fragment, position) => {
      const upstream = fragment.index ?? position;
      const id = fragment.id ?? null;
      let entry = this.byUpstream.get(upstream);
      if (!entry || (id !== null && entry.id !== null && id !== entry.id)) {
        entry = { id, index: this.next++ };
        this.byUpstream.set(upstream, entry);
      } else if (id !== null) entry.id = id;
      // Absent keys rather than undefined or empty values: only what the fragment actually carries.
      const delta: ToolCallDelta = { index: entry.index };
      if (fragment.id) delta.id = fragment.id;
      if (fragment.function?.name) delta.name = fragment.function.name;
      if (fragment.function?.arguments) delta.arguments = fragment.function.arguments;
      if (delta.id !== undefined || delta.name !== undefined || delta.arguments !== undefined) out.push(delta);
    });
    return out;
  }
}

/** The choice with index 0 (an absent index counts as 0), else the first one; a loop: this runs per chunk. */
function firstChoice<C extends { index?: number | null }>(choices: readonly C[] | null | undefined): C | undefined {
  if (!choices) return undefined;
  for (const c of choices) if ((c.index ?? 0) === 0) return c;
  return choices[0];
}

/** The text a stream payload relays (its first choice's `delta.content`), when it is a valid chunk. */
export function chunkContent(payload: unknown): string | undefined {
  if (isErrorPayload(payload) || !streamChunkChecker.Check(payload)) return undefined;
  const content = firstChoice(payload.choices)?.delta?.content;
  return typeof content === "string" ? content : undefined;
}

export interface ChunkMapper {
  /** Maps one parsed `data:` payload of a stream. */
  chunk(payload: unknown): MappedPayload;
  /**
   * Maps a payload known to be the stream's `plain` template with another text (contentTemplate.ts):
   * exactly what `chunk` gives for it.
   */
  contentDelta(content: string): MappedPayload;
  /** Maps a whole non-streaming `chat.completion` (an upstream that ignored `stream: true`). */
  completion(payload: unknown): MappedPayload;
}

/** A mapper for one upstream stream. */
export function createChunkMapper(): ChunkMapper {
  const counter = new OutputTokenCounter();
  const toolIndices = new ToolCallIndices();

  function chunk(payload: unknown): MappedPayload {
    // An error object is checked before `choices` (mid-stream `data: {"error": …}` frames).
    if (isErrorPayload(payload)) return { kind: "error", code: declineCodeFor(200, payload) };
    if (!streamChunkChecker.Check(payload)) return { kind: "malformed" };
    // Only the first choice is relayed (the gateway asks for n = 1); `choices: []` is a usage chunk.
    const choice = firstChoice(payload.choices);
    const delta = choice?.delta;
    const content = typeof delta?.content === "string" && delta.content !== "" ? delta.content : undefined;
    const toolCalls = delta?.tool_calls ? toolIndices.map(delta.tool_calls) : [];
    const reasoning = Boolean(delta?.reasoning_content || delta?.reasoning);
    const relayed = content !== undefined || toolCalls.length > 0;
    let tokens = 0;
    // A cumulative count counts only when it rides on a chunk with choices (not the final usage chunk).
    const cumulative = choice ? (payload.usage?.completion_tokens ?? payload.timings?.predicted_n ?? null) : null;
    if (relayed || reasoning) tokens = counter.count(relayed, cumulative);
    const mapped: MappedPayload = {
      kind: "chunk",
      tokens,
      reasoning,
      finishReason: normalizeFinishReason(choice?.finish_reason),
      promptTokens: promptTokensOf(payload.usage),
    };
    if (content !== undefined) mapped.content = content;
    if (toolCalls.length > 0) mapped.tool_calls = toolCalls;
    if (content !== undefined && toolCalls.length === 0 && !reasoning && mapped.finishReason === null && mapped.promptTokens === null && cumulative === null) {
      mapped.plain = true;
    }
    return mapped;
  }

  function contentDelta(content: string): MappedPayload {
    return { kind: "chunk", content, tokens: counter.count(true, null), reasoning: false, finishReason: null, promptTokens: null };
  }

  function completion(payload: unknown): MappedPayload {
    if (isErrorPayload(payload)) return { kind: "error", code: declineCodeFor(200, payload) };
    if (!completionChecker.Check(payload)) return { kind: "malformed" };
    const choice = firstChoice(payload.choices);
    if (!choice) return { kind: "malformed" };
    const { message } = choice;
    const content = message.content ? message.content : undefined;
    const toolCalls = message.tool_calls ? toolIndices.map(message.tool_calls) : [];
    const reasoning = Boolean(message.reasoning_content || message.reasoning);
    const relayed = content !== undefined || toolCalls.length > 0;
    // One delta holds the whole answer: its tokens are the reported completion tokens, unless part of
    // them went to reasoning (not relayed), where the relayed share is unknown: then bytes / 4.
    const reported = payload.usage?.completion_tokens ?? null;
    const relayedText = (content ?? "") + (toolCalls.length > 0 ? JSON.stringify(toolCalls) : "");
    const estimate = Math.max(1, Math.ceil(Buffer.byteLength(relayedText, "utf8") / 4));
    const tokens = !relayed ? 0 : reported !== null && !reasoning ? Math.floor(reported) : Math.min(estimate, reported ?? estimate);
    const mapped: MappedPayload = {
      kind: "chunk",
      tokens,
      reasoning,
      // A complete body is a finished answer even when a server leaves finish_reason out.
      finishReason: normalizeFinishReason(choice.finish_reason) ?? (toolCalls.length > 0 ? "tool_calls" : "stop"),
      promptTokens: promptTokensOf(payload.usage),
    };
    if (content !== undefined) mapped.content = content;
    if (toolCalls.length > 0) mapped.tool_calls = toolCalls;
    return mapped;
  }

  return { chunk, contentDelta, completion };
}

/**
 * Maps a stream's `data:` payload texts, in order: content deltas after the first through the learned
 * template (contentTemplate.ts), everything else parsed and mapped by `chunk`. The same results as
 * parsing and mapping each one.
 */
export function createStreamPayloadMapper(mapper: ChunkMapper = createChunkMapper()): (data: string) => MappedPayload {
  const template = new ContentDeltaTemplate();
  const contentOf = (data: string) => chunkContent(parseJson(data));
  return (data) => {
    const text = template.match(data);
    if (text !== undefined) return mapper.contentDelta(text);
    const payload = parseJson(data);
    if (payload === undefined) return { kind: "malformed" };
    const mapped = mapper.chunk(payload);
    if (mapped.kind === "chunk" && mapped.plain) template.learn(data, mapped.content!, contentOf);
    return mapped;
  };
}
