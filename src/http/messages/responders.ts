// Writing a chat-pipeline result as the messages facade's wire shape: one message object, or SSE where
// every event has an `event:` line. Like chat completions, nothing is written before the first delta
// (docs/buyer-api.md), so failover before it stays invisible; a failure after it is an `event: error` with no
// message_stop.
import { messagesErrorEnvelope, messagesErrorResponse, type GatewayError } from "../errors.ts";
import type { ChatOutcome } from "../../chat/contract.ts";
import { bufferedJsonResponder, lazyEventStream, type FacadeResponder } from "../output.ts";
import { ToolCallStarts } from "../toolCallStarts.ts";
import type { ResponderContext } from "../pipeline.ts";
import { stopReason } from "./translate.ts";

export interface MessagesResponderOptions {
  context: ResponderContext;
  model: string;
}

/** `msg_` + the hex of the gateway's request id, so the message id names the request. */
export const messageId = (requestId: string) => `msg_${requestId.replace(/^req_/, "")}`;
const toolUseId = (requestId: string, i: number) => `toolu_${requestId.replace(/^req_/, "")}_${i}`;

const sse = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;

/** A tool call's arguments as the tool_use input object; {} when they are not a JSON object. */
function inputObject(args: string): Record<string, unknown> {
  try {
    const parsed: unknown = JSON.parse(args === "" ? "{}" : args);
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

export function messagesStreamResponder(o: MessagesResponderOptions): FacadeResponder {
  const { ids } = o.context;
  const out = lazyEventStream(o.context);
  const id = messageId(ids.requestId);
  let blocks = 0;
  let open: { kind: "text" } | { kind: "tool"; providerIndex: number } | null = null;
  const toolBlocks = new Map<number, number>();

  const begin = () => {
    if (out.started) return;
    out.write(
      sse("message_start", {
        type: "message_start",
        message: {
          id,
          type: "message",
          role: "assistant",
          model: o.model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          // Input tokens are known only at the end (from the provider); message_delta carries both.
          usage: { input_tokens: 0, output_tokens: 0 },
        },
      }),
    );
    out.write(sse("ping", { type: "ping" }));
  };
  const closeBlock = () => {
    if (!open) return;
    out.write(sse("content_block_stop", { type: "content_block_stop", index: blocks - 1 }));
    open = null;
  };
  const openBlock = (block: Record<string, unknown>) => {
    closeBlock();
    out.write(sse("content_block_start", { type: "content_block_start", index: blocks, content_block: block }));
    blocks++;
  };

  // A tool_use block names its tool when it starts: it starts once the name's fragments are all in.
  const calls = new ToolCallStarts((call) => {
    toolBlocks.set(call.index, blocks);
    openBlock({ type: "tool_use", id: call.id ?? toolUseId(ids.requestId, call.index), name: call.name, input: {} });
    open = { kind: "tool", providerIndex: call.index };
  });

  return {
    response: out.response,
    unsent: () => out.unsent(),
    relay(frame) {
      begin();
      if (frame.content !== undefined && frame.content !== "") {
        calls.flush();
        if (open?.kind !== "text") {
          openBlock({ type: "text", text: "" });
          open = { kind: "text" };
        }
        out.write(sse("content_block_delta", { type: "content_block_delta", index: blocks - 1, delta: { type: "text_delta", text: frame.content } }));
      }
      for (const call of frame.tool_calls ?? []) {
        const partial = calls.take(call);
        if (partial === undefined) continue;
        // A delta for an earlier call still names that call's block (providers rarely interleave).
        const index = toolBlocks.get(call.index)!;
        out.write(sse("content_block_delta", { type: "content_block_delta", index, delta: { type: "input_json_delta", partial_json: partial } }));
      }
    },
    discard() {},
    succeed({ finishReason, usage }: ChatOutcome) {
      begin();
      calls.flush();
      closeBlock();
      out.write(
        sse("message_delta", {
          type: "message_delta",
          delta: { stop_reason: stopReason(finishReason), stop_sequence: null },
          usage: { input_tokens: usage.prompt_tokens, output_tokens: usage.completion_tokens },
        }),
      );
      out.write(sse("message_stop", { type: "message_stop" }));
      out.end();
    },
    fail(error: GatewayError) {
      if (!out.started) {
        out.settle(messagesErrorResponse(error, ids.responseRequestId));
        return;
      }
      this.failMidStream(error);
    },
    failMidStream(error: GatewayError) {
      calls.flush();
      out.write(sse("error", messagesErrorEnvelope(error)));
      out.end();
    },
  };
}

/** One message object, written only when the whole result is known. */
export function messagesJsonResponder(o: MessagesResponderOptions): FacadeResponder {
  const { ids, headers, record } = o.context;
  return bufferedJsonResponder({
    headers,
    record,
    refuse: (error) => messagesErrorResponse(error, ids.responseRequestId),
    render: (collected, { finishReason, usage }) => {
      const content: Record<string, unknown>[] = [];
      if (collected.text !== "") content.push({ type: "text", text: collected.text });
      collected.toolCalls().forEach((call, i) => {
        content.push({ type: "tool_use", id: call.id ?? toolUseId(ids.requestId, i), name: call.name, input: inputObject(call.arguments) });
      });
      return {
        id: messageId(ids.requestId),
        type: "message",
        role: "assistant",
        model: o.model,
        content,
        stop_reason: stopReason(finishReason),
        stop_sequence: null,
        usage: { input_tokens: usage.prompt_tokens, output_tokens: usage.completion_tokens },
      };
    },
  });
}
