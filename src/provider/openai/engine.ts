// The `openai` engine: each job becomes one streaming POST {upstream}/v1/chat/completions to a local
// OpenAI-compatible server (llama-server, Ollama, vLLM, mlx_lm.server, LM Studio). An I/O edge: fetch
// and timers live here; parsing, mapping and the outcome rule are pure modules beside it.
import { cancelTerminalState, type Engine, type EngineChunk, type EngineJob, type EngineOutcome } from "../engine.ts";
import type { LogFn } from "../events.ts";
import { createChunkMapper, createStreamPayloadMapper, type MappedPayload } from "./chunk.ts";
import { declineCodeFor, isErrorPayload, parseJson } from "./errors.ts";
import { decideOutcome, endLabel, type StreamEnd } from "./outcome.ts";
import { chatCompletionsUrl, upstreamBody, upstreamHeaders } from "./request.ts";
import { SseDecoder, type SseEvent } from "./sse.ts";
import { inputTokens } from "./tokens.ts";

export const DEFAULT_FIRST_TOKEN_TIMEOUT_MS = 60_000;
export const DEFAULT_IDLE_TIMEOUT_MS = 30_000;
/** Error bodies are read only to classify them; anything past this is not needed. */
const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** A non-streaming answer (upstream ignored `stream: true`) is capped like a buyer body's output. */
const MAX_COMPLETION_BODY_BYTES = 8 * 1024 * 1024;

export type FetchFn = (url: string, init: RequestInit) => Promise<Response>;

export interface OpenAIEngineOptions {
  /** The server's base URL (`http://127.0.0.1:8080`; a trailing `/v1` is accepted too). */
  upstream: string;
  /** Sent as `Authorization: Bearer …` when set. Never logged. */
  apiKey?: string;
  /** Serve id → upstream model name (`--upstream-model`); a serve id without an entry is sent as is. */
  modelNames?: Readonly<Record<string, string>>;
  /** Longest wait from sending the request to the first relayed delta (default 60 s). */
  firstTokenTimeoutMs?: number;
  /** Longest silence between upstream events once output has started (default 30 s). */
  idleTimeoutMs?: number;
  log?: LogFn;
  fetch?: FetchFn;
}

type Guarded<T> = { ok: true; value: T } | { ok: false; end: StreamEnd };

/** One job's upstream call: one fetch, its timers, and what was relayed. */
class UpstreamCall {
  private readonly controller = new AbortController();
  private readonly mapper = createChunkMapper();
  private readonly payloads = createStreamPayloadMapper(this.mapper);
  private timedOut: "first_token" | "idle" | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  /** The timeout being watched and when it expires (performance.now() ms). */
  private watching: "first_token" | "idle" = "first_token";
  private expiresAt = 0;
  /** When the pending timer fires (Infinity: none pending). */
  private firesAt = Number.POSITIVE_INFINITY;
  private relayedChunks = 0;
  /** Chunk payloads of the current upstream read (they restart the idle clock once per read). */
  private payloadsInRead = 0;
  private finishReason: string | null = null;
  private promptTokens: number | null = null;
  private status: number | null = null;

  constructor(
    private readonly job: EngineJob,
    private readonly url: string,
    private readonly options: OpenAIEngineOptions,
  ) {}

  async run(): Promise<EngineOutcome> {
    const { signal, job } = this.job;
    const cancel = () => this.controller.abort("cancelled");
    signal.addEventListener("abort", cancel, { once: true });
    if (signal.aborted) cancel();
    this.arm("first_token", this.options.firstTokenTimeoutMs ?? DEFAULT_FIRST_TOKEN_TIMEOUT_MS);
    let end: StreamEnd;
    try {
      end = await this.exchange();
    } finally {
      if (this.timer !== null) clearTimeout(this.timer);
      signal.removeEventListener("abort", cancel);
      this.controller.abort("finished"); // releases the upstream connection on every path
    }
    // A cancel wins over whatever failure the abort itself caused.
    if (signal.aborted) end = { kind: "cancelled", terminalState: cancelTerminalState(signal) };
    const facts = {
      relayedChunks: this.relayedChunks,
      finishReason: this.finishReason,
      inputTokens: inputTokens(job, this.promptTokens),
    };
    const outcome = decideOutcome(end, facts);
    this.options.log?.("upstream_call_ended", {
      request_id: job.request_id,
      attempt_n: job.attempt_n,
      status: this.status,
      end: endLabel(end),
      chunks: this.relayedChunks,
      outcome: outcome.kind === "declined" ? `declined:${outcome.code}` : outcome.result.terminal_state,
    });
    return outcome;
  }

  /**
   * (Re)starts the timeout; when it expires, the fetch is aborted and the end is a timeout. Restarted on
   * every upstream event, so the one timer is moved only when the expiry comes before it fires; a timer
   * that fires before the expiry sleeps again for the rest (no timer re-armed per chunk).
   */
  private arm(which: "first_token" | "idle", ms: number): void {
    const now = performance.now();
    this.watching = which;
    this.expiresAt = now + ms;
    if (this.expiresAt < this.firesAt) this.schedule(now, ms);
  }

  private schedule(now: number, ms: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.firesAt = now + ms;
    this.timer = setTimeout(this.fire, ms);
  }

  private readonly fire = (): void => {
    this.timer = null;
    this.firesAt = Number.POSITIVE_INFINITY;
    const now = performance.now();
    if (this.expiresAt > now) return this.schedule(now, this.expiresAt - now);
    this.timedOut = this.watching;
    this.controller.abort(this.watching);
  };

  /** Awaits an I/O step; a rejection becomes the matching stream end (timeout, cancel or transport). */
  private async guarded<T>(step: Promise<T>): Promise<Guarded<T>> {
    try {
      return { ok: true, value: await step };
    } catch {
      return { ok: false, end: this.failedEnd() };
    }
  }

