// The openai engine against a fault-injecting mock upstream: every fault ends with the outcome the
// spec's rule demands (declined before output, an error terminal state after it, never a truncated
// normal_done), within bounded time, and the upstream connection is always released.
import { afterAll, describe, expect, test } from "bun:test";
import { createOpenAIEngine, type OpenAIEngineOptions } from "../../src/provider/openai/index.ts";
import { MOCK_PROMPT_TOKENS, MOCK_TOKENS, parseScenario, startMockUpstream, type Scenario } from "../support/mockUpstream.ts";
import { ended, runJob } from "./openai-support.ts";
import { waitFor } from "../support/harness.ts";

const FIRST_TOKEN_MS = 300;
const IDLE_MS = 200;
const mock = startMockUpstream();
afterAll(() => mock.close());

const engine = (options: Partial<OpenAIEngineOptions> = {}) =>
  createOpenAIEngine({ upstream: mock.url, firstTokenTimeoutMs: FIRST_TOKEN_MS, idleTimeoutMs: IDLE_MS, ...options });

/** Runs one job whose upstream behaves as `scenario`. */
async function run(scenario: Scenario | Scenario["kind"], options: Parameters<typeof runJob>[1] = {}) {
  mock.next(scenario);
  const result = await runJob(engine(), options);
  // Whatever happened, the engine let go of the upstream connection.
  await waitFor(() => mock.open === 0, 1000, "the upstream connection to be released");
  return result;
}

const fullText = MOCK_TOKENS.join("");
const prefix = (n: number) => MOCK_TOKENS.slice(0, n).join("");

describe("happy paths", () => {
  test("a stream: one chunk per content delta, one token each, finish and prompt tokens from the upstream", async () => {
    const r = await run("happy");
    expect(ended(r)).toEqual({ terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: MOCK_PROMPT_TOKENS, output_tokens: 0 } });
    expect(r.chunks).toEqual(MOCK_TOKENS.map((content) => ({ content, tokens: 1 })));
  });

  test("max_tokens below the answer: the upstream's finish_reason length passes through", async () => {
    const r = await run("happy", { job: { params: { max_tokens: 3 } } });
    expect(ended(r)?.finish_reason).toBe("length");
    expect(r.text).toBe(prefix(3));
  });

  test("an upstream that answers without streaming: one chunk with the reported completion tokens", async () => {
    const r = await run("nonstream");
    expect(ended(r)?.terminal_state).toBe("normal_done");
    expect(r.chunks).toEqual([{ content: fullText, tokens: MOCK_TOKENS.length }]);
  });

  test("reasoning deltas are not relayed and not charged; the answer is", async () => {
    const r = await run("reasoning");
    expect(r.text).toBe(fullText);
    expect(r.chunks.every((c) => c.tokens === 1)).toBe(true);
    expect(ended(r)?.terminal_state).toBe("normal_done");
  });

  test("per-chunk cumulative counts (vLLM continuous_usage_stats) set each chunk's tokens", async () => {
    const r = await run("usage-per-chunk");
    expect(r.chunks.map((c) => c.tokens)).toEqual(MOCK_TOKENS.map(() => 2));
  });

  test("tool calls stream as indexed fragments and finish with tool_calls", async () => {
    const r = await run("tools");
    expect(r.chunks).toEqual([
      { tool_calls: [{ index: 0, id: "call_mock1", name: "get_weather" }], tokens: 1 },
      { tool_calls: [{ index: 0, arguments: '{"city":' }], tokens: 1 },
      { tool_calls: [{ index: 0, arguments: '"Paris"}' }], tokens: 1 },
    ]);
    expect(ended(r)?.finish_reason).toBe("tool_calls");
  });

  test("prompt tokens are capped at the gateway's own bound (docs/receipts.md)", async () => {
    const job = { messages: [{ role: "user", content: "hi" }] };
    const r = await run({ kind: "happy", promptTokens: 1_000_000 }, { job });
    expect(ended(r)?.usage.input_tokens).toBe(16 + 8 + 2);
  });
});

