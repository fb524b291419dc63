// The synthetic engine's scripted replies (pure): when it calls a tool, what the call looks like, and
// structured output shaped by the requested schema — what the facade round-trip tests rely on.
import { describe, expect, test } from "bun:test";
import {
  exampleFromSchema,
  syntheticJson,
  syntheticReply,
  syntheticText,
  syntheticToolCall,
  SYNTHETIC_TOOL_MARKER,
} from "../../src/provider/synthetic.ts";
import type { JobMessage, JobParams } from "../../src/wire/frames.ts";

const tool = (name: string, parameters: unknown = { type: "object", properties: { city: { type: "string" } } }) => ({
  type: "function",
  function: { name, parameters },
});
const tools = [tool("get_weather"), tool("get_time", { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"] } } })];
const ask = (content: string): JobMessage[] => [{ role: "user", content }];

describe("syntheticToolCall", () => {
  test.each<[string, JobMessage[], Partial<JobParams>, string | null]>([
    ["marker calls the first tool", ask(`weather? ${SYNTHETIC_TOOL_MARKER}`), { tools }, "get_weather"],
    ["marker with a name calls that tool", ask("time? [call_tool:get_time]"), { tools }, "get_time"],
    ["marker naming an unknown tool calls the first", ask("[call_tool:nope]"), { tools }, "get_weather"],
    ["no marker, tool_choice auto → text", ask("weather?"), { tools, tool_choice: "auto" }, null],
    ["tool_choice required forces a call", ask("weather?"), { tools, tool_choice: "required" }, "get_weather"],
    ["a named tool_choice forces that tool", ask("x"), { tools, tool_choice: { type: "function", function: { name: "get_time" } } }, "get_time"],
    ["tool_choice none wins over the marker", ask(SYNTHETIC_TOOL_MARKER), { tools, tool_choice: "none" }, null],
    ["no tools → text", ask(SYNTHETIC_TOOL_MARKER), {}, null],
    [
      "after a tool result → text (the round trip ends)",
      [...ask(SYNTHETIC_TOOL_MARKER), { role: "assistant", content: null, tool_calls: [] }, { role: "tool", content: "sunny", tool_call_id: "c" }],
      { tools, tool_choice: "required" },
      null,
    ],
  ])("%s", (_name, messages, params, name) => {
    expect(syntheticToolCall(messages, params)?.name ?? null).toBe(name);
  });

  test("the call is deterministic, with a call_ id and schema-shaped JSON arguments", () => {
    const a = syntheticToolCall(ask("[call_tool:get_time]"), { tools })!;
    expect(a).toEqual(syntheticToolCall(ask("[call_tool:get_time]"), { tools })!);
    expect(a.id).toMatch(/^call_[0-9a-f]{16}$/);
    expect(JSON.parse(a.arguments)).toEqual({ zone: "UTC" });
  });
});

test.each<[string, unknown, unknown]>([
  ["string", { type: "string" }, "synthetic"],
  ["enum", { type: "string", enum: ["b", "a"] }, "b"],
  ["integer", { type: "integer" }, 1],
  ["nullable boolean", { type: ["null", "boolean"] }, true],
  ["array", { type: "array", items: { type: "number" } }, [1]],
  ["nested object", { type: "object", properties: { a: { type: "object", properties: { b: { const: 7 } } } } }, { a: { b: 7 } }],
  ["anyOf", { anyOf: [{ type: "string" }, { type: "integer" }] }, "synthetic"],
  ["no schema", undefined, null],
])("exampleFromSchema: %s", (_name, schema, expected) => {
  expect(exampleFromSchema(schema)).toEqual(expected);
});

describe("syntheticReply", () => {
  test("a tool call: a head chunk naming the call, then the arguments in pieces, finish tool_calls", () => {
    const reply = syntheticReply(ask(SYNTHETIC_TOOL_MARKER), { max_tokens: 100, tools });
    const call = syntheticToolCall(ask(SYNTHETIC_TOOL_MARKER), { tools })!;
    expect(reply.finishReason).toBe("tool_calls");
    expect(reply.chunks[0]).toEqual({ tool_calls: [{ index: 0, id: call.id, name: "get_weather", arguments: "" }], tokens: 1 });
    const args = reply.chunks.slice(1).map((c) => c.tool_calls![0]!.arguments).join("");
    expect(args).toBe(call.arguments);
    expect(reply.chunks.every((c) => c.tokens === 1)).toBe(true);
  });

  test("cut by max_tokens → finish length", () => {
    expect(syntheticReply(ask(SYNTHETIC_TOOL_MARKER), { max_tokens: 2, tools })).toMatchObject({ finishReason: "length", chunks: { length: 2 } });
  });

  test("json_schema output is the schema's example, json_object wraps the text", () => {
    const schema = { type: "object", properties: { answer: { type: "string" }, n: { type: "integer" } } };
    const reply = syntheticReply(ask("x"), { max_tokens: 100, response_format: { type: "json_schema", json_schema: { name: "s", schema } } });
    expect(JSON.parse(reply.chunks.map((c) => c.content).join(""))).toEqual({ answer: "synthetic", n: 1 });
    expect(JSON.parse(syntheticJson(ask("x"), { type: "json_object" })!)).toEqual({ answer: syntheticText(ask("x"), 1000).join("") });
  });

  test("plain text is unchanged: one word a chunk", () => {
    const reply = syntheticReply(ask("hello"), { max_tokens: 1000 });
    expect(reply.chunks.map((c) => c.content)).toEqual(syntheticText(ask("hello"), 1000));
    expect(reply.finishReason).toBe("stop");
  });
});
