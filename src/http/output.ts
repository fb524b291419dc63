// Plumbing the facades' responders share: a server-sent-event body that exists only from its first
// write (DESIGN §7: nothing, not even the status line, before the first delta), and an accumulator
// of an attempt's output for responses written in one piece.
import type { ChunkFrame } from "../wire/frames.ts";

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
