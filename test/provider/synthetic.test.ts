import { describe, expect, test } from "bun:test";
import type { EngineChunk, EngineOutcome } from "../../src/provider/engine.ts";
import {
  createSyntheticEngine,
  estimateInputTokens,
  parseSyntheticFault,
  syntheticPlan,
  syntheticText,
  type SyntheticOptions,
} from "../../src/provider/synthetic.ts";
import type { JobMessage } from "../../src/wire/frames.ts";
import { makeJob } from "./fake-gateway.ts";

const ask = (content: string): JobMessage[] => [{ role: "system", content: "be brief" }, { role: "user", content }];

describe("syntheticText", () => {
  test("is deterministic in the last user message and looks like sentences", () => {
    const a = syntheticText(ask("Why is the sky blue?"), 1000);
    expect(syntheticText(ask("Why is the sky blue?"), 1000)).toEqual(a);
    expect(syntheticText([...ask("Why is the sky blue?"), { role: "assistant", content: "x" }], 1000)).toEqual(a);
    expect(syntheticText(ask("Why is the grass green?"), 1000)).not.toEqual(a);
    const text = a.join("");
    expect(text).toMatch(/^The [a-z ,.]+\.$/i);
    expect(a.slice(0, -1).every((t) => t.endsWith(" "))).toBe(true);
    expect(a.at(-1)).toEndWith(".");
  });

  test.each(["", "hi", "Tell me a story", "x".repeat(10_000), "日本語のプロンプト", "What is 2+2?"])(
    "produces 12..48 tokens for %p",
    (prompt) => {
      const n = syntheticText(ask(prompt), 1000).length;
      expect(n).toBeGreaterThanOrEqual(12);
      expect(n).toBeLessThanOrEqual(48);
    },
  );

  test.each([1, 5, 11])("respects max_tokens = %i with a prefix of the full answer and finish_reason length", (max) => {
    const full = syntheticPlan(ask("Tell me a story"), 1000);
    const cut = syntheticPlan(ask("Tell me a story"), max);
    expect(full.finishReason).toBe("stop");
    expect(cut.tokens).toEqual(full.tokens.slice(0, max));
    expect(cut.finishReason).toBe("length");
  });

  test("max_tokens equal to the answer length is not a truncation", () => {
    const n = syntheticText(ask("hello"), 1000).length;
    expect(syntheticPlan(ask("hello"), n).finishReason).toBe("stop");
  });

  test("input tokens: UTF-8 bytes of all contents / 4, rounded up, at least 1", () => {
    expect(estimateInputTokens([{ role: "user", content: "" }])).toBe(1);
    expect(estimateInputTokens([{ role: "user", content: "abcde" }])).toBe(2);
    expect(estimateInputTokens([{ role: "user", content: "日本" }, { role: "assistant", content: null }])).toBe(2);
  });
});

test.each([
  ["none", { kind: "none" }],
  ["decline", { kind: "decline" }],
  ["stall", { kind: "stall" }],
  ["exit-before-first-chunk", { kind: "exit-before-first-chunk" }],
  ["exit-after:3", { kind: "exit-after", n: 3 }],
  ["error-after:0", { kind: "error-after", n: 0 }],
  ["stall-after:1", { kind: "stall-after", n: 1 }],
  ["stall-after", null],
  ["exit-after", null],
  ["error-after:-1", null],
  ["explode", null],
])("parseSyntheticFault(%p)", (spec, expected) => {
  expect(parseSyntheticFault(spec)).toEqual(expected as ReturnType<typeof parseSyntheticFault>);
});

/** Runs one job on the engine with recorded delays; `onChunk` may abort. */
async function runEngine(options: SyntheticOptions, onChunk?: (n: number, controller: AbortController) => void) {
  const delays: number[] = [];
  const chunks: EngineChunk[] = [];
  const controller = new AbortController();
  let accepted = 0;
  let died = 0;
  const engine = createSyntheticEngine({
    ...options,
    delay: async (ms) => {
      delays.push(ms);
    },
  });
  const job = makeJob({ messages: ask("Tell me about rivers."), params: { max_tokens: 1000 } });
  const pending = engine.run({
    job,
    signal: controller.signal,
    accept: () => accepted++,
    emit: (chunk) => {
      chunks.push(chunk);
      onChunk?.(chunks.length, controller);
    },
    die: () => died++,
  });
  return { pending, controller, delays, chunks, accepted: () => accepted, died: () => died };
}

