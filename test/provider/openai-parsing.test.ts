// The openai engine's pure parts, table-driven: SSE framing, chunk mapping, token counting, error
// classification, the outcome rule and the upstream URL.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createChunkMapper, normalizeFinishReason } from "../../src/provider/openai/chunk.ts";
import { declineCodeFor, parseJson } from "../../src/provider/openai/errors.ts";
import { decideOutcome, type StreamEnd } from "../../src/provider/openai/outcome.ts";
import { chatCompletionsUrl, upstreamBody } from "../../src/provider/openai/request.ts";
import { SseDecoder, type SseEvent } from "../../src/provider/openai/sse.ts";
import { inputTokens, OutputTokenCounter, promptTokenBound } from "../../src/provider/openai/tokens.ts";
import { FIXTURE_DIR } from "../support/mockUpstream.ts";
import { makeJob } from "./fake-gateway.ts";

const fixture = (file: string) => readFileSync(join(FIXTURE_DIR, file), "utf8");
const bytes = (text: string) => new TextEncoder().encode(text);

function decodeAll(parts: Uint8Array[]): SseEvent[] {
  const decoder = new SseDecoder();
  return [...parts.flatMap((p) => decoder.push(p)), ...decoder.end()];
}

describe("SseDecoder", () => {
  test("a body fed one byte at a time gives the same events as in one read", () => {
    const body = bytes(fixture("llamacpp-stream-framing-quirks-trimmed.sse") + "data: 日本語\n\n");
    const whole = decodeAll([body]);
    const split = decodeAll([...body].map((b) => Uint8Array.of(b)));
    expect(split).toEqual(whole);
    // keep-alive comment skipped; the empty `data: ` frame is an event with empty data
    expect(whole.map((e) => (e.type === "data" ? e.data.slice(0, 12) : e.type))).toEqual([
      '{"choices":[', "", '{"choices":[', '{"choices":[', '{"choices":[', '{"choices":[', '{"choices":[', "[DONE]", "日本語",
    ]);
  });

  test.each([
    ["LF", "data: a\n\ndata: b\n\n"],
    ["CRLF", "data: a\r\n\r\ndata: b\r\n\r\n"],
    ["CR", "data: a\r\rdata: b\r\r"],
  ])("%s line endings", (_, text) => {
    const split = decodeAll([...bytes(text)].map((b) => Uint8Array.of(b)));
    expect(split).toEqual([{ type: "data", event: "", data: "a" }, { type: "data", event: "", data: "b" }]);
  });

  test("a last event without its blank line is flushed at EOF (llama-server's bare [DONE])", () => {
    expect(decodeAll([bytes('data: {"x":1}\n\ndata: [DONE]')])).toEqual([
      { type: "data", event: "", data: '{"x":1}' },
      { type: "data", event: "", data: "[DONE]" },
    ]);
  });

  test("multi-line data, event names, comments and unknown fields", () => {
    expect(decodeAll([bytes(": ping\nid: 3\nretry: 10\nevent: error\ndata: {\ndata: }\n\n:\ndata:x\n\n")])).toEqual([
      { type: "data", event: "error", data: "{\n}" },
      { type: "data", event: "", data: "x" },
    ]);
  });

  test("llama.cpp's legacy `error:` field line is surfaced", () => {
    const events = decodeAll([bytes(fixture("llamacpp-b5966-stream-midstream-error-legacy-field.sse"))]);
    expect(events[0]?.type).toBe("error_field");
    expect(events[1]).toEqual({ type: "data", event: "", data: "[DONE]" });
  });

  test("a line over the limit is an overflow, and nothing after it is decoded", () => {
    const decoder = new SseDecoder(16);
    expect(decoder.push(bytes("data: " + "x".repeat(40)))).toEqual([{ type: "overflow" }]);
    expect(decoder.push(bytes("\n\ndata: y\n\n"))).toEqual([]);
    const many = new SseDecoder(16);
    expect(many.push(bytes("data: 0123456789\ndata: 0123456789\n"))).toEqual([{ type: "overflow" }]);
  });
});

