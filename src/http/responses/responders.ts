// Writing a chat-pipeline result as the responses facade's wire shape: one response object, or SSE
// events carrying `type` and `sequence_number`. Nothing is written before the first delta
// (docs/buyer-api.md); a failure after it is a `response.failed` event (error code
// provider_disconnected) and the end.
import { errorEnvelope, errorResponse, type GatewayError } from "../errors.ts";
import type { ChatOutcome, ChatUsage } from "../../chat/contract.ts";
import { bufferedJsonResponder, lazyEventStream, type FacadeResponder } from "../output.ts";
import { ToolCallStarts } from "../toolCallStarts.ts";
import type { ResponderContext } from "../pipeline.ts";
import type { ResponseEcho } from "./translate.ts";

export interface ResponsesResponderOptions {
  context: ResponderContext;
  model: string;
  echo: ResponseEcho;
}

type ItemStatus = "in_progress" | "completed" | "incomplete";

/** An output item being built: a message (one output_text part) or a function call. */
type ItemState =
  | { kind: "message"; id: string; text: string }
  | { kind: "function_call"; id: string; callId: string; name: string; arguments: string };

const hexOf = (requestId: string) => requestId.replace(/^req_/, "");
export const responseId = (requestId: string) => `resp_${hexOf(requestId)}`;
/** The n-th message item of a response: `msg_<hex>`, then `msg_<hex>_<n>`. */
const messageItemId = (requestId: string, n: number) => (n === 0 ? `msg_${hexOf(requestId)}` : `msg_${hexOf(requestId)}_${n}`);
const functionCallItemId = (requestId: string, i: number) => `fc_${hexOf(requestId)}_${i}`;
const fallbackCallId = (requestId: string, i: number) => `call_${hexOf(requestId)}_${i}`;

const outputText = (text: string) => ({ type: "output_text", text, annotations: [], logprobs: [] });

function toItem(s: ItemState, status: ItemStatus, withContent = true): Record<string, unknown> {
  if (s.kind === "message") {
    return { id: s.id, type: "message", status, role: "assistant", content: withContent ? [outputText(s.text)] : [] };
  }
  return { id: s.id, type: "function_call", status, call_id: s.callId, name: s.name, arguments: s.arguments };
}

/** completed, or incomplete with its reason, from the chat finish_reason. */
function finalStatus(finishReason: string): { status: "completed" | "incomplete"; incomplete_details: { reason: string } | null } {
  if (finishReason === "length") return { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } };
  if (finishReason === "content_filter") return { status: "incomplete", incomplete_details: { reason: "content_filter" } };
  return { status: "completed", incomplete_details: null };
}

const usageObject = (u: ChatUsage) => ({
  input_tokens: u.prompt_tokens,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: u.completion_tokens,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: u.prompt_tokens + u.completion_tokens,
});

interface ResponseFields {
  status: "in_progress" | "completed" | "incomplete" | "failed";
  output: Record<string, unknown>[];
  usage: ChatUsage | null;
  error?: { code: string; message: string } | null;
  incomplete_details?: { reason: string } | null;
}

function responseObject(o: ResponsesResponderOptions, f: ResponseFields) {
  const { echo } = o;
  return {
    id: responseId(o.context.ids.requestId),
    object: "response",
    created_at: o.context.created,
    status: f.status,
    background: false,
    error: f.error ?? null,
    incomplete_details: f.incomplete_details ?? null,
    instructions: echo.instructions,
    max_output_tokens: echo.max_output_tokens,
    model: o.model,
    output: f.output,
    parallel_tool_calls: echo.parallel_tool_calls,
    previous_response_id: null,
    reasoning: { effort: null, summary: null },
    store: false,
    temperature: echo.temperature,
    text: echo.text,
    tool_choice: echo.tool_choice,
    tools: echo.tools,
    top_p: echo.top_p,
    truncation: "disabled",
    usage: f.usage ? usageObject(f.usage) : null,
    metadata: echo.metadata,
  };
}

