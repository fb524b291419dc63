// Plumbing every entrypoint's responders share: a server-sent-event body that exists only from its
// first write (docs/buyer-api.md: nothing, not even the status line, before the first delta), and an
// accumulator of an attempt's output for responses written in one piece, and the responder built on it.
// Both report the body text they write to `record` (the retry-replay copy, src/http/idempotency.ts).
import type { ChunkFrame } from "../wire/frames.ts";
import type { ChatOutcome, ChatResponder } from "../chat/contract.ts";
import type { GatewayError } from "./errors.ts";

/** A facade's responder: the contract the gateway drives, failing with the HTTP layer's error values. */
/** An entrypoint's responder: its `prepare` returns the built response, which the pipeline keeps for retries. */
export type FacadeResponder = Omit<ChatResponder<GatewayError>, "prepare"> & { prepare?(outcome: ChatOutcome): Response | undefined };

/**
 * Body text written many times with only a middle part changing (a stream's content deltas): the
 * piece is `prefix + hole + suffix`. The replay copy keeps the prefix and suffix once instead of per
 * piece (about 200 bytes of a chat stream's ~220-byte delta event). One object per responder.
 */
export interface BodyTemplate {
  readonly prefix: string;
  readonly suffix: string;
}

/** Where a responder's body goes besides the buyer (the pipeline's ResponderContext has these). */
export interface BodyTarget {
  /** Headers every successful response carries. */
  headers: Record<string, string>;
  /** Called once when the buyer goes away before the response ended. */
  onBuyerGone: () => void;
  /** Gets every piece of body text, in order, exactly as the buyer is sent it. */
  record: (text: string) => void;
  /** Gets a templated piece, in the same order as `record`'s; absent: `record` gets its whole text. */
  recordFilled?: (template: BodyTemplate, hole: string) => void;
  /** Bounds on output waiting for a buyer that does not read; absent = unbounded. */
  flow?: StreamFlow;
}

/**
 * Backpressure on a stream (docs/reliability.md): output the buyer's socket has not taken waits in the
 * server's buffer; past `maxBufferedBytes`, or blocked longer than `stallMs`, the buyer counts as gone
 * (`onBuyerGone`: the attempt is cancelled), so a buyer that never reads costs a bounded buffer.
 */
export interface StreamFlow {
  maxBufferedBytes: number;
  stallMs: number;
  now: () => number;
  /** Told once, before `onBuyerGone`, why the stream was given up. */
  onStalled: (why: "buffer_full" | "stalled") => void;
}

export interface LazyEventStream {
  /** Resolves with the 200 SSE response at the first `write`, or with what `settle` is given. */
  readonly response: Promise<Response>;
  readonly started: boolean;
  readonly ended: boolean;
  /** Sends one or more whole events; ignored once the stream ended. */
  write(text: string): void;
  /** Sends `template.prefix + hole + template.suffix` (whole events), as `write` would. */
  writeFilled(template: BodyTemplate, hole: string): void;
  /** What the socket has not taken yet: see ChatResponder.unsent. */
  unsent(): Promise<void> | null;
  end(): void;
  /** Answers with a whole response instead (only before the first write; no-op after). */
  settle(response: Response): void;
}

/**
 * The SSE body as a Bun direct stream: strings go straight into the HTTP response's buffer (no
 * TextEncoder, no queue of chunks, no pull per chunk), and Bun sends what one turn wrote when that turn
 * ends, so an event never waits for a later one. Bun calls `cancel` when the buyer hangs up.
 */
export function lazyEventStream(target: BodyTarget): LazyEventStream {
  return new EventStream(target);
}

/**
 * One per live stream, so a class: its methods are shared, where a closure-built object costs
 * every stream a function and a slot per method (and getter) and their scope. It is its own direct
 * stream's underlying source (`type`, `pull`, `cancel`).
 */
class EventStream implements LazyEventStream, Bun.DirectUnderlyingSource<string> {
  readonly type = "direct";
  readonly response: Promise<Response>;
  started = false;
  ended = false;
  private resolve!: (r: Response) => void;
  // The controller exists only once the response is being sent (the server asks after the handler
  // resolved, a turn after the first write at the earliest); text written before waits in `pending`.
  private sink: ReadableStreamDirectController | null = null;
  private pending = "";
  /** Bytes written since the sink last had room (it answers a write with a promise while full). */
  private unsentBytes = 0;
  private blockedSince: number | null = null;
  private lastBlockedWrite: Promise<unknown> | null = null;