describe("chunk mapping", () => {
  const json = (file: string) => JSON.parse(fixture(file)) as unknown;
  const sseJson = (file: string, i = 0) => JSON.parse(fixture(file).split("\n\n")[i]!.replace(/^data: /, "")) as unknown;

  test("llama.cpp finish chunk carrying usage and timings: finish and prompt tokens, nothing relayed", () => {
    const m = createChunkMapper().chunk(json("llamacpp-b6097-finish-chunk-usage-timings.json"));
    expect(m).toEqual({ kind: "chunk", tokens: 0, reasoning: false, finishReason: "stop", promptTokens: 1085 });
  });

  test("usage chunk with choices: [] (no choices[0] to index)", () => {
    const m = createChunkMapper().chunk(sseJson("llamacpp-b6271-usage-chunk-empty-choices.sse"));
    expect(m).toEqual({ kind: "chunk", tokens: 0, reasoning: false, finishReason: null, promptTokens: 515 });
  });

  test("per-chunk timings: reasoning advances the count without charge; content is charged the difference", () => {
    const mapper = createChunkMapper();
    const reasoning = sseJson("llamacpp-b9554-stream-reasoning-timings-per-chunk-segment.sse", 0); // predicted_n 8
    expect(mapper.chunk(reasoning)).toMatchObject({ reasoning: true, tokens: 0 });
    const content = { choices: [{ index: 0, delta: { content: "Hi" }, finish_reason: null }], timings: { predicted_n: 11 } };
    expect(mapper.chunk(content)).toMatchObject({ content: "Hi", tokens: 3 });
  });

  test("Ollama 0.20 parallel calls all on index 0: a new id starts a new call", () => {
    const mapper = createChunkMapper();
    const call = (id: string, name: string) => ({ choices: [{ delta: { tool_calls: [{ index: 0, id, function: { name, arguments: "{}" } }] } }] });
    expect(mapper.chunk(call("a", "f"))).toMatchObject({ tool_calls: [{ index: 0, id: "a", name: "f", arguments: "{}" }] });
    expect(mapper.chunk(call("b", "g"))).toMatchObject({ tool_calls: [{ index: 1, id: "b", name: "g", arguments: "{}" }] });
  });

  test("vLLM's empty tool_calls beside content, and a missing finish_reason key", () => {
    const m = createChunkMapper().chunk(sseJson("vllm-0.9.0-stream-missing-finish-reason-abridged.sse", 1));
    expect(m).toEqual({ kind: "chunk", content: "안", tokens: 1, reasoning: false, finishReason: null, promptTokens: null, plain: true });
  });

  test.each([
    ["error object", { error: { message: "CUDA out of memory", type: "InternalServerError" } }, { kind: "error", code: "internal" }],
    ["error string (mlx_lm)", { error: "boom" }, { kind: "error", code: "internal" }],
    ["choices not an array", { choices: {} }, { kind: "malformed" }],
    ["content not a string", { choices: [{ delta: { content: 5 } }] }, { kind: "malformed" }],
    ["not an object", 42, { kind: "malformed" }],
  ])("%s", (_, payload, expected) => {
    expect(createChunkMapper().chunk(payload)).toEqual(expected as never);
  });

  test.each([
    [null, null],
    ["", null],
    ["stop", "stop"],
    ["length", "length"],
    ["tool_calls", "tool_calls"],
    ["eos_token", "stop"],
  ])("finish_reason %p → %p", (value, expected) => {
    expect(normalizeFinishReason(value)).toBe(expected);
  });
});

describe("token counting", () => {
  test.each([
    ["no counts: one per relayed delta", [[true, null], [false, null], [true, null]], [1, 0, 1]],
    ["cumulative counts: differences", [[true, 1], [true, 3], [true, 4]], [1, 2, 1]],
    ["reasoning tokens are not charged", [[false, 5], [true, 6]], [0, 1]],
    ["a delta without a count falls back for good", [[true, 2], [true, null], [true, 9]], [2, 1, 1]],
    ["a count going backwards falls back", [[true, 5], [true, 2]], [5, 1]],
    ["no count on the first delta: counts are ignored", [[true, null], [true, 40]], [1, 1]],
  ] as const)("%s", (_, calls, expected) => {
    const counter = new OutputTokenCounter();
    expect(calls.map(([relayed, cumulative]) => counter.count(relayed, cumulative))).toEqual([...expected]);
  });

  test("input tokens: reported, capped at the gateway's bound, or estimated", () => {
    const job = makeJob({ messages: [{ role: "user", content: "x".repeat(40) }], params: { max_tokens: 5 } });
    const bound = promptTokenBound(job.messages, undefined);
    expect(bound).toBe(16 + 8 + 40);
    expect(inputTokens(job, 12)).toBe(12);
    expect(inputTokens(job, 10_000)).toBe(bound);
    expect(inputTokens(job, null)).toBe(10);
    const tools = [{ type: "function", function: { name: "f" } }];
    expect(promptTokenBound(job.messages, tools)).toBe(bound + JSON.stringify(tools).length);
  });
});

