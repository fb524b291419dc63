// A simulated buyer: one chat-completions request through the gateway's real HTTP handler (what
// Bun.serve would call), read to its end — or abandoned: aborted at a random moment, or cut when the
// gateway process dies (a connection reset).
import type { Trace } from "./trace.ts";

export interface BuyerSpec {
  name: string;
  apiKey: string;
  model: string;
  stream: boolean;
  maxTokens: number;
  prompt: string;
  /** Abort after this many ms, or never. */
  abortAfterMs: number | null;
}

export interface BuyerResult {
  /** The gateway's request id (X-Request-ID), once headers came. */
  requestId: string | null;
  status: number | null;
  /** Content bytes the buyer received (sum of deltas, or the whole message). */
  contentBytes: number;
  /** A stream ended with [DONE], or a whole JSON body was read. */
  completed: boolean;
  /** The error code of an error status or of an in-band error event. */
  errorCode: string | null;
  aborted: boolean;
  /** Cut by a gateway crash (the connection reset). */
  reset: boolean;
  startedAt: number;
  endedAt: number | null;
}

type Fetch = (request: Request) => Promise<Response | undefined>;

export class SimBuyer {
  readonly result: BuyerResult;
  private readonly controller = new AbortController();
  private reader: { read(): Promise<{ done: boolean; value?: Uint8Array | string }>; cancel(): Promise<void> } | null = null;
  /** The incarnation of the gateway this request went to. */
  incarnation = 0;

  constructor(
    readonly spec: BuyerSpec,
    private readonly trace: Trace,
    private readonly now: () => number,
  ) {
    this.result = { requestId: null, status: null, contentBytes: 0, completed: false, errorCode: null, aborted: false, reset: false, startedAt: now(), endedAt: null };
  }

  get ended(): boolean {
    return this.result.endedAt !== null;
  }

  private end(why: string): void {
    if (this.ended) return;
    this.result.endedAt = this.now();
    this.trace.add(`${this.spec.name} ends: ${why} (status ${this.result.status ?? "-"}, ${this.result.contentBytes} bytes${this.result.errorCode ? `, ${this.result.errorCode}` : ""})`);
  }

  /** Sends the request and reads the answer to its end. */
  async run(fetch: Fetch): Promise<void> {
    const { spec } = this;
    this.trace.add(`${spec.name} sends (${spec.stream ? "stream" : "whole"}, max_tokens ${spec.maxTokens}${spec.abortAfterMs !== null ? `, aborts at +${spec.abortAfterMs}` : ""})`);
    const body = JSON.stringify({ model: spec.model, stream: spec.stream, max_tokens: spec.maxTokens, messages: [{ role: "user", content: spec.prompt }] });
    const request = new Request("http://gateway.sim/v1/chat/completions", {
      method: "POST",
      headers: { authorization: `Bearer ${spec.apiKey}`, "content-type": "application/json", "content-length": String(Buffer.byteLength(body)) },
      body,
      signal: this.controller.signal,
    });
    let response: Response | undefined;
    try {
      response = await fetch(request);
    } catch (e) {
      if (!this.ended) this.end(`fetch threw ${String(e)}`);
      return;
    }
    if (this.ended) return;
    if (!response) return this.end("no response");
    this.result.status = response.status;
    this.result.requestId = response.headers.get("x-request-id");
    const contentType = response.headers.get("content-type") ?? "";
    if (!contentType.startsWith("text/event-stream")) {
      const text = await this.readAll(response);
      if (text === null || this.ended) return;
      try {
        const json = JSON.parse(text) as { error?: { code?: string }; choices?: { message?: { content?: string | null } }[] };
        if (json.error) this.result.errorCode = json.error.code ?? "unknown";
        else {
          this.result.contentBytes = Buffer.byteLength(json.choices?.[0]?.message?.content ?? "", "utf8");
          this.result.completed = response.status === 200;
        }
      } catch {
        this.result.errorCode = "unparsable_body";
      }
      return this.end("body read");
    }
    await this.readStream(response);
  }

  private async readAll(response: Response): Promise<string | null> {
    const chunks: Uint8Array[] = [];
    const reader = (this.reader = response.body!.getReader());
    for (;;) {
      let next: { done: boolean; value?: Uint8Array | string };
      try {
        next = await reader.read();
      } catch {
        if (!this.ended) this.end("body read failed");
        return null;
      }
      if (this.ended) return null;
      if (next.done) break;
      chunks.push(typeof next.value === "string" ? Buffer.from(next.value) : next.value!);
    }
    return Buffer.concat(chunks).toString("utf8");
  }

  private async readStream(response: Response): Promise<void> {
    const reader = (this.reader = response.body!.getReader());
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      let next: { done: boolean; value?: Uint8Array | string };
      try {
        next = await reader.read();
      } catch {
        if (!this.ended) this.end("stream read failed");
        return;
      }
      if (this.ended) return;
      if (next.done) break;
      buffered += typeof next.value === "string" ? next.value : decoder.decode(next.value, { stream: true });
      let cut: number;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, cut);
        buffered = buffered.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") {
            this.result.completed = true;
            continue;
          }
          try {
            const json = JSON.parse(data) as { error?: { code?: string }; choices?: { delta?: { content?: string } }[] };
            if (json.error) this.result.errorCode = json.error.code ?? "unknown";
            const content = json.choices?.[0]?.delta?.content;
            if (content) this.result.contentBytes += Buffer.byteLength(content, "utf8");
          } catch {
            this.result.errorCode = "unparsable_event";
          }
        }
      }
    }
    this.end(this.result.completed ? "stream done" : "stream closed");
  }

  /** The buyer hangs up: aborts the request and cancels the body it was reading. */
  abort(): void {
    if (this.ended) return;
    this.result.aborted = true;
    this.end("aborted");
    this.controller.abort();
    void this.reader?.cancel().catch(() => {});
  }

  /** The gateway process died: the connection is gone (nothing more reaches the dead process). */
  reset(): void {
    if (this.ended) return;
    this.result.reset = true;
    this.end("connection reset (gateway crashed)");
  }
}