  /** The stream end of a failed I/O step: the timeout or cancel that aborted it, else the transport. */
  private failedEnd(): StreamEnd {
    if (this.timedOut !== null) return { kind: "timeout", which: this.timedOut };
    if (this.job.signal.aborted) return { kind: "cancelled", terminalState: cancelTerminalState(this.job.signal) };
    return { kind: "transport" };
  }

  private async exchange(): Promise<StreamEnd> {
    const { job } = this.job;
    const model = this.options.modelNames?.[job.model_id] ?? job.model_id;
    const fetchFn = this.options.fetch ?? fetch;
    const sent = await this.guarded(
      fetchFn(this.url, {
        method: "POST",
        headers: upstreamHeaders(this.options.apiKey),
        body: JSON.stringify(upstreamBody(job, model)),
        signal: this.controller.signal,
      }),
    );
    if (!sent.ok) return sent.end;
    const response = sent.value;
    this.status = response.status;
    if (!response.ok) return this.readError(response);
    const contentType = response.headers.get("content-type") ?? "";
    return contentType.includes("application/json") ? this.readCompletion(response) : this.readStream(response);
  }

  /** A non-2xx answer: rate limits, server errors, context overflow, unknown model… → its decline code. */
  private async readError(response: Response): Promise<StreamEnd> {
    const body = await this.guarded(readBounded(response, MAX_ERROR_BODY_BYTES));
    // An unreadable body still has a status worth classifying (e.g. 429 → queue_full).
    const payload = body.ok && body.value !== null ? parseJson(body.value) : undefined;
    return { kind: "upstream_error", code: declineCodeFor(response.status, payload) };
  }

  /** A complete `chat.completion` body, from an upstream that answered without streaming. */
  private async readCompletion(response: Response): Promise<StreamEnd> {
    const body = await this.guarded(readBounded(response, MAX_COMPLETION_BODY_BYTES));
    if (!body.ok) return body.end;
    if (body.value === null) return { kind: "malformed" };
    const payload = parseJson(body.value);
    if (payload === undefined) return { kind: "malformed" };
    return this.apply(this.mapper.completion(payload)) ?? { kind: "done" };
  }

  private async readStream(response: Response): Promise<StreamEnd> {
    if (!response.body) return { kind: "eof" };
    const reader = response.body.getReader();
    const decoder = new SseDecoder();
    for (;;) {
      // Not through guarded(): this runs per upstream read, and one await is enough.
      let read: Awaited<ReturnType<typeof reader.read>>;
      try {
        read = await reader.read();
      } catch {
        return this.failedEnd();
      }
      const events = read.done ? decoder.end() : decoder.push(read.value);
      for (const event of events) {
        const end = this.onEvent(event);
        if (end !== null) return end;
      }
      if (read.done) return { kind: "eof" };
      // Once output has started, every upstream payload restarts the idle clock: the payloads of one read
      // arrived together, so once per read is the same clock.
      if (this.payloadsInRead > 0 && this.relayedChunks > 0) this.arm("idle", this.options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS);
      this.payloadsInRead = 0;
    }
  }

  /** One SSE event; a stream end when it ends the stream, else null. */
  private onEvent(event: SseEvent): StreamEnd | null {
    if (event.type === "overflow") return { kind: "malformed" };
    // llama.cpp's legacy `error:` field line, or an `event: error` frame: an error, whatever its body.
    if (event.type === "error_field" || event.event === "error") {
      // The field's value is the error detail itself (`error: {"code":400,"message":…}`): wrap it.
      const parsed = parseJson(event.data);
      const payload = isErrorPayload(parsed) ? parsed : { error: parsed ?? event.data };
      return { kind: "upstream_error", code: declineCodeFor(200, payload) };
    }
    const data = event.data.trim();
    if (data === "") return null; // empty `data:` frames carry nothing
    if (data === "[DONE]") return { kind: "done" };
    this.payloadsInRead++;
    return this.apply(this.payloads(data));
  }

  /** Relays what a payload holds and records its finish and usage; a stream end for errors. */
  private apply(mapped: MappedPayload): StreamEnd | null {
    if (mapped.kind === "error") return { kind: "upstream_error", code: mapped.code };
    if (mapped.kind === "malformed") return { kind: "malformed" };
    if (mapped.promptTokens !== null) this.promptTokens = mapped.promptTokens;
    if (mapped.content !== undefined || mapped.tool_calls !== undefined) {
      const chunk: EngineChunk = { tokens: mapped.tokens };
      if (mapped.content !== undefined) chunk.content = mapped.content;
      if (mapped.tool_calls !== undefined) chunk.tool_calls = mapped.tool_calls;
      this.job.emit(chunk);
      this.relayedChunks++;
    }
    if (mapped.finishReason !== null) this.finishReason = mapped.finishReason;
    return null;
  }
}

/** The body as text, or null when it exceeds `maxBytes` (reading stops there). */
async function readBounded(response: Response, maxBytes: number): Promise<string | null> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      void reader.cancel().catch(() => {});
      return null;
    }
    parts.push(value);
  }
  return Buffer.concat(parts).toString("utf8");
}

/**
 * Creates the openai engine. Throws on an `upstream` that is not an http(s) URL (the CLI checks it
 * first and reports a usage error).
 */
export function createOpenAIEngine(options: OpenAIEngineOptions): Engine {
  const url = chatCompletionsUrl(options.upstream);
  if (url === null) throw new Error("upstream must be an http:// or https:// URL without query");
  return { name: "openai", run: (job) => new UpstreamCall(job, url, options).run() };
}
