// The responses facade's translation (pure): what reaches the chat pipeline, what is tolerated or
// dropped, and what is refused before any dispatch with unsupported_parameter naming it.
import { describe, expect, test } from "bun:test";
import { responsesRequestChecker, type ResponsesRequest } from "../../src/http/responses/schema.ts";
import { translateResponsesRequest } from "../../src/http/responses/translate.ts";
import type { NormalizedChat } from "../../src/chat/contract.ts";

const CAP = 4096;
const base = { model: "m", input: "hi" };
const weather = { type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } }, strict: true };
const weatherChat = {
  type: "function",
  function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } }, strict: true },
};

function translate(body: Record<string, unknown>) {
  expect(responsesRequestChecker.Check(body)).toBe(true);
  return translateResponsesRequest(body as ResponsesRequest, CAP);
}

function ok(body: Record<string, unknown>): NormalizedChat {
  const result = translate(body);
  if (!result.ok) throw new Error(`refused: ${JSON.stringify(result.error)}`);
  return result.chat;
}

describe("responses → chat: supported features", () => {
  test.each<[string, Record<string, unknown>, Partial<NormalizedChat>]>([
    ["string input", base, { model: "m", messages: [{ role: "user", content: "hi" }], params: { max_tokens: CAP }, stream: false }],
    [
      "instructions, message items, developer → system, text parts joined",
      {
        model: "m",
        instructions: "be brief",
        input: [
          { role: "developer", content: "rules" },
          { type: "message", role: "user", content: [{ type: "input_text", text: "a" }, { type: "input_text", text: "b" }] },
          { type: "message", role: "assistant", id: "msg_1", status: "completed", content: [{ type: "output_text", text: "c", annotations: [] }] },
        ],
      },
      {
        messages: [
          { role: "system", content: "be brief" },
          { role: "system", content: "rules" },
          { role: "user", content: "ab" },
          { role: "assistant", content: "c" },
        ],
      },
    ],
    [
      "function_call items join the assistant turn; outputs become tool messages",
      {
        model: "m",
        input: [
          { role: "user", content: "weather in Oslo and Rome?" },
          { type: "function_call", id: "fc_1", call_id: "call_a", name: "get_weather", arguments: '{"city":"Oslo"}', status: "completed" },
          { type: "function_call", call_id: "call_b", name: "get_weather", arguments: '{"city":"Rome"}' },
          { type: "function_call_output", call_id: "call_a", output: "sunny" },
          { type: "function_call_output", call_id: "call_b", output: [{ type: "input_text", text: "rain" }] },
        ],
      },
      {
        messages: [
          { role: "user", content: "weather in Oslo and Rome?" },
          {
            role: "assistant",
            content: null,
            tool_calls: [
              { id: "call_a", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } },
              { id: "call_b", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome"}' } },
            ],
          },
          { role: "tool", content: "sunny", tool_call_id: "call_a" },
          { role: "tool", content: "rain", tool_call_id: "call_b" },
        ],
      },
    ],
    [
      "a function_call after an assistant message joins that message",
      {
        model: "m",
        input: [
          { role: "user", content: "q" },
          { role: "assistant", content: "Let me check." },
          { type: "function_call", call_id: "c", name: "f", arguments: "{}" },
        ],
      },
      {
        messages: [
          { role: "user", content: "q" },
          { role: "assistant", content: "Let me check.", tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }] },
        ],
      },
    ],
    [
      "function tools kept, hosted and unknown tools dropped, tool_choice forwarded",
      { ...base, tools: [{ type: "web_search_preview" }, weather, { type: "mystery_tool" }], tool_choice: "required" },
      { params: { max_tokens: CAP, tools: [weatherChat], tool_choice: "required" } },
    ],
    [
      "a named function tool_choice",
      { ...base, tools: [weather], tool_choice: { type: "function", name: "get_weather" } },
      { params: { max_tokens: CAP, tools: [weatherChat], tool_choice: { type: "function", function: { name: "get_weather" } } } },
    ],
    [
      "tool_choice naming a hosted tool is dropped with the tool",
      { ...base, tools: [{ type: "file_search", vector_store_ids: [] }], tool_choice: { type: "file_search" } },
      { params: { max_tokens: CAP } },
    ],
    [
      "text.format json_schema → response_format json_schema",
      { ...base, text: { format: { type: "json_schema", name: "answer", schema: { type: "object", properties: { n: { type: "integer" } } }, strict: true } } },
      {
        params: {
          max_tokens: CAP,
          response_format: { type: "json_schema", json_schema: { name: "answer", schema: { type: "object", properties: { n: { type: "integer" } } }, strict: true } },
        },
      },
    ],
    ["text.format json_object", { ...base, text: { format: { type: "json_object" } } }, { params: { max_tokens: CAP, response_format: { type: "json_object" } } }],
    ["text.format text adds nothing", { ...base, text: { format: { type: "text" } } }, { params: { max_tokens: CAP } }],
    [
      "sampling, max_output_tokens and stream",
      { ...base, max_output_tokens: 50, temperature: 0.2, top_p: 0.5, stream: true },
      { stream: true, params: { max_tokens: 50, temperature: 0.2, top_p: 0.5 } },
    ],
    [
      "tolerated without effect: include, reasoning controls, parallel_tool_calls, store false, truncation disabled",
      {
        ...base,
        include: ["reasoning.encrypted_content"],
        reasoning: { summary: "auto", effort: "low" },
        parallel_tool_calls: false,
        store: false,
        truncation: "disabled",
        metadata: { k: "v" },
        user: "u",
        background: false,
        previous_response_id: null,
      },
      { params: { max_tokens: CAP } },
    ],
  ])("%s", (_name, body, expected) => {
    expect(ok(body)).toMatchObject(expected);
  });

  test("the response echo carries what was applied", () => {
    const result = translate({ ...base, instructions: "x", tools: [{ type: "web_search" }, weather], text: { format: { type: "json_object" } } });
    expect(result).toMatchObject({
      ok: true,
      echo: { instructions: "x", tools: [weather], tool_choice: "auto", text: { format: { type: "json_object" } }, parallel_tool_calls: true },
    });
  });
});

