// The messages facade's translation (pure): what reaches the chat pipeline, and what is refused before
// any dispatch with unsupported_content_shape naming the field.
import { describe, expect, test } from "bun:test";
import { messagesRequestChecker, type MessagesRequest } from "../../src/http/messages/schema.ts";
import { stopReason, translateMessagesRequest } from "../../src/http/messages/translate.ts";
import type { NormalizedChat } from "../../src/chat/contract.ts";

const CAP = 4096;
const noBeta = { anthropicBeta: null };
const base = { model: "m", max_tokens: 100, messages: [{ role: "user", content: "hi" }] };

function ok(body: Record<string, unknown>, headers = noBeta): NormalizedChat {
  expect(messagesRequestChecker.Check(body)).toBe(true);
  const result = translateMessagesRequest(body as MessagesRequest, headers, CAP);
  if (!result.ok) throw new Error(`refused: ${JSON.stringify(result.error)}`);
  return result.chat;
}

describe("messages → chat: supported features", () => {
  test.each<[string, Record<string, unknown>, Partial<NormalizedChat>]>([
    ["plain text", base, { model: "m", messages: [{ role: "user", content: "hi" }], params: { max_tokens: 100 }, stream: false }],
    ["system string", { ...base, system: "be brief" }, { messages: [{ role: "system", content: "be brief" }, { role: "user", content: "hi" }] }],
    [
      "system text blocks (joined, cache_control ignored)",
      { ...base, system: [{ type: "text", text: "a" }, { type: "text", text: "b", cache_control: { type: "ephemeral" } }] },
      { messages: [{ role: "system", content: "ab" }, { role: "user", content: "hi" }] },
    ],
    [
      "user text blocks",
      { ...base, messages: [{ role: "user", content: [{ type: "text", text: "x" }, { type: "text", text: "y" }] }] },
      { messages: [{ role: "user", content: "xy" }] },
    ],
    [
      "assistant tool_use → tool_calls; user tool_result → tool message",
      {
        ...base,
        messages: [
          { role: "user", content: "weather?" },
          { role: "assistant", content: [{ type: "text", text: "Checking." }, { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Oslo" } }] },
          { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "sunny" }] }, { type: "text", text: "thanks" }] },
        ],
      },
      {
        messages: [
          { role: "user", content: "weather?" },
          {
            role: "assistant",
            content: "Checking.",
            tool_calls: [{ id: "toolu_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }],
          },
          { role: "tool", content: "sunny", tool_call_id: "toolu_1" },
          { role: "user", content: "thanks" },
        ],
      },
    ],
    [
      "tool_use only → content null; tool_result only → no empty user message",
      {
        ...base,
        messages: [
          { role: "user", content: "go" },
          { role: "assistant", content: [{ type: "tool_use", id: "t", name: "f", input: {} }] },
          { role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: "42" }] },
        ],
      },
      {
        messages: [
          { role: "user", content: "go" },
          { role: "assistant", content: null, tool_calls: [{ id: "t", type: "function", function: { name: "f", arguments: "{}" } }] },
          { role: "tool", content: "42", tool_call_id: "t" },
        ],
      },
    ],
    [
      "tools, tool_choice any, sampling and stop sequences",
      {
        ...base,
        stream: true,
        temperature: 0.5,
        top_p: 0.9,
        stop_sequences: ["END"],
        tools: [{ name: "f", description: "does f", input_schema: { type: "object", properties: { a: { type: "string" } } } }],
        tool_choice: { type: "any", disable_parallel_tool_use: true },
      },
      {
        stream: true,
        params: {
          max_tokens: 100,
          temperature: 0.5,
          top_p: 0.9,
          stop: ["END"],
          tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "string" } } }, description: "does f" } }],
          tool_choice: "required",
          parallel_tool_calls: false,
        },
      },
    ],
    [
      "tool_choice tool → a named function; custom-typed tools are client tools",
      { ...base, tools: [{ type: "custom", name: "f", input_schema: { type: "object" } }], tool_choice: { type: "tool", name: "f" } },
      { params: { max_tokens: 100, tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }], tool_choice: { type: "function", function: { name: "f" } } } },
    ],
    ["max_tokens absent → the request cap", { model: "m", messages: [{ role: "user", content: "hi" }] }, { params: { max_tokens: CAP } }],
    ["metadata is accepted and not forwarded", { ...base, metadata: { user_id: "u1" } }, { params: { max_tokens: 100 } }],
  ])("%s", (_name, body, expected) => {
    expect(ok(body)).toMatchObject(expected);
  });
});

