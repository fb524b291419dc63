// The facades' responders driven directly with chunk frames: nothing before the first delta, mixed
// text and tool-call output as blocks/items, and the failure shapes before and after the first byte.
import { describe, expect, test } from "bun:test";
import { gatewayError } from "../../src/http/errors.ts";
import { messagesJsonResponder, messagesStreamResponder } from "../../src/http/messages/responders.ts";
import { responsesJsonResponder, responsesStreamResponder } from "../../src/http/responses/responders.ts";
import type { ResponseEcho } from "../../src/http/responses/translate.ts";
import type { ResponderContext } from "../../src/http/pipeline.ts";
import type { ChunkFrame, ToolCallDelta } from "../../src/wire/frames.ts";
import { parseSse } from "../facades/support.ts";

const requestId = "req_00112233445566778899aabb";
const context = (): ResponderContext => ({
  ids: { requestId, responseRequestId: requestId },
  created: 1_700_000_000,
  headers: { "x-request-id": requestId },
  onBuyerGone: () => {},
  record: () => {},
});
const echo: ResponseEcho = {
  instructions: null,
  max_output_tokens: null,
  temperature: null,
  top_p: null,
  tools: [],
  tool_choice: "auto",
  text: { format: { type: "text" } },
  parallel_tool_calls: true,
  metadata: {},
};

let seq = 0;
const chunk = (content?: string, tool_calls?: ToolCallDelta[]): ChunkFrame => ({
  type: "chunk",
  request_id: requestId,
  attempt_n: 0,
  seq: seq++,
  tokens: 1,
  ...(content !== undefined ? { content } : {}),
  ...(tool_calls ? { tool_calls } : {}),
});
/** Text, then a tool call whose name and id come first and arguments in two pieces. */
const mixed = [
  chunk("Let me "),
  chunk("check."),
  chunk(undefined, [{ index: 0, id: "call_1", name: "get_weather", arguments: "" }]),
  chunk(undefined, [{ index: 0, arguments: '{"city":' }]),
  chunk(undefined, [{ index: 0, arguments: '"Oslo"}' }]),
];
const outcome = { finishReason: "tool_calls", usage: { prompt_tokens: 7, completion_tokens: 5 } };

/** Whether the response promise has settled once everything already queued has run. */
const settled = async (p: Promise<Response>) => {
  await new Promise((resolve) => setImmediate(resolve));
  return Bun.peek.status(p) !== "pending";
};

describe("messages responders", () => {
  test("streaming: nothing before the first delta, then text and tool_use blocks in order", async () => {
    const r = messagesStreamResponder({ context: context(), model: "m" });
    expect(await settled(r.response)).toBe(false);
    for (const frame of mixed) r.relay(frame);
    r.succeed(outcome);
    const events = parseSse(await (await r.response).text()).map((e) => JSON.parse(e.data));
    expect(events.map((e) => e.type)).toEqual([
      "message_start",
      "ping",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(events[0].message).toMatchObject({ id: "msg_00112233445566778899aabb", model: "m", content: [] });
    expect(events[6]).toEqual({ type: "content_block_start", index: 1, content_block: { type: "tool_use", id: "call_1", name: "get_weather", input: {} } });
    expect(events[8]).toEqual({ type: "content_block_delta", index: 1, delta: { type: "input_json_delta", partial_json: '"Oslo"}' } });
    expect(events[10]).toEqual({ type: "message_delta", delta: { stop_reason: "tool_use", stop_sequence: null }, usage: { input_tokens: 7, output_tokens: 5 } });
  });

  test("streaming: failure before the first delta is a whole messages-envelope response", async () => {
    const r = messagesStreamResponder({ context: context(), model: "m" });
    r.fail(gatewayError("coordinator_unavailable", "No provider.", { retryAfterSeconds: 1 }));
    const res = await r.response;
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await res.json()).toMatchObject({ type: "error", error: { type: "service_unavailable", code: "coordinator_unavailable", retryable: true } });
  });

  test("JSON: a message with a text block and a tool_use block; a failed attempt's output is discarded", async () => {
    const r = messagesJsonResponder({ context: context(), model: "m" });
    r.relay(chunk("lost attempt"));
    r.discard();
    for (const frame of mixed) r.relay(frame);
    r.succeed(outcome);
    expect(await (await r.response).json()).toEqual({
      id: "msg_00112233445566778899aabb",
      type: "message",
      role: "assistant",
      model: "m",
      content: [
        { type: "text", text: "Let me check." },
        { type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Oslo" } },
      ],
      stop_reason: "tool_use",
      stop_sequence: null,
      usage: { input_tokens: 7, output_tokens: 5 },
    });
  });
});

describe("responses responders", () => {
  test("streaming: nothing before the first delta, then a message item and a function_call item", async () => {
    const r = responsesStreamResponder({ context: context(), model: "m", echo });
    expect(await settled(r.response)).toBe(false);
    for (const frame of mixed) r.relay(frame);
    r.succeed(outcome);
    const events = parseSse(await (await r.response).text()).map((e) => JSON.parse(e.data));
    expect(events.map((e) => e.type)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const completed = events.at(-1).response;
    expect(completed.output).toEqual([
      {
        id: "msg_00112233445566778899aabb",
        type: "message",
        status: "completed",
        role: "assistant",
        content: [{ type: "output_text", text: "Let me check.", annotations: [], logprobs: [] }],
      },
      { id: "fc_00112233445566778899aabb_0", type: "function_call", status: "completed", call_id: "call_1", name: "get_weather", arguments: '{"city":"Oslo"}' },
    ]);
    expect(completed.usage).toMatchObject({ input_tokens: 7, output_tokens: 5, total_tokens: 12 });
  });

  test("streaming: a failure after the first delta is response.failed with the items so far", async () => {
    const r = responsesStreamResponder({ context: context(), model: "m", echo });
    r.relay(chunk("partial"));
    r.failMidStream(gatewayError("provider_disconnected", "The provider disconnected."));
    const events = parseSse(await (await r.response).text()).map((e) => JSON.parse(e.data));
    expect(events.at(-1)).toMatchObject({
      type: "response.failed",
      response: { status: "failed", error: { code: "provider_disconnected" }, output: [{ type: "message", status: "incomplete" }] },
    });
  });

  test("JSON: length → incomplete with reason max_output_tokens", async () => {
    const r = responsesJsonResponder({ context: context(), model: "m", echo });
    r.relay(chunk("cut"));
    r.succeed({ finishReason: "length", usage: { prompt_tokens: 1, completion_tokens: 1 } });
    expect(await (await r.response).json()).toMatchObject({
      id: "resp_00112233445566778899aabb",
      status: "incomplete",
      incomplete_details: { reason: "max_output_tokens" },
      output: [{ type: "message", status: "incomplete", content: [{ type: "output_text", text: "cut" }] }],
    });
  });

  test("JSON: failure is the chat-completions envelope", async () => {
    const r = responsesJsonResponder({ context: context(), model: "m", echo });
    r.fail(gatewayError("model_not_available", "Unknown model.", { param: "model" }));
    const res = await r.response;
    expect(res.status).toBe(404);
    expect(await res.json()).toEqual({ error: { message: "Unknown model.", type: "not_found_error", param: "model", code: "model_not_available", retryable: false } });
  });
});
