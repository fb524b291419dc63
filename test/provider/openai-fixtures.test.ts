// Published upstream captures (test/fixtures/upstreams, README there) replayed through the mock
// upstream into the openai engine: what is relayed, how it is counted, and how each stream ends.
// Segments and captures whose publisher did not show the end have no [DONE], so they must end as
// truncated (never normal_done); some are replayed a second time with [DONE] appended.
import { afterAll, describe, expect, test } from "bun:test";
import type { ToolCallDelta } from "../../src/wire/frames.ts";
import { createOpenAIEngine } from "../../src/provider/openai/index.ts";
import { startMockUpstream, type Scenario } from "../support/mockUpstream.ts";
import { ended, runJob, type EngineRun } from "./openai-support.ts";

const mock = startMockUpstream();
afterAll(() => mock.close());
const engine = createOpenAIEngine({ upstream: mock.url, firstTokenTimeoutMs: 1000, idleTimeoutMs: 1000 });

// makeJob's prompt: "You are terse." + "Tell me about rivers." = 35 bytes → estimate 9; bound 16 + 2×8 + 35 = 67.
const ESTIMATED_INPUT = 9;

async function replay(file: string, extra: Partial<Scenario> = {}): Promise<EngineRun> {
  mock.next({ kind: "fixture", file, ...extra });
  return runJob(engine);
}

/** Tool calls assembled from the relayed fragments, by index. */
function toolCalls(run: EngineRun) {
  const calls = new Map<number, { id?: string; name?: string; arguments: string }>();
  for (const delta of run.chunks.flatMap((c) => c.tool_calls ?? []) as ToolCallDelta[]) {
    const call = calls.get(delta.index) ?? { arguments: "" };
    if (delta.id) call.id = delta.id;
    if (delta.name) call.name = delta.name;
    call.arguments += delta.arguments ?? "";
    calls.set(delta.index, call);
  }
  return [...calls.values()];
}

describe("llama.cpp", () => {
  test.each([undefined, 7])("framing quirks (keep-alive comment, empty data, reasoning, usage chunk), reads of %p bytes", async (chunkBytes) => {
    const r = await replay("llamacpp-stream-framing-quirks-trimmed.sse", chunkBytes ? { chunkBytes } : {});
    expect(r.chunks).toEqual([{ content: "Hello from ", tokens: 1 }, { content: "llama.cpp", tokens: 1 }]);
    expect(ended(r)).toEqual({ terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 12, output_tokens: 0 } });
  });

  test("two events in one read: both handled; the capture stops there → truncated", async () => {
    const r = await replay("llamacpp-b6103-stream-first-read-two-events.sse");
    expect(r.chunks).toEqual([{ content: "<|channel|>", tokens: 1 }]);
    expect(ended(r)?.terminal_state).toBe("upstream_transport_disconnect");
  });

  test("role chunk with content null, then reasoning only: nothing relayed (never the text 'null') → declined", async () => {
    const r = await replay("llamacpp-b6881-stream-role-then-reasoning.sse");
    expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
  });

  test("reasoning with timings on every chunk (segment): nothing relayed → declined", async () => {
    const r = await replay("llamacpp-b9554-stream-reasoning-timings-per-chunk-segment.sse");
    expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
  });

  test("legacy `error:` field in a 200 stream, then [DONE]: not a clean empty completion → declined context_exceeded", async () => {
    const r = await replay("llamacpp-b5966-stream-midstream-error-legacy-field.sse");
    expect(r.outcome).toEqual({ kind: "declined", code: "context_exceeded" });
  });

  test("text, leaked tool markup, then a tool call in fragments, finished by tool_calls (with or without the [DONE] the capture lacks)", async () => {
    const asCaptured = await replay("llamacpp-b6522-stream-toolcall-mixed-content.jsonl");
    expect(asCaptured.text).toBe("Hi there! Let me check the current weather for Washington DC for you.\n<tool_call>\n<function=get_current_weather");
    expect(toolCalls(asCaptured)).toEqual([
      { id: "emGvNsMhrq1M2MOwwmEiS9MHA7L1XNrE", name: "get_current_weather", arguments: '{"location":"Washington DC"}' },
    ]);
    expect(asCaptured.chunks).toHaveLength(20 + 7);
    expect(asCaptured.chunks.every((c) => c.tokens === 1)).toBe(true);
    // The capture ends after its finish chunk: a clean close there is a complete answer.
    expect(ended(asCaptured)?.terminal_state).toBe("normal_done");

    const completed = await replay("llamacpp-b6522-stream-toolcall-mixed-content.jsonl", { appendDone: true });
    expect(ended(completed)).toEqual({
      terminal_state: "normal_done",
      finish_reason: "tool_calls",
      usage: { input_tokens: ESTIMATED_INPUT, output_tokens: 0 }, // no usage in the capture: the estimate
    });
  });

  test("non-streaming answer that is all reasoning: nothing relayed, finished by length", async () => {
    const r = await replay("llamacpp-b8681-nonstream-reasoning-abridged.json");
    expect(r.chunks).toEqual([]);
    expect(ended(r)).toEqual({ terminal_state: "normal_done", finish_reason: "length", usage: { input_tokens: 17, output_tokens: 0 } });
  });

  test.each([
    ["llamacpp-error-context-exceeded-400.json", 400, "context_exceeded"],
    ["llamacpp-error-context-exceeded-pr15780.json", 500, "context_exceeded"],
    ["llamacpp-error-500-tools-requires-jinja.json", 500, "internal"],
  ] as const)("error body %s with status %i → declined %s", async (file, status, code) => {
    expect((await replay(file, { status })).outcome).toEqual({ kind: "declined", code });
  });
});