export function responsesStreamResponder(o: ResponsesResponderOptions): FacadeResponder {
  const { ids } = o.context;
  const out = lazyEventStream(o.context);
  const items: ItemState[] = [];
  /** Index in `items` of the item receiving deltas, or -1. */
  let open = -1;
  let messages = 0;
  const callItems = new Map<number, number>();
  let sequence = 0;

  const emit = (type: string, fields: Record<string, unknown>) => {
    out.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...fields })}\n\n`);
  };
  const begin = () => {
    if (out.started) return;
    const response = responseObject(o, { status: "in_progress", output: [], usage: null });
    emit("response.created", { response });
    emit("response.in_progress", { response });
  };
  const closeOpen = (status: ItemStatus) => {
    if (open < 0) return;
    const s = items[open]!;
    const at = { item_id: s.id, output_index: open };
    if (s.kind === "message") {
      emit("response.output_text.done", { ...at, content_index: 0, text: s.text, logprobs: [] });
      emit("response.content_part.done", { ...at, content_index: 0, part: outputText(s.text) });
    } else {
      emit("response.function_call_arguments.done", { ...at, name: s.name, arguments: s.arguments });
    }
    emit("response.output_item.done", { output_index: open, item: toItem(s, status) });
    open = -1;
  };
  const openItem = (s: ItemState): number => {
    closeOpen("completed");
    items.push(s);
    open = items.length - 1;
    emit("response.output_item.added", { output_index: open, item: toItem(s, "in_progress", false) });
    return open;
  };

  // A function_call item names its function when it is added: it is added once the name is complete.
  const calls = new ToolCallStarts((call) => {
    const index = openItem({
      kind: "function_call",
      id: functionCallItemId(ids.requestId, call.index),
      callId: call.id ?? fallbackCallId(ids.requestId, call.index),
      name: call.name,
      arguments: "",
    });
    callItems.set(call.index, index);
  });

  return {
    response: out.response,
    unsent: () => out.unsent(),
    relay(frame) {
      begin();
      if (frame.content !== undefined && frame.content !== "") {
        calls.flush();
        if (open < 0 || items[open]!.kind !== "message") {
          const index = openItem({ kind: "message", id: messageItemId(ids.requestId, messages++), text: "" });
          emit("response.content_part.added", { item_id: items[index]!.id, output_index: index, content_index: 0, part: outputText("") });
        }
        const s = items[open] as Extract<ItemState, { kind: "message" }>;
        s.text += frame.content;
        emit("response.output_text.delta", { item_id: s.id, output_index: open, content_index: 0, delta: frame.content, logprobs: [] });
      }
      for (const call of frame.tool_calls ?? []) {
        const partial = calls.take(call);
        if (partial === undefined) continue;
        const index = callItems.get(call.index)!;
        const s = items[index] as Extract<ItemState, { kind: "function_call" }>;
        s.arguments += partial;
        emit("response.function_call_arguments.delta", { item_id: s.id, output_index: index, delta: partial });
      }
    },
    discard() {},
    succeed({ finishReason, usage }: ChatOutcome) {
      begin();
      calls.flush();
      const { status, incomplete_details } = finalStatus(finishReason);
      const itemStatus = status === "completed" ? "completed" : "incomplete";
      closeOpen(itemStatus);
      const output = items.map((s) => toItem(s, itemStatus));
      emit(`response.${status}`, { response: responseObject(o, { status, output, usage, incomplete_details }) });
      out.end();
    },
    fail(error: GatewayError) {
      if (!out.started) {
        out.settle(errorResponse(error, ids.responseRequestId));
        return;
      }
      this.failMidStream(error);
    },
    failMidStream(error: GatewayError) {
      calls.flush();
      const { code, message } = errorEnvelope(error).error;
      const output = items.map((s) => toItem(s, "incomplete"));
      emit("response.failed", { response: responseObject(o, { status: "failed", output, usage: null, error: { code, message } }) });
      out.end();
    },
  };
}

/** One response object, written only when the whole result is known. */
export function responsesJsonResponder(o: ResponsesResponderOptions): FacadeResponder {
  const { ids, headers, record } = o.context;
  return bufferedJsonResponder({
    headers,
    record,
    refuse: (error) => errorResponse(error, ids.responseRequestId),
    render: (collected, { finishReason, usage }) => {
      const { status, incomplete_details } = finalStatus(finishReason);
      const itemStatus = status === "completed" ? "completed" : "incomplete";
      const calls = collected.toolCalls();
      const items: ItemState[] = [];
      if (collected.text !== "" || calls.length === 0) items.push({ kind: "message", id: messageItemId(ids.requestId, 0), text: collected.text });
      calls.forEach((call, i) =>
        items.push({
          kind: "function_call",
          id: functionCallItemId(ids.requestId, i),
          callId: call.id ?? fallbackCallId(ids.requestId, i),
          name: call.name,
          arguments: call.arguments,
        }),
      );
      return responseObject(o, { status, output: items.map((s) => toItem(s, itemStatus)), usage, incomplete_details });
    },
  });
}
