// normalizeChatRequest and promptTokenBound (pure, table-driven; docs/buyer-api.md request rules, the prompt bound of docs/receipts.md).
import { describe, expect, test } from "bun:test";
import { normalizeChatRequest, promptTokenBound, type NormalizeResult } from "../../src/http/chat/normalize.ts";
import type { ChatCompletionRequest } from "../../src/http/chat/schema.ts";
import type { ErrorCode } from "../../src/http/errors.ts";
import type { JobMessage } from "../../src/wire/frames.ts";
import { inCanonicalOrder } from "../../src/receipts/jcs.ts";

const CAP = 4096;
type Message = ChatCompletionRequest["messages"][number];

const body = (over: Partial<ChatCompletionRequest> = {}): ChatCompletionRequest => ({
  model: "m1",
  messages: [{ role: "user", content: "hi" }],
  ...over,
});

const ok = (r: NormalizeResult) => {
  if (!r.ok) throw new Error(`expected ok, got ${r.error.code}: ${r.error.message}`);
  return r.chat;
};

describe("messages", () => {
  test.each<[string, Message, JobMessage]>([
    ["a string content is kept", { role: "user", content: "hello" }, { role: "user", content: "hello" }],
    [
      "text parts joined with no separator",
      { role: "user", content: [{ type: "text", text: "Hello, " }, { type: "text", text: "world" }, { type: "text", text: "!" }] },
      { role: "user", content: "Hello, world!" },
    ],
    ["an empty text-part array is empty text", { role: "user", content: [] }, { role: "user", content: "" }],
    ["system text parts are accepted", { role: "system", content: [{ type: "text", text: "be brief" }] }, { role: "system", content: "be brief" }],
    ["developer → system", { role: "developer", content: "rules" }, { role: "system", content: "rules" }],
    ["developer text parts → system", { role: "developer", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }, { role: "system", content: "ab" }],
    [
      "null content with tool_calls is accepted on assistant messages",
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] },
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] },
    ],
    [
      "absent content with tool_calls is accepted too",
      { role: "assistant", tool_calls: [{ id: "c1" }] },
      { role: "assistant", content: null, tool_calls: [{ id: "c1" }] },
    ],
    [
      "tool results keep tool_call_id",
      { role: "tool", content: "42", tool_call_id: "c1" },
      { role: "tool", content: "42", tool_call_id: "c1" },
    ],
    ["name is kept", { role: "user", content: "hi", name: "alice" }, { role: "user", content: "hi", name: "alice" }],
  ])("%s", (_, message, expected) => {
    const chat = ok(normalizeChatRequest(body({ messages: [message] }), CAP));
    expect(chat.messages).toEqual([expected]);
  });

  test.each<[string, Message[], string]>([
    ["an image_url part", [{ role: "user", content: [{ type: "text", text: "look" }, { type: "image_url", image_url: { url: "https://x/y.png" } }] }], "messages[0].content"],
    ["an input_audio part", [{ role: "system", content: "s" }, { role: "user", content: [{ type: "input_audio" }] }], "messages[1].content"],
    ["a text part without text", [{ role: "user", content: [{ type: "text" }] }], "messages[0].content"],
    ["a non-object part", [{ role: "user", content: ["plain string"] }], "messages[0].content"],
    ["an assistant content array", [{ role: "user", content: "q" }, { role: "assistant", content: [{ type: "text", text: "a" }] }], "messages[1].content"],
    ["a tool content array", [{ role: "tool", content: [{ type: "text", text: "a" }], tool_call_id: "c" }], "messages[0].content"],
    ["null content on a user message", [{ role: "user", content: null }], "messages[0].content"],
    ["null content on an assistant message without tool_calls", [{ role: "assistant", content: null }], "messages[0].content"],
    ["null content on an assistant message with empty tool_calls", [{ role: "assistant", content: null, tool_calls: [] }], "messages[0].content"],
    ["absent content on a user message", [{ role: "user" }], "messages[0].content"],
  ])("%s → unsupported_content_shape naming %s", (_, messages, param) => {
    const r = normalizeChatRequest(body({ messages }), CAP);
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error.code).toBe("unsupported_content_shape");
    expect(r.error.param).toBe(param);
  });
});

test("messages list their members in canonical (JCS) order, so the prompt hash takes JSON.stringify's path", () => {
  const chat = ok(
    normalizeChatRequest(
      body({
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content: "hi", name: "ann" },
          { role: "tool", content: "42", tool_call_id: "c1" },
        ],
      }),
      CAP,
    ),
  );
  for (const m of chat.messages) expect(inCanonicalOrder(m)).toBe(true);
  expect(inCanonicalOrder(chat.params)).toBe(true);
});