describe("errors", () => {
  test.each([
    [429, undefined, "queue_full"],
    [503, parseJson('{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'), "queue_full"],
    [400, parseJson(fixture("llamacpp-error-context-exceeded-400.json")), "context_exceeded"],
    [500, parseJson(fixture("llamacpp-error-context-exceeded-pr15780.json")), "context_exceeded"],
    [400, parseJson(fixture("vllm-error-legacy-object-error.json")), "context_exceeded"],
    [400, parseJson(fixture("vllm-error-0.10.1-nested-error.json")), "context_exceeded"],
    [400, { error: { message: "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it" } }, "context_exceeded"],
    [400, { error: { message: "'temperature' must be <= 2", type: "invalid_request_error" } }, "internal"],
    [404, { error: { message: 'model "x" not found, try pulling it first', type: "not_found_error" } }, "model_not_loaded"],
    [404, { error: "model not found" }, "model_not_loaded"],
    [500, parseJson(fixture("llamacpp-error-500-tools-requires-jinja.json")), "internal"],
    [502, "<html>bad gateway</html>", "internal"],
  ] as const)("%i %j → %s", (status, payload, code) => {
    expect(declineCodeFor(status, payload)).toBe(code);
  });
});

describe("the outcome rule", () => {
  const facts = (relayedChunks: number, finishReason: string | null = null) => ({ relayedChunks, finishReason, inputTokens: 7 });
  const normal = (finish: string) => ({ kind: "ended", result: { terminal_state: "normal_done", finish_reason: finish, usage: { input_tokens: 7, output_tokens: 0 } } });
  const endedAs = (terminal: string) => ({ kind: "ended", result: { terminal_state: terminal, finish_reason: null, usage: { input_tokens: 7, output_tokens: 0 } } });
  const declined = (code: string) => ({ kind: "declined", code });

  test.each<[string, StreamEnd, ReturnType<typeof facts>, unknown]>([
    ["[DONE] after a finish", { kind: "done" }, facts(3, "stop"), normal("stop")],
    ["[DONE] after a finish, nothing relayed (all reasoning)", { kind: "done" }, facts(0, "length"), normal("length")],
    ["[DONE] without any finish, after output", { kind: "done" }, facts(3), endedAs("provider_error")],
    ["[DONE] alone (vLLM dropping an early error)", { kind: "done" }, facts(0), declined("internal")],
    ["EOF after a finish but without [DONE] (the finish chunk was the answer's last)", { kind: "eof" }, facts(3, "stop"), normal("stop")],
    ["EOF without a finish, after output", { kind: "eof" }, facts(3), endedAs("upstream_transport_disconnect")],
    ["EOF before output", { kind: "eof" }, facts(0), declined("internal")],
    ["reset after output", { kind: "transport" }, facts(2), endedAs("upstream_transport_disconnect")],
    ["reset before output", { kind: "transport" }, facts(0), declined("internal")],
    ["idle timeout", { kind: "timeout", which: "idle" }, facts(2), endedAs("upstream_transport_disconnect")],
    ["first-token timeout", { kind: "timeout", which: "first_token" }, facts(0), declined("internal")],
    ["upstream error before output", { kind: "upstream_error", code: "queue_full" }, facts(0), declined("queue_full")],
    ["upstream error after output", { kind: "upstream_error", code: "context_exceeded" }, facts(1, "stop"), endedAs("provider_error")],
    ["malformed after output", { kind: "malformed" }, facts(1), endedAs("provider_error")],
    ["cancel before output", { kind: "cancelled", terminalState: "gateway_timeout" }, facts(0), endedAs("gateway_timeout")],
    ["cancel after output", { kind: "cancelled", terminalState: "buyer_cancel" }, facts(4, "stop"), endedAs("buyer_cancel")],
  ])("%s", (_, end, f, expected) => {
    expect(decideOutcome(end, f)).toEqual(expected as never);
  });
});

describe("the upstream request", () => {
  test.each([
    ["http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/chat/completions"],
    ["http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/chat/completions"],
    ["http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1/chat/completions"],
    ["http://127.0.0.1:11434/v1/", "http://127.0.0.1:11434/v1/chat/completions"],
    ["http://host:1234/v1/chat/completions", "http://host:1234/v1/chat/completions"],
    ["https://box.local/llm", "https://box.local/llm/v1/chat/completions"],
    ["ftp://x", null],
    ["127.0.0.1:8080", null],
    ["http://x/?a=1", null],
  ])("%s → %s", (base, url) => {
    expect(chatCompletionsUrl(base)).toBe(url);
  });

  test("the body holds only present fields", () => {
    const job = makeJob({ messages: [{ role: "user", content: "hi" }], params: { max_tokens: 9, seed: 1 } });
    expect(upstreamBody(job, "llama3.2:1b")).toEqual({
      model: "llama3.2:1b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 9,
      seed: 1,
      stream: true,
      stream_options: { include_usage: true },
    });
  });
});