describe("Ollama", () => {
  test('finish_reason "" on content chunks is not a finish (segment → truncated)', async () => {
    const r = await replay("ollama-2024-05-stream-finish-reason-empty-string.sse");
    expect(r.text).toBe(" Hello there! I'");
    expect(ended(r)).toMatchObject({ terminal_state: "upstream_transport_disconnect", finish_reason: null });
  });

  test("reasoning under `reasoning`, then finish length and [DONE]: an empty, finished answer", async () => {
    const r = await replay("ollama-0.13.5-stream-first-and-last-abridged.sse");
    expect(r.chunks).toEqual([]);
    expect(ended(r)?.terminal_state).toBe("normal_done");
    expect(ended(r)?.finish_reason).toBe("length");
  });

  test("reasoning only (first 3 events) → declined", async () => {
    expect((await replay("ollama-0.13.5-stream-reasoning-first3.sse")).outcome).toEqual({ kind: "declined", code: "internal" });
  });

  test("non-streaming answers: reasoning-only, and a short one with usage", async () => {
    const reasoning = await replay("ollama-0.13.5-nonstream-reasoning.json");
    expect(reasoning.chunks).toEqual([]);
    expect(ended(reasoning)?.finish_reason).toBe("length");
    const short = await replay("ollama-2024-06-nonstream-finish-length.json");
    expect(short.chunks).toEqual([{ content: "Hello", tokens: 1 }]);
    expect(ended(short)).toEqual({ terminal_state: "normal_done", finish_reason: "length", usage: { input_tokens: 23, output_tokens: 0 } });
  });

  test("parallel tool calls, each whole in one chunk", async () => {
    const r = await replay("ollama-2025-04-stream-parallel-toolcalls.sse", { appendDone: true });
    expect(toolCalls(r)).toEqual([
      { id: "call_wteop8bt", name: "run_command", arguments: '{"command":"ls"}' },
      { id: "call_rk2xye1l", name: "run_command", arguments: '{"command":"ls -l"}' },
    ]);
    expect(ended(r)?.finish_reason).toBe("tool_calls");
  });

  test("a whole reply in one chunk with its finish; \\u003c escapes decoded", async () => {
    const r = await replay("ollama-2025-04-stream-tools-single-chunk.sse", { appendDone: true });
    expect(r.text).toStartWith("```\nxml\n<command>\n  <run_command>");
    expect(r.chunks).toHaveLength(1);
    expect(ended(r)?.finish_reason).toBe("stop");
  });

  test("a tool call sent as plain content is relayed as content (segment → truncated)", async () => {
    const r = await replay("ollama-2024-07-stream-toolcall-text-as-content.sse");
    expect(r.text).toBe('<tool_call>\n{"id":');
    expect(ended(r)?.terminal_state).toBe("upstream_transport_disconnect");
  });
});

describe("vLLM", () => {
  test("a tool call: header fragment without arguments, then argument fragments, [DONE]", async () => {
    const r = await replay("vllm-2025-04-stream-toolcall.sse", { chunkBytes: 64 });
    expect(r.chunks[0]).toEqual({ tool_calls: [{ index: 0, id: "chatcmpl-tool-ca99dda515524c6abe47d1ea22813507", name: "run_command" }], tokens: 1 });
    expect(toolCalls(r)).toEqual([{ id: "chatcmpl-tool-ca99dda515524c6abe47d1ea22813507", name: "run_command", arguments: '{"command": "ls"}' }]);
    expect(ended(r)).toMatchObject({ terminal_state: "normal_done", finish_reason: "tool_calls" });
  });

  test.each([
    ["vllm-0.9.0-stream-missing-finish-reason-abridged.sse", "안녕"],
    ["vllm-2024-07-stream-role-without-content-segment.sse", "我是阿里云开发的一款"],
    ["vllm-2025-03-stream-role-then-content-segment.sse", "Here's a poem"],
  ])("%s: relayed as %p, then truncated", async (file, text) => {
    const r = await replay(file, { chunkBytes: 5 }); // splits inside multi-byte UTF-8 sequences
    expect(r.text).toBe(text);
    expect(ended(r)?.terminal_state).toBe("upstream_transport_disconnect");
  });

  test("final chunk with content '' and stop_reason null", async () => {
    const r = await replay("vllm-2025-06-stream-final-chunk-stop-reason.sse", { appendDone: true });
    expect(r.text).toBe("가요?");
    expect(ended(r)).toMatchObject({ terminal_state: "normal_done", finish_reason: "stop" });
  });

  test.each(["vllm-error-legacy-object-error.json", "vllm-error-0.10.1-nested-error.json"])("%s (400) → declined context_exceeded", async (file) => {
    expect((await replay(file, { status: 400 })).outcome).toEqual({ kind: "declined", code: "context_exceeded" });
  });
});

describe("LM Studio", () => {
  test("last chunks as printed, a separate finish chunk, [DONE], no usage", async () => {
    const r = await replay("lmstudio-2025-05-stream-payloads-as-printed.txt");
    expect(r.chunks).toEqual([{ content: "\n", tokens: 1 }]);
    expect(ended(r)).toEqual({ terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: ESTIMATED_INPUT, output_tokens: 0 } });
  });

  test("reasoning_content with role on every chunk (segment): nothing relayed → declined", async () => {
    expect((await replay("lmstudio-0.3.9-stream-reasoning-payloads-segment.jsonl")).outcome).toEqual({ kind: "declined", code: "internal" });
  });
});
