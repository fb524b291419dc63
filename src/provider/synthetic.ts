// The synthetic engine: deterministic text at a configurable rate, with injectable faults, for demos,
// tests and benchmarks. The output is a pure function of the job, so tests can predict every chunk:
// text by default, a tool call when scripted to (see syntheticToolCall), JSON for structured output.
import type { JobMessage, JobParams } from "../wire/frames.ts";
import { cancelTerminalState, type Engine, type EngineChunk, type EngineJob, type EngineOutcome } from "./engine.ts";
import type { TerminalState } from "../wire/frames.ts";

export type SyntheticFault =
  | { kind: "none" }
  | { kind: "decline" }
  | { kind: "exit-before-first-chunk" }
  | { kind: "stall" }
  | { kind: "exit-after"; n: number }
  | { kind: "error-after"; n: number }
  | { kind: "stall-after"; n: number };

/** Parses `none|decline|exit-before-first-chunk|stall|exit-after:N|error-after:N|stall-after:N`; null when invalid. */
export function parseSyntheticFault(spec: string): SyntheticFault | null {
  if (spec === "none" || spec === "decline" || spec === "exit-before-first-chunk" || spec === "stall") {
    return { kind: spec };
  }
  const match = /^(exit-after|error-after|stall-after):(\d{1,9})$/.exec(spec);
  if (!match) return null;
  return { kind: match[1] as "exit-after" | "error-after" | "stall-after", n: Number(match[2]) };
}

// ---- text generation (pure) ----

const ADJECTIVES = ["quiet", "bright", "patient", "small", "careful", "ancient", "steady", "curious",
  "gentle", "distant", "simple", "clever", "warm", "silver", "narrow", "early"];
const NOUNS = ["river", "engine", "garden", "signal", "model", "lantern", "harbor", "library", "window",
  "circuit", "forest", "letter", "bridge", "kettle", "compass", "meadow"];
const VERBS = ["follows", "carries", "watches", "builds", "finds", "crosses", "remembers", "answers",
  "shapes", "guides", "reaches", "measures"];
const PREPOSITIONS = ["across", "beneath", "beside", "toward", "through", "around", "near", "behind"];
const ADVERBS = ["slowly", "again", "together", "quietly", "today", "gladly"];
const CONJUNCTIONS = ["and", "while", "because"];

/** FNV-1a, 32 bit: a stable seed from the prompt (not a security property). */
function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(text)) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash;
}

/** mulberry32: tiny deterministic PRNG, so the same prompt always yields the same words. */
export function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** One sentence of 6..13 words: "The [adj] noun verb prep the [adj] noun[, conj the noun verb adverb]." */
function sentence(next: () => number): string[] {
  const pick = (list: readonly string[]) => list[Math.floor(next() * list.length)] as string;
  const words = ["The"];
  if (next() < 0.5) words.push(pick(ADJECTIVES));
  words.push(pick(NOUNS), pick(VERBS), pick(PREPOSITIONS), "the");
  if (next() < 0.5) words.push(pick(ADJECTIVES));
  words.push(pick(NOUNS));
  if (next() < 0.5) {
    words[words.length - 1] += ",";
    words.push(pick(CONJUNCTIONS), "the", pick(NOUNS), pick(VERBS), pick(ADVERBS));
  }
  words[words.length - 1] += ".";
  return words;
}

function lastUserContent(messages: readonly JobMessage[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const message = messages[i];
    if (message?.role === "user") return message.content ?? "";
  }
  return "";
}

export interface SyntheticPlan {
  /** Token strings in order; their concatenation is the output text. */
  tokens: string[];
  finishReason: "stop" | "length";
}

/**
 * The full synthetic answer for a prompt: 12..48 tokens (whole sentences, seeded by the last user
 * message), cut to `maxTokens`. Every token but the last ends with a space. finish_reason is
 * "length" exactly when the cut removed tokens. A cut answer is a prefix of the uncut one.
 */
export function syntheticPlan(messages: readonly JobMessage[], maxTokens: number): SyntheticPlan {
  const seed = fnv1a(lastUserContent(messages));
  const next = prng(seed);
  const target = 12 + (seed % 25); // whole sentences of ≤ 13 words past a target of 12..36 → ≤ 48
  const words: string[] = [];
  while (words.length < target) words.push(...sentence(next));
  const tokens = words.map((word, i) => (i === words.length - 1 ? word : `${word} `));
  const limit = Math.max(0, Math.floor(maxTokens));
  return tokens.length > limit
    ? { tokens: tokens.slice(0, limit), finishReason: "length" }
    : { tokens, finishReason: "stop" };
}

/** The token strings the synthetic engine produces for this prompt and cap. */
export function syntheticText(messages: readonly JobMessage[], maxTokens: number): string[] {
  return syntheticPlan(messages, maxTokens).tokens;
}

