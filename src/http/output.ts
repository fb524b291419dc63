// Plumbing the facades' responders share: a server-sent-event body that exists only from its first
// write (DESIGN §7: nothing, not even the status line, before the first delta), and an accumulator
// of an attempt's output for responses written in one piece, and the responder built on it.
import type { ChunkFrame } from "../wire/frames.ts";
import type { ChatOutcome, ChatResponder } from "./chat/responders.ts";
import type { GatewayError } from "./errors.ts";

const encoder = new TextEncoder();

export interface LazyEventStream {
  /** Resolves with the 200 SSE response at the first `write`, or with what `settle` is given. */
  readonly response: Promise<Response>;
  readonly started: boolean;
  readonly ended: boolean;
  write(text: string): void;
  end(): void;
  /** Answers with a whole response instead (only before the first write; no-op after). */
  settle(response: Response): void;
}

export function lazyEventStream(headers: Record<string, string>, onBuyerGone: () => void): LazyEventStream {
  let resolve!: (r: Response) => void;
  const response = new Promise<Response>((r) => (resolve = r));
  let controller: ReadableStreamDefaultController<Uint8Array> | null = null;
  let started = false;
  let ended = false;

  const start = () => {
    started = true;
    const stream = new ReadableStream<Uint8Array>({
      start: (c) => {
        controller = c;
      },
      cancel: () => {
        if (!ended) {
          ended = true;
          onBuyerGone();
        }
      },
    });
    resolve(
      new Response(stream, {
        status: 200,
        headers: { ...headers, "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-accel-buffering": "no" },
      }),
    );
  };

  return {
    response,
    get started() {
      return started;
    },
    get ended() {
      return ended;
    },
    write(text) {
      if (!started) start();
      if (ended || !controller) return;
      try {
        controller.enqueue(encoder.encode(text));
      } catch {
        ended = true; // The buyer is gone; the abort path handles the rest.
      }
    },
    end() {
      if (ended) return;
      ended = true;
      try {
        controller?.close();
      } catch {}
    },
    settle(whole) {
      if (started) return;
      started = true;
      ended = true;
      resolve(whole);
    },
  };
}

export interface CollectedToolCall {
  id?: string;
  name: string;
  arguments: string;
}

/** An attempt's whole output: text and tool calls (by the provider's index), as relayed. */
export class OutputCollector {
  text = "";
  private calls: CollectedToolCall[] = [];

  add(frame: ChunkFrame): void {
    if (frame.content !== undefined) this.text += frame.content;
    for (const c of frame.tool_calls ?? []) {
      const call = (this.calls[c.index] ??= { name: "", arguments: "" });
      if (c.id !== undefined) call.id = c.id;
      if (c.name !== undefined) call.name += c.name;
      if (c.arguments !== undefined) call.arguments += c.arguments;
    }
  }

  reset(): void {
    this.text = "";
    this.calls = [];
  }

  /** Tool calls in index order, holes (indices never sent) dropped. */
  toolCalls(): CollectedToolCall[] {
    return this.calls.filter(Boolean);
  }
}

/**
 * The responder of every non-streaming entrypoint: it buffers the attempt's output (dropped again on
 * failover) and writes one JSON body when the whole result is known; nothing reaches the buyer
 * before. `render` builds the entrypoint's body, `refuse` its error envelope.
 */
export function bufferedJsonResponder(o: {
  headers: Record<string, string>;
  render: (output: OutputCollector, outcome: ChatOutcome) => unknown;
  refuse: (error: GatewayError) => Response;
}): ChatResponder {
  let resolve!: (r: Response) => void;
  const response = new Promise<Response>((r) => (resolve = r));
  const collected = new OutputCollector();
  let done = false;
  return {
    response,
    relay: (frame) => collected.add(frame),
    discard: () => collected.reset(),
    succeed(outcome) {
      if (done) return;
      done = true;
      const body = o.render(collected, outcome);
      resolve(new Response(JSON.stringify(body), { status: 200, headers: { ...o.headers, "content-type": "application/json" } }));
    },
    fail(error) {
      if (done) return;
      done = true;
      resolve(o.refuse(error));
    },
    // Nothing was written yet, so a failure after output is still a plain error response.
    failMidStream(error) {
      this.fail(error);
    },
  };
}