describe("parameters", () => {
  test.each<[string, Partial<ChatCompletionRequest>, ErrorCode, string]>([
    ["n = 2", { n: 2 }, "unsupported_parameter", "n"],
    ["n = 0", { n: 0 }, "unsupported_parameter", "n"],
    ["logprobs: true", { logprobs: true }, "unsupported_parameter", "logprobs"],
    ["top_logprobs", { top_logprobs: 3 }, "unsupported_parameter", "top_logprobs"],
    ["top_logprobs: 0", { top_logprobs: 0 }, "unsupported_parameter", "top_logprobs"],
    ["max_tokens over the cap", { max_tokens: CAP + 1 }, "quota_exhausted_request_cap", "max_tokens"],
    ["max_completion_tokens over the cap", { max_completion_tokens: CAP + 1 }, "quota_exhausted_request_cap", "max_completion_tokens"],
    ["both over the cap, equal", { max_tokens: CAP + 1, max_completion_tokens: CAP + 1 }, "quota_exhausted_request_cap", "max_completion_tokens"],
    ["max_tokens and max_completion_tokens disagree", { max_tokens: 10, max_completion_tokens: 20 }, "invalid_request", "max_tokens"],
  ])("%s → %s (param %s)", (_, over, code, param) => {
    const r = normalizeChatRequest(body(over), CAP);
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error.code).toBe(code);
    expect(r.error.param).toBe(param);
  });

  test.each<[string, Partial<ChatCompletionRequest>]>([
    ["n = 1", { n: 1 }],
    ["n: null", { n: null }],
    ["logprobs: false", { logprobs: false }],
    ["logprobs: null", { logprobs: null }],
    ["top_logprobs: null", { top_logprobs: null }],
    ["user and metadata", { user: "u-1", metadata: { k: "v" } }],
  ])("%s is accepted", (_, over) => {
    expect(normalizeChatRequest(body(over), CAP).ok).toBe(true);
  });

  test.each<[string, Partial<ChatCompletionRequest>, number, number]>([
    ["absent max_tokens → the cap", {}, CAP, CAP],
    ["null max_tokens → the cap", { max_tokens: null }, CAP, CAP],
    ["max_tokens", { max_tokens: 100 }, CAP, 100],
    ["max_completion_tokens is an alias", { max_completion_tokens: 200 }, CAP, 200],
    ["both, equal", { max_tokens: 300, max_completion_tokens: 300 }, CAP, 300],
    ["exactly the cap", { max_tokens: CAP }, CAP, CAP],
    ["the demo cap", {}, 512, 512],
  ])("%s → params.max_tokens", (_, over, cap, expected) => {
    expect(ok(normalizeChatRequest(body(over), cap)).params.max_tokens).toBe(expected);
  });

  test("forwarded parameters are forwarded; user and metadata are not", () => {
    const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
    const chat = ok(
      normalizeChatRequest(
        body({
          max_tokens: 50,
          temperature: 0.5,
          top_p: 0.9,
          stop: ["\n\n", "END"],
          seed: 42,
          presence_penalty: 0.1,
          frequency_penalty: -0.2,
          response_format: { type: "json_object" },
          tools,
          tool_choice: "auto",
          parallel_tool_calls: false,
          user: "u-1",
          metadata: { k: "v" },
        }),
        CAP,
      ),
    );
    expect(chat.params).toEqual({
      max_tokens: 50,
      temperature: 0.5,
      top_p: 0.9,
      stop: ["\n\n", "END"],
      seed: 42,
      presence_penalty: 0.1,
      frequency_penalty: -0.2,
      response_format: { type: "json_object" },
      tools,
      tool_choice: "auto",
      parallel_tool_calls: false,
    });
  });

  test("zero-valued parameters are forwarded, nulls are dropped", () => {
    const chat = ok(normalizeChatRequest(body({ temperature: 0, seed: 0, top_p: null, stop: null, tools: null }), CAP));
    expect(chat.params).toEqual({ max_tokens: CAP, temperature: 0, seed: 0 });
  });

  test.each<[string, Partial<ChatCompletionRequest>, boolean, boolean]>([
    ["no stream", {}, false, false],
    ["stream", { stream: true }, true, false],
    ["stream with include_usage", { stream: true, stream_options: { include_usage: true } }, true, true],
    ["include_usage without stream is ignored", { stream_options: { include_usage: true } }, false, false],
    ["stream: null", { stream: null }, false, false],
  ])("%s", (_, over, stream, includeUsage) => {
    const chat = ok(normalizeChatRequest(body(over), CAP));
    expect({ stream: chat.stream, includeUsage: chat.includeUsage }).toEqual({ stream, includeUsage });
  });

  test("the model is kept as sent", () => {
    expect(ok(normalizeChatRequest(body({ model: "llama3.2:1b" }), CAP)).model).toBe("llama3.2:1b");
  });
});

describe("promptTokenBound", () => {
  const m = (content: string | null): JobMessage => ({ role: "user", content });
  test.each<[string, JobMessage[], unknown, number]>([
    ["no messages", [], undefined, 16],
    ["one ASCII message", [m("hello")], undefined, 16 + 8 + 5],
    ["UTF-8 bytes, not characters", [m("héllo"), m("日本")], undefined, 16 + 8 + 6 + 8 + 6],
    ["null content counts only the per-message 8", [m(null)], undefined, 16 + 8],
    ["empty content", [m("")], undefined, 16 + 8],
    ["tools JSON bytes", [m("a")], [{ type: "function" }], 16 + 8 + 1 + JSON.stringify([{ type: "function" }]).length],
  ])("%s", (_, messages, tools, expected) => {
    expect(promptTokenBound(messages, tools)).toBe(expected);
  });

  test("matches what normalizeChatRequest produces", () => {
    const chat = ok(
      normalizeChatRequest(
        body({ messages: [{ role: "developer", content: "sys" }, { role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "bc" }] }] }),
        CAP,
      ),
    );
    expect(promptTokenBound(chat.messages, chat.params.tools)).toBe(16 + 8 + 3 + 8 + 3);
  });
});