/** Input-token estimate: UTF-8 bytes of all message contents / 4, rounded up, at least 1. */
export function estimateInputTokens(messages: readonly JobMessage[]): number {
  const encoder = new TextEncoder();
  let bytes = 0;
  for (const message of messages) bytes += encoder.encode(message.content ?? "").byteLength;
  return Math.max(1, Math.ceil(bytes / 4));
}

// ---- scripted replies: tool calls and structured output (pure) ----

/**
 * Put in the last user message to make the engine call a tool when the job offers tools:
 * `[call_tool]` calls the first offered function, `[call_tool:NAME]` the one named NAME.
 */
export const SYNTHETIC_TOOL_MARKER = "[call_tool]";
const MARKER = /\[call_tool(?::([A-Za-z0-9_.-]{1,64}))?\]/;

export interface SyntheticToolCall {
  id: string;
  name: string;
  /** JSON text: an example object shaped by the tool's parameters schema. */
  arguments: string;
}

interface OfferedTool {
  name: string;
  parameters: unknown;
}

function offeredTools(tools: readonly unknown[] | undefined): OfferedTool[] {
  const out: OfferedTool[] = [];
  for (const tool of tools ?? []) {
    const fn = (tool as { function?: { name?: unknown; parameters?: unknown } } | null)?.function;
    if (typeof fn?.name === "string") out.push({ name: fn.name, parameters: fn.parameters });
  }
  return out;
}

/**
 * An example value shaped by a JSON schema (deterministic): the first enum value or const, "synthetic"
 * for strings, 1 for numbers, true for booleans, one item for arrays, every property for objects.
 */
export function exampleFromSchema(schema: unknown, depth = 0): unknown {
  if (typeof schema !== "object" || schema === null || depth > 8) return null;
  const s = schema as Record<string, unknown>;
  if (Array.isArray(s.enum) && s.enum.length > 0) return s.enum[0];
  if ("const" in s) return s.const;
  for (const key of ["anyOf", "oneOf", "allOf"]) {
    const options = s[key];
    if (Array.isArray(options) && options.length > 0) return exampleFromSchema(options[0], depth + 1);
  }
  const type = Array.isArray(s.type) ? s.type.find((t) => t !== "null") : s.type;
  switch (type) {
    case "string":
      return "synthetic";
    case "number":
    case "integer":
      return 1;
    case "boolean":
      return true;
    case "null":
      return null;
    case "array":
      return s.items === undefined ? [] : [exampleFromSchema(s.items, depth + 1)];
    default: {
      const properties = s.properties;
      if (typeof properties !== "object" || properties === null) return {};
      const out: Record<string, unknown> = {};
      for (const [name, sub] of Object.entries(properties)) out[name] = exampleFromSchema(sub, depth + 1);
      return out;
    }
  }
}

const hex32 = (n: number) => n.toString(16).padStart(8, "0");

/**
 * The tool call the synthetic engine makes for a job, or null when it answers with text. It calls a
 * tool only when the job offers function tools, the last message is the user's (after a tool result
 * it answers in text, so a round trip ends), tool_choice is not "none", and either tool_choice forces
 * a call ("required" or a named function) or the user message holds the marker.
 */
export function syntheticToolCall(messages: readonly JobMessage[], params: Pick<JobParams, "tools" | "tool_choice">): SyntheticToolCall | null {
  const tools = offeredTools(params.tools);
  const last = messages.at(-1);
  if (tools.length === 0 || last?.role !== "user" || params.tool_choice === "none") return null;
  const prompt = last.content ?? "";
  const marker = MARKER.exec(prompt);
  const forcedName = (params.tool_choice as { function?: { name?: unknown } } | undefined)?.function?.name;
  let tool: OfferedTool | undefined;
  if (typeof forcedName === "string") tool = tools.find((t) => t.name === forcedName);
  else if (marker || params.tool_choice === "required") tool = tools.find((t) => t.name === marker?.[1]) ?? tools[0];
  if (!tool) return null;
  const seed = `${tool.name}\n${prompt}`;
  return {
    id: `call_${hex32(fnv1a(seed))}${hex32(fnv1a(`${seed}#`))}`,
    name: tool.name,
    arguments: JSON.stringify(exampleFromSchema(tool.parameters) ?? {}),
  };
}

/** JSON text for a job that asks for structured output, or null for plain text. */
export function syntheticJson(messages: readonly JobMessage[], responseFormat: unknown): string | null {
  const format = responseFormat as { type?: unknown; json_schema?: { schema?: unknown } } | undefined;
  if (format?.type === "json_schema") return JSON.stringify(exampleFromSchema(format.json_schema?.schema) ?? {});
  if (format?.type === "json_object") return JSON.stringify({ answer: syntheticText(messages, 1000).join("") });
  return null;
}