describe("responses → chat: refused before dispatch with param naming it", () => {
  test.each<[string, Record<string, unknown>, string]>([
    ["previous_response_id", { ...base, previous_response_id: "resp_1" }, "previous_response_id"],
    ["store: true", { ...base, store: true }, "store"],
    ["conversation", { ...base, conversation: "conv_1" }, "conversation"],
    ["background: true", { ...base, background: true }, "background"],
    ["truncation auto", { ...base, truncation: "auto" }, "truncation"],
    ["response_format (a chat parameter)", { ...base, response_format: { type: "json_object" } }, "response_format"],
    ["input_image part", { model: "m", input: [{ role: "user", content: [{ type: "input_text", text: "x" }, { type: "input_image", image_url: "https://example.invalid/a.png" }] }] }, "input[0].content[1]"],
    ["input_file part", { model: "m", input: [{ role: "user", content: [{ type: "input_file", file_id: "file_1" }] }] }, "input[0].content[0]"],
    ["input_audio part", { model: "m", input: [{ role: "user", content: [{ type: "input_audio", input_audio: {} }] }] }, "input[0].content[0]"],
    ["a non-text function_call_output", { model: "m", input: [{ type: "function_call_output", call_id: "c", output: [{ type: "input_image", image_url: "x" }] }] }, "input[0].output[0]"],
    ["a reasoning item", { model: "m", input: [{ type: "reasoning", id: "rs_1", summary: [] }] }, "input[0]"],
    ["an item_reference", { model: "m", input: [{ type: "item_reference", id: "msg_1" }] }, "input[0]"],
    ["a stored prompt", { ...base, prompt: { id: "pmpt_1" } }, "prompt"],
    ["an unknown text.format", { ...base, text: { format: { type: "grammar" } } }, "text.format"],
  ])("%s", (_name, body, param) => {
    const result = translate(body);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.code).toBe("unsupported_parameter");
    expect(result.error.param).toBe(param);
  });

  test.each<[string, Record<string, unknown>, string, string]>([
    ["max_output_tokens above the cap", { ...base, max_output_tokens: CAP + 1 }, "quota_exhausted_request_cap", "max_output_tokens"],
    ["no input", { model: "m" }, "invalid_request", "input"],
    ["json_schema without a schema", { ...base, text: { format: { type: "json_schema", name: "x" } } }, "invalid_request", "text.format.schema"],
    ["a function_call without call_id", { model: "m", input: [{ type: "function_call", name: "f", arguments: "{}" }] }, "invalid_request", "input[0]"],
  ])("%s → %s", (_name, body, code, param) => {
    expect(translate(body)).toMatchObject({ ok: false, error: { code, param } });
  });
});
