// Writing a chat completion to the buyer, as SSE or as one JSON body. Nothing — not even the status
// line — is produced before the first delta (streaming) or the whole result (JSON), so failover before
// that point is invisible (docs/buyer-api.md).
import { errorResponse, inBandErrorFrame, type GatewayError } from "../errors.ts";
import type { ChunkFrame, ToolCallDelta } from "../../wire/frames.ts";
import type { ChatOutcome, ChatUsage } from "../../chat/contract.ts";
import { bufferedJsonResponder, lazyEventStream, type BodyTemplate, type FacadeResponder, type LazyEventStream, type StreamFlow } from "../output.ts";


export interface ResponderOptions {
  completionId: string;
  model: string;
  created: number;
  includeUsage: boolean;
  headers: Record<string, string>;
  /** Called when the buyer goes away before the response ended. */
  onBuyerGone: () => void;
  /** Gets the body text as written (the retry-replay copy). */
  record: (text: string) => void;
  /** The same for the templated content deltas. */
  recordFilled?: (template: BodyTemplate, hole: string) => void;
  /** Backpressure bounds for the stream. */
  flow?: StreamFlow;
  requestId: string;
}

const usageObject = (u: ChatUsage) => ({
  prompt_tokens: u.prompt_tokens,
  completion_tokens: u.completion_tokens,
  total_tokens: u.prompt_tokens + u.completion_tokens,
});

const toolCallDeltas = (calls: ToolCallDelta[]) =>
  calls.map((c) => {
    const out: Record<string, unknown> = { index: c.index };
    if (c.id !== undefined) out.id = c.id;
    if (c.id !== undefined || c.name !== undefined) out.type = "function";
    const fn: Record<string, string> = {};
    if (c.name !== undefined) fn.name = c.name;
    if (c.arguments !== undefined) fn.arguments = c.arguments;
    out.function = fn;
    return out;
  });

/** SSE: `data: {chunk}` per delta, a finish chunk, an optional usage chunk, then `[DONE]`. */
export function streamingResponder(o: ResponderOptions): FacadeResponder {
  return new ChatStreamResponder(o);
}

/** One per live stream, so a class: its methods are shared instead of closures made per stream. */
class ChatStreamResponder implements FacadeResponder {
  private readonly out: LazyEventStream;
  private sentRole = false;
  /** Everything but the choices is the same on every chunk: built once. */
  private readonly head: string;
  /** A content-only delta after the first: all but the content's JSON is the same on every one. */
  private readonly contentDelta: BodyTemplate;

  constructor(private readonly o: ResponderOptions) {
    this.out = lazyEventStream(o);
    this.head = `data: {"id":${JSON.stringify(o.completionId)},"object":"chat.completion.chunk","created":${o.created},"model":${JSON.stringify(o.model)},"choices":`;
    this.contentDelta = { prefix: `${this.head}[{"index":0,"delta":{"content":`, suffix: `},"logprobs":null,"finish_reason":null}]}\n\n` };
  }

  get response(): Promise<Response> {
    return this.out.response;
  }

  private delta(d: Record<string, unknown>, finishReason: string | null): string {
    if (!this.sentRole) {
      d = { role: "assistant", ...d };
      this.sentRole = true;
    }
    return `${this.head}[{"index":0,"delta":${JSON.stringify(d)},"logprobs":null,"finish_reason":${JSON.stringify(finishReason)}}]}\n\n`;
  }

  relay(frame: ChunkFrame): void {
    // Per-token fast path: a content-only delta after the first is written from the
    // template, byte-identical to the general path, without building and serialising an object.
    if (this.sentRole && frame.tool_calls === undefined && frame.content !== undefined) {
      this.out.writeFilled(this.contentDelta, JSON.stringify(frame.content));
      return;
    }
    const d: Record<string, unknown> = {};
    if (frame.content !== undefined) d.content = frame.content;
    if (frame.tool_calls !== undefined) d.tool_calls = toolCallDeltas(frame.tool_calls);
    this.out.write(this.delta(d, null));
  }

  discard(): void {}

  unsent(): Promise<void> | null {
    return this.out.unsent();
  }

  succeed({ finishReason, usage }: ChatOutcome): void {
    this.out.write(this.delta({}, finishReason));
    if (this.o.includeUsage) this.out.write(`${this.head}[],"usage":${JSON.stringify(usageObject(usage))}}\n\n`);
    this.out.write("data: [DONE]\n\n");
    this.out.end();
  }

  fail(error: GatewayError): void {
    if (!this.out.started) {
      this.out.settle(errorResponse(error, this.o.requestId));
      return;
    }
    this.failMidStream(error);
  }

  failMidStream(error: GatewayError): void {
    this.out.write(inBandErrorFrame(error));
    this.out.end();
  }
}

/** One JSON body, written only when the whole completion is known. */
export function jsonResponder(o: ResponderOptions): FacadeResponder {
  return bufferedJsonResponder({
    headers: o.headers,
    record: o.record,
    refuse: (error) => errorResponse(error, o.requestId),
    render: (output, { finishReason, usage }) => {
      const calls = output.toolCalls();
      const message: Record<string, unknown> = { role: "assistant", content: output.text.length > 0 || calls.length === 0 ? output.text : null };
      if (calls.length > 0) {
        message.tool_calls = calls.map((c, i) => ({
          id: c.id ?? `call_${o.completionId}_${i}`,
          type: "function",
          function: { name: c.name, arguments: c.arguments },
        }));
      }
      return {
        id: o.completionId,
        object: "chat.completion",
        created: o.created,
        model: o.model,
        choices: [{ index: 0, message, logprobs: null, finish_reason: finishReason }],
        usage: usageObject(usage),
      };
    },
  });
}