/** Splits text into pieces of at most `size` code points (never inside a surrogate pair). */
function pieces(text: string, size: number): string[] {
  const points = Array.from(text);
  const out: string[] = [];
  for (let i = 0; i < points.length; i += size) out.push(points.slice(i, i + size).join(""));
  return out;
}

export interface SyntheticReply {
  /** Chunks in order, one output token each. */
  chunks: EngineChunk[];
  finishReason: "stop" | "length" | "tool_calls";
}

/**
 * Everything the engine sends for a job, cut to max_tokens (finish_reason "length" when cut): a tool
 * call (a chunk naming it, then its arguments 8 characters a chunk), structured output (the JSON 8
 * characters a chunk), or the synthetic text (one word a chunk).
 */
export function syntheticReply(messages: readonly JobMessage[], params: JobParams): SyntheticReply {
  const limit = Math.max(0, Math.floor(params.max_tokens));
  const cut = (chunks: EngineChunk[], finishReason: "stop" | "tool_calls"): SyntheticReply =>
    chunks.length > limit ? { chunks: chunks.slice(0, limit), finishReason: "length" } : { chunks, finishReason };
  const call = syntheticToolCall(messages, params);
  if (call) {
    const head: EngineChunk = { tool_calls: [{ index: 0, id: call.id, name: call.name, arguments: "" }], tokens: 1 };
    const args = pieces(call.arguments, 8).map((a): EngineChunk => ({ tool_calls: [{ index: 0, arguments: a }], tokens: 1 }));
    return cut([head, ...args], "tool_calls");
  }
  const json = syntheticJson(messages, params.response_format);
  if (json !== null) return cut(pieces(json, 8).map((content) => ({ content, tokens: 1 })), "stop");
  const plan = syntheticPlan(messages, limit);
  return { chunks: plan.tokens.map((content) => ({ content, tokens: 1 })), finishReason: plan.finishReason };
}

// ---- the engine (timers at the edge, injectable) ----

/** Waits `ms`, resolving early (never rejecting) when `signal` aborts. */
export type Delay = (ms: number, signal: AbortSignal) => Promise<void>;

export const abortableDelay: Delay = (ms, signal) => {
  if (signal.aborted || ms <= 0) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
};

function untilAborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

export interface SyntheticOptions {
  /** Delay before the first chunk (default 0). */
  ttftMs?: number;
  /** Chunk rate after the first (default 200; 0 = as fast as possible). */
  tokensPerSecond?: number;
  fault?: SyntheticFault;
  delay?: Delay;
}

/** Creates the synthetic engine. One token per chunk. */
export function createSyntheticEngine(options: SyntheticOptions = {}): Engine {
  const ttftMs = options.ttftMs ?? 0;
  const tokensPerSecond = options.tokensPerSecond ?? 200;
  const intervalMs = tokensPerSecond > 0 ? 1000 / tokensPerSecond : 0;
  const fault = options.fault ?? { kind: "none" };
  const delay = options.delay ?? abortableDelay;

  async function run({ job, signal, accept, emit, die }: EngineJob): Promise<EngineOutcome> {
    if (fault.kind === "decline") return { kind: "declined", code: "internal" };
    accept();
    const reply = syntheticReply(job.messages, job.params);
    const inputTokens = estimateInputTokens(job.messages);
    let emitted = 0;
    const ended = (terminal_state: TerminalState, finish_reason: string | null): EngineOutcome => ({
      kind: "ended",
      result: { terminal_state, finish_reason, usage: { input_tokens: inputTokens, output_tokens: emitted } },
    });
    const cancelled = () => ended(cancelTerminalState(signal), null);

    if (fault.kind === "stall") {
      await untilAborted(signal);
      return cancelled();
    }
    // A fault "after N chunks" fires after min(N, answer length) chunks, i.e. always before `end`.
    const faultAt =
      fault.kind === "exit-after" || fault.kind === "error-after" || fault.kind === "stall-after"
        ? Math.min(fault.n, reply.chunks.length)
        : fault.kind === "exit-before-first-chunk"
          ? 0
          : -1;

    await delay(ttftMs, signal);
    for (let i = 0; i <= reply.chunks.length; i++) {
      if (signal.aborted) return cancelled();
      if (i === faultAt) {
        // A job that never ends on its own: only a cancel (or a drop) ends it.
        if (fault.kind === "stall-after") {
          await untilAborted(signal);
          return cancelled();
        }
        if (fault.kind !== "error-after") die();
        // Reached for error-after, and for exit faults when die() returns (in-process socket drop).
        return ended("provider_error", null);
      }
      if (i === reply.chunks.length) break;
      if (i > 0 && intervalMs > 0) {
        await delay(intervalMs, signal);
        if (signal.aborted) return cancelled();
      }
      const chunk = reply.chunks[i]!;
      emit(chunk);
      emitted += chunk.tokens;
    }
    return ended("normal_done", reply.finishReason);
  }

  return { name: "synthetic", run };
}