describe("before any output → declined, so the gateway fails over", () => {
  test.each([
    ["rate limited without Retry-After", "rate-limit", "queue_full"],
    ["rate limited with Retry-After (no local retry)", "rate-limit-retry-after", "queue_full"],
    ["a 500", "server-500", "internal"],
    ["a 503 (model loading)", "server-503", "queue_full"],
    ["a context-length 400", "context-400", "context_exceeded"],
    ["another 400", "bad-request-400", "internal"],
    ["a model 404", "not-found-404", "model_not_loaded"],
    ["a 401 (wrong upstream key)", "auth-401", "internal"],
    ["a connection reset", "reset-before", "internal"],
    ["a malformed first event", "malformed-first", "internal"],
    ["llama.cpp's legacy `error:` field (context overflow in a 200 stream)", "legacy-error-field", "context_exceeded"],
    ["an in-band error event before any token", "error-event-mid:0", "internal"],
    ["a stream cut before any token", "cut-mid:0", "internal"],
    ["a stream that stalls before any token", "stall-mid:0", "internal"],
  ] as const)("%s → declined %s", async (_, name, code) => {
    const r = await run(parseScenario(name)!);
    expect(r.outcome).toEqual({ kind: "declined", code });
    expect(r.chunks).toHaveLength(0);
    expect(r.ms).toBeLessThan(FIRST_TOKEN_MS + 700);
  });

  test("an upstream that never answers → declined after the first-token timeout", async () => {
    const r = await run("never");
    expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
    expect(r.ms).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 5);
    expect(r.ms).toBeLessThan(FIRST_TOKEN_MS + 500);
  });

  test("a first token slower than the timeout → declined; a slow one within it is served", async () => {
    const slow = await run({ kind: "slow-first", delayMs: 2000 });
    expect(slow.outcome).toEqual({ kind: "declined", code: "internal" });
    expect(slow.ms).toBeLessThan(FIRST_TOKEN_MS + 500);
    const ok = await run({ kind: "slow-first", delayMs: 100 });
    expect(ended(ok)?.terminal_state).toBe("normal_done");
    expect(ok.text).toBe(fullText);
  });

  test("nobody listening on the upstream port → declined internal", async () => {
    const closed = startMockUpstream();
    const url = closed.url;
    await closed.close();
    const r = await runJob(createOpenAIEngine({ upstream: url, firstTokenTimeoutMs: FIRST_TOKEN_MS }));
    expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
  });
});

describe("after output → an error terminal state, never normal_done", () => {
  test.each([
    ["a connection reset", "upstream_transport_disconnect", { kind: "reset-mid", at: 3 }, 3],
    ["a stream cut halfway (clean close, no finish)", "upstream_transport_disconnect", { kind: "cut-mid", at: 3 }, 3],
    ["a stream that stalls halfway", "upstream_transport_disconnect", { kind: "stall-mid", at: 3 }, 3],
    ["a malformed event", "provider_error", { kind: "malformed-mid", at: 3 }, 3],
    ["an in-band error event, then [DONE]", "provider_error", { kind: "error-event-mid", at: 3 }, 3],
  ] as const)("%s → %s", async (_, terminal, scenario, relayed) => {
    const r = await run(scenario as Scenario);
    expect(ended(r)?.terminal_state).toBe(terminal);
    expect(ended(r)?.finish_reason).toBeNull();
    expect(r.text).toBe(prefix(relayed));
    expect(r.ms).toBeLessThan(IDLE_MS + 700);
  });

  test("finish and usage, then a clean close without [DONE] → normal_done (the answer was complete)", async () => {
    const r = await run({ kind: "no-done" });
    expect(ended(r)?.terminal_state).toBe("normal_done");
    expect(r.text).toBe(prefix(MOCK_TOKENS.length));
  });

  test("a stall is detected by the idle timeout, not earlier", async () => {
    const r = await run({ kind: "stall-mid", at: 2 });
    expect(r.ms).toBeGreaterThanOrEqual(IDLE_MS - 5);
  });
});

describe("cancel", () => {
  test("a gateway cancel mid-stream aborts the upstream call at once", async () => {
    const r = await run({ kind: "happy", intervalMs: 100 }, { cancelAfter: { chunks: 2, reason: "buyer_cancel" } });
    expect(ended(r)?.terminal_state).toBe("buyer_cancel");
    expect(r.text).toBe(prefix(2));
    expect(r.ms).toBeLessThan(300); // 2 chunks, 100 ms apart; the rest of the answer is not awaited
  });

  test("a cancel while the upstream has not answered returns at once with the cancel's reason", async () => {
    const r = await run("never", { cancelAfter: { ms: 50, reason: "gateway_timeout" } });
    expect(ended(r)?.terminal_state).toBe("gateway_timeout");
    expect(r.ms).toBeLessThan(FIRST_TOKEN_MS);
  });

  test("a job cancelled before it starts sends no request", async () => {
    const before = mock.requests.length;
    const r = await runJob(engine(), { cancelAfter: { chunks: 0, reason: "buyer_cancel" } });
    expect(ended(r)?.terminal_state).toBe("buyer_cancel");
    expect(mock.requests.length).toBe(before);
  });
});