const expected = syntheticText(ask("Tell me about rivers."), 1000);
const ended = (o: EngineOutcome) => (o.kind === "ended" ? o.result : null);

describe("synthetic engine", () => {
  test("emits one token per chunk, paced by ttft and tokens per second", async () => {
    const run = await runEngine({ ttftMs: 30, tokensPerSecond: 100 });
    const result = ended(await run.pending);
    expect(run.chunks.map((c) => c.content)).toEqual(expected);
    expect(run.chunks.every((c) => c.tokens === 1)).toBe(true);
    expect(run.delays).toEqual([30, ...Array(expected.length - 1).fill(10)]);
    expect(run.accepted()).toBe(1);
    expect(result).toEqual({
      terminal_state: "normal_done",
      finish_reason: "stop",
      usage: { input_tokens: estimateInputTokens(makeJob({ messages: ask("Tell me about rivers.") }).messages), output_tokens: expected.length },
    });
  });

  test.each(["buyer_cancel", "gateway_timeout"] as const)("stops promptly on abort (%s) with usage of what was emitted", async (reason) => {
    const run = await runEngine({ tokensPerSecond: 0 }, (n, controller) => n === 3 && controller.abort(reason));
    const result = ended(await run.pending);
    expect(run.chunks).toHaveLength(3);
    expect(result?.terminal_state).toBe(reason);
    expect(result?.finish_reason).toBeNull();
    expect(result?.usage.output_tokens).toBe(3);
  });

  test("decline fault declines with internal before accepting", async () => {
    const run = await runEngine({ fault: { kind: "decline" } });
    expect(await run.pending).toEqual({ kind: "declined", code: "internal" });
    expect(run.accepted()).toBe(0);
  });

  test("stall fault accepts, sends nothing, and ends when cancelled", async () => {
    const run = await runEngine({ fault: { kind: "stall" } });
    expect(run.accepted()).toBe(1);
    run.controller.abort("buyer_cancel");
    const result = ended(await run.pending);
    expect(run.chunks).toHaveLength(0);
    expect(result?.terminal_state).toBe("buyer_cancel");
    expect(result?.usage.output_tokens).toBe(0);
  });

  test("stall-after fault sends N chunks, then holds the job until it is cancelled", async () => {
    const run = await runEngine({ fault: { kind: "stall-after", n: 2 }, tokensPerSecond: 0 });
    await Bun.sleep(10);
    expect(run.chunks).toHaveLength(2);
    expect(await Promise.race([run.pending, Bun.sleep(20).then(() => "still running")])).toBe("still running");
    run.controller.abort("buyer_cancel");
    const result = ended(await run.pending);
    expect(result?.terminal_state).toBe("buyer_cancel");
    expect(result?.usage.output_tokens).toBe(2);
  });

  test.each([
    [{ kind: "exit-before-first-chunk" } as const, 0, 1],
    [{ kind: "exit-after", n: 2 } as const, 2, 1],
    [{ kind: "exit-after", n: 10_000 } as const, expected.length, 1],
    [{ kind: "error-after", n: 4 } as const, 4, 0],
  ])("fault %o: %i chunks, die() called %i times, then provider_error", async (fault, chunks, died) => {
    const run = await runEngine({ fault, tokensPerSecond: 0 });
    const result = ended(await run.pending);
    expect(run.chunks).toHaveLength(chunks);
    expect(run.died()).toBe(died);
    expect(result?.terminal_state).toBe("provider_error");
    expect(result?.usage.output_tokens).toBe(chunks);
  });

  test("the default delay is abortable: a long ttft ends at once on cancel", async () => {
    const controller = new AbortController();
    const engine = createSyntheticEngine({ ttftMs: 60_000 });
    const pending = engine.run({ job: makeJob(), signal: controller.signal, accept() {}, emit() {}, die() {} });
    const started = performance.now();
    controller.abort("buyer_cancel");
    expect(ended(await pending)?.terminal_state).toBe("buyer_cancel");
    expect(performance.now() - started).toBeLessThan(500);
  });
});