describe("messages → chat: refused before dispatch with the field named", () => {
  test.each<[string, Record<string, unknown>, string | null, string]>([
    ["image block", { ...base, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }, null, "messages[0].content[0]"],
    ["document block", { ...base, messages: [{ role: "user", content: [{ type: "text", text: "x" }, { type: "document", source: {} }] }] }, null, "messages[0].content[1]"],
    ["file block", { ...base, messages: [{ role: "user", content: [{ type: "file", file_id: "f" }] }] }, null, "messages[0].content[0]"],
    ["image inside a tool_result", { ...base, messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: [{ type: "image", source: {} }] }] }] }, null, "messages[0].content[0].content[0]"],
    ["image in the system blocks", { ...base, system: [{ type: "image", source: {} }] }, null, "system[0]"],
    ["thinking block in an assistant turn", { ...base, messages: [{ role: "user", content: "a" }, { role: "assistant", content: [{ type: "thinking", thinking: "…", signature: "s" }] }] }, null, "messages[1].content[0]"],
    ["server tool use block", { ...base, messages: [{ role: "user", content: "a" }, { role: "assistant", content: [{ type: "server_tool_use", id: "s", name: "web_search", input: {} }] }] }, null, "messages[1].content[0]"],
    ["server tool definition", { ...base, tools: [{ type: "web_search_20250305", name: "web_search" }] }, null, "tools[0]"],
    ["thinking parameter", { ...base, thinking: { type: "enabled", budget_tokens: 1024 } }, null, "thinking"],
    ["top_k", { ...base, top_k: 5 }, null, "top_k"],
    ["mcp_servers", { ...base, mcp_servers: [{ type: "url", url: "https://example.invalid", name: "x" }] }, null, "mcp_servers"],
    ["anthropic-beta header", base, "prompt-caching-2024-07-31", "anthropic-beta"],
  ])("%s", (_name, body, beta, param) => {
    expect(messagesRequestChecker.Check(body)).toBe(true);
    const result = translateMessagesRequest(body as MessagesRequest, { anthropicBeta: beta }, CAP);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.code).toBe("unsupported_content_shape");
    expect(result.error.param).toBe(param);
  });

  test("max_tokens above the per-request cap is the request-cap quota error", () => {
    const result = translateMessagesRequest({ ...base, max_tokens: CAP + 1 } as MessagesRequest, noBeta, CAP);
    expect(result).toMatchObject({ ok: false, error: { code: "quota_exhausted_request_cap", param: "max_tokens" } });
  });

  test.each<[string, Record<string, unknown>]>([
    ["no messages", { model: "m", messages: [] }],
    ["a system role in messages", { model: "m", messages: [{ role: "system", content: "x" }] }],
    ["temperature above 1", { ...base, temperature: 1.5 }],
    ["an unknown tool_choice type", { ...base, tool_choice: { type: "sometimes" } }],
  ])("schema refuses %s", (_name, body) => {
    expect(messagesRequestChecker.Check(body)).toBe(false);
  });
});

test.each([
  ["stop", "end_turn"],
  ["length", "max_tokens"],
  ["tool_calls", "tool_use"],
  ["content_filter", "refusal"],
  ["anything else", "end_turn"],
])("finish_reason %s → stop_reason %s", (finish, stop) => {
  expect(stopReason(finish)).toBe(stop as ReturnType<typeof stopReason>);
});