describe("the upstream request", () => {
  test("carries messages and params, streams with usage, maps the model name, sends the bearer", async () => {
    const keyed = startMockUpstream({ requireKey: "sk-local" });
    try {
      const e = createOpenAIEngine({ upstream: `${keyed.url}/v1/`, apiKey: "sk-local", modelNames: { "test-model": "llama3.2:1b" } });
      const params = {
        max_tokens: 50,
        temperature: 0.5,
        top_p: 0.9,
        stop: ["\n\n"],
        seed: 7,
        tools: [{ type: "function", function: { name: "f", parameters: {} } }],
        tool_choice: "auto",
        response_format: { type: "json_object" },
      };
      const messages = [
        { role: "system", content: "be brief" },
        { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] },
        { role: "tool", content: "42", tool_call_id: "c1" },
        { role: "user", content: "and?" },
      ];
      const r = await runJob(e, { job: { params, messages } });
      expect(ended(r)?.terminal_state).toBe("normal_done");
      const [request] = keyed.requests;
      expect(request?.path).toBe("/v1/chat/completions");
      expect(request?.authorization).toBe("Bearer sk-local");
      expect(request?.body).toEqual({ model: "llama3.2:1b", messages, ...params, stream: true, stream_options: { include_usage: true } });
    } finally {
      await keyed.close();
    }
  });

  test("no Authorization header without a key; a wrong key is a decline", async () => {
    const keyed = startMockUpstream({ requireKey: "sk-local" });
    try {
      const r = await runJob(createOpenAIEngine({ upstream: keyed.url }));
      expect(keyed.requests[0]?.authorization).toBeNull();
      expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
    } finally {
      await keyed.close();
    }
  });

  test("concurrent jobs do not interfere", async () => {
    const e = engine();
    mock.next({ kind: "happy", intervalMs: 10 }, { kind: "reset-mid", at: 2, intervalMs: 10 }, { kind: "happy", intervalMs: 10 });
    const runs = await Promise.all([runJob(e), runJob(e), runJob(e)]);
    const states = runs.map((r) => ended(r)?.terminal_state).sort();
    expect(states).toEqual(["normal_done", "normal_done", "upstream_transport_disconnect"]);
  });
});

describe("bodies a server might send (injected fetch)", () => {
  const answering = (body: string, contentType = "text/event-stream", status = 200) =>
    createOpenAIEngine({ upstream: "http://upstream.invalid", fetch: async () => new Response(body, { status, headers: { "content-type": contentType } }) });
  const chunk = (delta: object, finish: string | null = null) => `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

  test.each([
    ["`event: error` before output", "event: error\ndata: {\"message\":\"exceeds the available context size\"}\n\n", { kind: "declined", code: "context_exceeded" }],
    ["only [DONE] (vLLM dropping an early error)", "data: [DONE]\n\n", { kind: "declined", code: "internal" }],
    ["an empty 200 body (LM Studio, prompt over the context)", "", { kind: "declined", code: "internal" }],
  ] as const)("%s", async (_, body, outcome) => {
    expect((await runJob(answering(body))).outcome).toEqual(outcome);
  });

  test("[DONE] after output but without any finish_reason → provider_error", async () => {
    const r = await runJob(answering(chunk({ content: "Hi" }) + "data: [DONE]\n\n"));
    expect(ended(r)?.terminal_state).toBe("provider_error");
    expect(r.text).toBe("Hi");
  });

  test("content on the finish chunk (vLLM length cut) is relayed before the finish", async () => {
    const r = await runJob(answering(chunk({ content: "Hi" }) + chunk({ content: " there" }, "length") + "data: [DONE]"));
    expect(r.text).toBe("Hi there");
    expect(ended(r)).toMatchObject({ terminal_state: "normal_done", finish_reason: "length" });
  });

  test("a 200 JSON body holding an error → declined by its text", async () => {
    const r = await runJob(answering('{"error":"model \\"x\\" not found"}', "application/json"));
    expect(r.outcome).toEqual({ kind: "declined", code: "internal" });
  });

  test("a fetch that rejects (DNS, TLS, refused) → declined internal", async () => {
    const e = createOpenAIEngine({ upstream: "http://upstream.invalid", fetch: () => Promise.reject(new TypeError("fetch failed")) });
    expect((await runJob(e)).outcome).toEqual({ kind: "declined", code: "internal" });
  });
});