  constructor(private readonly target: BodyTarget) {
    this.response = new Promise<Response>((r) => (this.resolve = r));
  }

  write(text: string): void {
    if (!this.started) this.start();
    if (this.ended) return;
    this.target.record(text);
    this.send(text);
  }

  writeFilled(template: BodyTemplate, hole: string): void {
    if (!this.started) this.start();
    if (this.ended) return;
    const text = template.prefix + hole + template.suffix;
    if (this.target.recordFilled) this.target.recordFilled(template, hole);
    else this.target.record(text);
    this.send(text);
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    try {
      this.sink?.close();
    } catch {}
  }

  settle(whole: Response): void {
    if (this.started) return;
    this.started = true;
    this.ended = true;
    this.resolve(whole);
  }

  unsent(): Promise<void> | null {
    const blocked = this.lastBlockedWrite;
    const flow = this.target.flow;
    if (blocked === null || flow === undefined) return null;
    // A buyer that does not read is given up at the stall bound: its output counts as sent then, as it
    // does when the bound ends the stream (the buyer-gone path).
    const left = Math.max(0, flow.stallMs - (flow.now() - (this.blockedSince ?? flow.now())));
    return new Promise<void>((resolve) => {
      const bound = setTimeout(resolve, left);
      bound.unref?.();
      const done = () => {
        clearTimeout(bound);
        resolve();
      };
      void blocked.then(done, done);
    });
  }

  /** The direct stream's pull: Bun hands over the response's sink. */
  pull(controller: ReadableStreamDirectController): void {
    this.sink = controller;
    if (this.pending !== "") {
      controller.write(this.pending);
      this.pending = "";
    }
    if (this.ended) controller.close();
  }

  /** The direct stream's cancel: the buyer hung up. */
  cancel(): void {
    if (this.ended) return;
    this.ended = true;
    this.target.onBuyerGone();
  }

  private send(text: string): void {
    if (!this.sink) {
      this.pending += text;
      return;
    }
    let wrote: number | Promise<number>;
    try {
      wrote = this.sink.write(text) as number | Promise<number>;
    } catch {
      this.ended = true; // The buyer is gone; the abort path handles the rest.
      return;
    }
    const flow = this.target.flow;
    if (flow === undefined) return;
    if (typeof wrote === "number") {
      this.unsentBytes = 0;
      this.blockedSince = null;
      this.lastBlockedWrite = null;
      return;
    }
    this.noteBlocked(flow, text, wrote);
  }

  /** The sink is full: counts what waits in it and gives the buyer up past the bounds. */
  private noteBlocked(flow: StreamFlow, text: string, wrote: Promise<number>): void {
    this.unsentBytes += Buffer.byteLength(text, "utf8");
    const now = flow.now();
    this.blockedSince ??= now;
    this.lastBlockedWrite = wrote;
    wrote.then(
      () => {
        if (this.lastBlockedWrite !== wrote) return;
        this.unsentBytes = 0;
        this.blockedSince = null;
        this.lastBlockedWrite = null;
      },
      () => {},
    );
    const why = this.unsentBytes > flow.maxBufferedBytes ? "buffer_full" : now - this.blockedSince > flow.stallMs ? "stalled" : null;
    if (why === null) return;
    this.ended = true;
    flow.onStalled(why);
    this.target.onBuyerGone();
  }

  private start(): void {
    this.started = true;
    const body = new ReadableStream(this);
    this.resolve(
      new Response(body, {
        status: 200,
        headers: { ...this.target.headers, "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-accel-buffering": "no" },
      }),
    );
  }
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
  record: (text: string) => void;
  render: (output: OutputCollector, outcome: ChatOutcome) => unknown;
  refuse: (error: GatewayError) => Response;
}): FacadeResponder {
  let resolve!: (r: Response) => void;
  const response = new Promise<Response>((r) => (resolve = r));
  const collected = new OutputCollector();
  let done = false;
  // The response built by `prepare` (or `succeed`), once: it is recorded once and sent as built.
  let prepared: Response | undefined;
  const prepare = (outcome: ChatOutcome): Response => {
    if (prepared !== undefined) return prepared;
    const body = JSON.stringify(o.render(collected, outcome));
    o.record(body);
    prepared = new Response(body, { status: 200, headers: { ...o.headers, "content-type": "application/json" } });
    return prepared;
  };
  return {
    response,
    relay: (frame) => collected.add(frame),
    discard: () => collected.reset(),
    prepare: (outcome) => (done ? undefined : prepare(outcome)),
    succeed(outcome) {
      if (done) return;
      done = true;
      resolve(prepare(outcome));
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
