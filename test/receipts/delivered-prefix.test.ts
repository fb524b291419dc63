// The delivered-prefix rules both sides share (docs/receipts.md): tool-call assembly, the cancel prefix,
// "delivered nothing", and the prompt-token bound (which must agree with the HTTP layer's).
import { describe, expect, test } from "bun:test";
import { promptTokenBound as httpBound } from "../../src/http/chat/normalize.ts";
import { chunksWithinBytes, deliveredNothing, deliveredPrefixOf, promptTokenBound, ToolCallAssembler } from "../../src/receipts/index.ts";

describe("tool-call assembly", () => {
  test("groups by index, keeps the first id and name, concatenates raw arguments, sorts by index", () => {
    const a = new ToolCallAssembler();
    a.add([{ index: 1, id: "b", name: "second", arguments: "{" }]);
    a.add([{ index: 0, id: "a", name: "first" }, { index: 1, arguments: "}" }]);
    a.add([{ index: 0, id: "ignored", name: "ignored", arguments: "not json at all" }]);
    expect(a.result()).toEqual([
      { index: 0, id: "a", name: "first", arguments: "not json at all" },
      { index: 1, id: "b", name: "second", arguments: "{}" },
    ]);
  });

  test("no tool-call delta → null, not []", () => {
    expect(new ToolCallAssembler().result()).toBeNull();
  });
});

describe("the prefix bound after cancel", () => {
  const chunks = [{ content: "ab", tokens: 1 }, { tool_calls: [{ index: 0, id: "x" }], tokens: 1 }, { content: "€", tokens: 1 }, { content: "z", tokens: 1 }];
  test.each([
    [0, 0],
    [1, 0],
    [2, 2],
    [4, 2],
    [5, 3],
    [6, 4],
  ])("%d delivered bytes → first %d chunks", (bytes, n) => {
    expect(chunksWithinBytes(chunks, bytes)).toEqual(chunks.slice(0, n));
  });
});

test("delivered nothing: no content byte and no tool call, whatever the token count", () => {
  expect(deliveredNothing(deliveredPrefixOf([{ content: "", tokens: 3 }], "provider_error", null))).toBe(true);
  expect(deliveredNothing(deliveredPrefixOf([], "gateway_timeout", null))).toBe(true);
  expect(deliveredNothing(deliveredPrefixOf([{ tool_calls: [{ index: 0 }], tokens: 0 }], "buyer_cancel", null))).toBe(false);
  expect(deliveredNothing(deliveredPrefixOf([{ content: "x", tokens: 0 }], "buyer_cancel", null))).toBe(false);
});

describe("prompt-token bound", () => {
  const messages = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Grüße 👋" },
    { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }] },
  ];
  const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
  test("UTF-8 bytes of contents and tools JSON, +8 a message, +16, + each assistant tool call's name and arguments + 8", () => {
    expect(promptTokenBound(messages, tools)).toBe(16 + 3 * 8 + 9 + Buffer.byteLength("Grüße 👋") + JSON.stringify(tools).length + (1 + 2 + 8));
  });
  test("agrees with the HTTP layer's bound", () => {
    expect(promptTokenBound(messages, tools)).toBe(httpBound(messages, tools));
    expect(promptTokenBound(messages, undefined)).toBe(httpBound(messages, undefined));
  });
});
