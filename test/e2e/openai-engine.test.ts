// The real gateway with two `gateway provider --engine openai` processes, each in front of its own
// fault-injecting mock upstream, driven by the official openai SDK. "a-upstream" sorts first, so
// routing tries it first (ties break by provider id); "z-upstream" is always healthy.
// Every upstream fault ends as the spec says, within bounded time; with A's upstream still faulty,
// the next request is served by the healthy provider within 2 s, without touching A when the fault
// put it in cooldown (docs/routing.md); then routing's memory is cleared so A is first again.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { MOCK_TOKENS, startMockUpstream, type MockUpstream, type Scenario } from "../support/mockUpstream.ts";
import { spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

const FIRST_TOKEN_MS = 400;
const IDLE_MS = 300;
const BOUND_MS = 2500; // every request, faulty or not, is over well within this
const PROMPT = "Describe a lighthouse.";
const messages = [{ role: "user" as const, content: PROMPT }];
const fullText = MOCK_TOKENS.join("");

let gw: TestGateway;
let upstreamA: MockUpstream;
let upstreamB: MockUpstream;
let providers: ProviderProcess[] = [];
let client: OpenAI;

function spawnOpenAIProvider(id: string, upstream: MockUpstream): ProviderProcess {
  return spawnProvider(gw, {
    id,
    engine: "openai",
    extraArgs: [
      "--upstream", `${upstream.url}/v1`,
      "--upstream-key", "sk-local-test",
      "--upstream-model", "test-model=llama3.2:1b",
      "--upstream-first-token-timeout-ms", String(FIRST_TOKEN_MS),
      "--upstream-idle-timeout-ms", String(IDLE_MS),
    ],
  });
}

beforeAll(async () => {
  upstreamA = startMockUpstream({ requireKey: "sk-local-test" });
  upstreamB = startMockUpstream({ requireKey: "sk-local-test" });
  // The gateway's own timeouts sit above the providers', so a provider's decline is what fails over.
  gw = await startTestGateway({ firstByteTimeoutMs: 3000, streamIdleTimeoutMs: 3000 });
  providers = [spawnOpenAIProvider("a-upstream", upstreamA), spawnOpenAIProvider("z-upstream", upstreamB)];
  await waitForReadyProviders(gw, 2);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await Promise.all(providers.map((p) => p.kill()));
  await gw?.close();
  await Promise.all([upstreamA?.close(), upstreamB?.close()]);
});

beforeEach(async () => {
  upstreamA.scenario = "happy";
  upstreamB.scenario = "happy";
  // Each test starts with A first: no attempt of the one before still in flight (consolidation
  // prefers the busier provider), no cooldowns or dispatch shares from it.
  await waitFor(() => gw.gateway.registry.attempts.size === 0, 5000, "the previous test's attempts released");
  gw.gateway.routing.reset();
});

async function streamText(maxTokens?: number) {
  const stream = await client.chat.completions.create({ model: "test-model", messages, stream: true, max_tokens: maxTokens });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  return text;
}

/** Streams and collects text until the stream ends or throws; returns both. */
async function streamUntilError() {
  let text = "";
  const error = await (async () => {
    const stream = await client.chat.completions.create({ model: "test-model", messages, stream: true });
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  })().catch((e: unknown) => e);
  return { text, error };
}

/** After a fault: both providers are ready again and the next request streams normally through A. */
async function servesNextRequestNormally() {
  await waitFor(() => gw.gateway.registry.attempts.size === 0, 2000, "attempts released");
  await waitForReadyProviders(gw, 2);
  // A's runtime frees the faulty job's slot just after its decline went out (src/provider/runtime.ts):
  // a request arriving in between is declined there (queue_full) and served by the other provider —
  // correct, but not this check. So: A serves again within 2 s, and every answer meanwhile is whole.
  const deadline = performance.now() + 2000;
  for (;;) {
    const before = upstreamA.requests.length;
    expect(await streamText()).toBe(fullText);
    if (upstreamA.requests.length === before + 1) return;
    if (performance.now() > deadline) throw new Error("A did not serve again within 2 s of healing");
  }
}

/**
 * Right after a fault on A, with A's upstream still faulty: the next request is served by the healthy
 * provider within 2 s; when the fault cooled A (anything but a capacity or context decline), A is not
 * tried at all. Then A's upstream heals, routing forgets, and A serves again.
 */
async function nextServedByHealthy(cooled: boolean) {
  await waitFor(() => gw.gateway.registry.attempts.size === 0, 2000, "attempts released");
  expect(gw.gateway.routing.cooldowns.health("a-upstream", "test-model")).toBe(cooled ? "cooling" : "healthy");
  const beforeA = upstreamA.requests.length;
  const beforeB = upstreamB.requests.length;
  const started = performance.now();
  expect(await streamText()).toBe(fullText);
  expect(performance.now() - started).toBeLessThan(2000);
  expect(upstreamB.requests.length).toBe(beforeB + 1);
  if (cooled) expect(upstreamA.requests.length).toBe(beforeA);
  upstreamA.scenario = "happy";
  gw.gateway.routing.reset();
  await servesNextRequestNormally();
}

async function timed<T>(work: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await work();
  expect(performance.now() - started).toBeLessThan(BOUND_MS);
  return result;
}

describe("happy path", () => {
  test("streaming: the upstream's text, with the mapped model name and the upstream key", async () => {
    const before = upstreamA.requests.length;
    expect(await timed(() => streamText())).toBe(fullText);
    const request = upstreamA.requests[before]!;
    expect(request.body.model).toBe("llama3.2:1b");
    expect(request.authorization).toBe("Bearer sk-local-test");
    expect(request.body.messages).toEqual(messages);
    expect(request.body.stream).toBe(true);
  });

  test("an upstream that closes after its finish chunk without [DONE] still completes normally", async () => {
    upstreamA.scenario = { kind: "no-done" };
    upstreamB.scenario = { kind: "no-done" };
    try {
      expect(await timed(() => streamText())).toBe(fullText);
    } finally {
      upstreamA.scenario = "happy";
      upstreamB.scenario = "happy";
    }
  });

  test("non-streaming: one body with the upstream's finish and usage", async () => {
    const res = await timed(() => client.chat.completions.create({ model: "test-model", messages, max_tokens: 3 }));
    expect(res.choices[0]!.message.content).toBe(MOCK_TOKENS.slice(0, 3).join(""));
    expect(res.choices[0]!.finish_reason).toBe("length");
    expect(res.usage).toMatchObject({ prompt_tokens: 11, completion_tokens: 3 });
  });

  test("stream_options.include_usage: the usage chunk, then [DONE]", async () => {
    const stream = await client.chat.completions.create({ model: "test-model", messages, stream: true, stream_options: { include_usage: true } });
    let usage: unknown = null;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    expect(usage).toMatchObject({ prompt_tokens: 11, completion_tokens: MOCK_TOKENS.length });
  });
});

describe("upstream faults before any output: the other provider serves the request", () => {
  // [name, scenario, whether A cools: capacity (429, 503) and context declines are no verdict]
  test.each<[string, Scenario | Scenario["kind"], boolean]>([
    ["rate limited (429, no Retry-After)", "rate-limit", false],
    ["rate limited (429, Retry-After)", "rate-limit-retry-after", false],
    ["server error 500", "server-500", true],
    ["server error 503", "server-503", false],
    ["context-length 400", "context-400", false],
    ["other 400", "bad-request-400", true],
    ["model 404", "not-found-404", true],
    ["connection reset", "reset-before", true],
    ["never answers", "never", true],
    ["slow first token", { kind: "slow-first", delayMs: 5000 }, true],
    ["malformed first event", "malformed-first", true],
    ["ends without [DONE] before any token", { kind: "cut-mid", at: 0 }, true],
    ["in-band error event before any token", { kind: "error-event-mid", at: 0 }, true],
  ])("%s", async (_, scenario, cooled) => {
    upstreamA.scenario = scenario;
    const beforeA = upstreamA.requests.length;
    const beforeB = upstreamB.requests.length;
    expect(await timed(() => streamText())).toBe(fullText);
    expect(upstreamA.requests.length).toBe(beforeA + 1); // the fault was hit…
    expect(upstreamB.requests.length).toBe(beforeB + 1); // …and the request failed over
    await nextServedByHealthy(cooled);
  });

  test("non-streaming requests fail over too", async () => {
    upstreamA.scenario = "server-503";
    const res = await timed(() => client.chat.completions.create({ model: "test-model", messages }));
    expect(res.choices[0]!.message.content).toBe(fullText);
  });

  test("a first token slower than usual but within the timeout is served by the first provider", async () => {
    upstreamA.scenario = { kind: "slow-first", delayMs: 150 };
    const beforeB = upstreamB.requests.length;
    expect(await timed(() => streamText())).toBe(fullText);
    expect(upstreamB.requests.length).toBe(beforeB);
  });
});

describe("upstream faults after output: provider_disconnected in-band, no [DONE]", () => {
  test.each<[string, Scenario, string]>([
    ["connection reset mid-stream", { kind: "reset-mid", at: 3 }, "upstream_transport_disconnect"],
    ["stream cut halfway", { kind: "cut-mid", at: 3 }, "upstream_transport_disconnect"],
    ["stream stalled halfway", { kind: "stall-mid", at: 3 }, "upstream_transport_disconnect"],
    ["malformed event", { kind: "malformed-mid", at: 3 }, "provider_error"],
    ["in-band error event", { kind: "error-event-mid", at: 3 }, "provider_error"],
  ])("%s", async (_, scenario, terminal) => {
    upstreamA.scenario = scenario;
    const earlier = new Set(providers[0]!.events);
    const { text, error } = await timed(() => streamUntilError());
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).code).toBe("provider_disconnected");
    expect(text).toBe(MOCK_TOKENS.slice(0, 3).join(""));
    // (A late normal_done line of the previous test's follow-up request may still arrive: skip it.)
    const end = await providers[0]!.waitForEvent("job_ended", (e) => !earlier.has(e) && e.terminal_state !== "normal_done", 2000);
    expect(end.terminal_state).toBe(terminal);
    await nextServedByHealthy(true);
  });

  test("on the wire: exactly one in-band error frame, last, and no [DONE]", async () => {
    upstreamA.scenario = { kind: "reset-mid", at: 2 };
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "test-model", messages, stream: true }),
    });
    expect(res.status).toBe(200);
    const frames = (await res.text()).split("\n\n").filter(Boolean);
    const errors = frames.filter((f) => f.includes('"error"'));
    expect(errors).toHaveLength(1);
    expect(frames.at(-1)).toBe(errors[0]);
    expect(JSON.parse(errors[0]!.slice("data: ".length)).error).toMatchObject({ code: "provider_disconnected", retryable: true });
    expect(frames).not.toContain("data: [DONE]");
  });

  test("a non-streaming request fails over even after partial upstream output (nothing was written yet)", async () => {
    upstreamA.scenario = { kind: "reset-mid", at: 3 };
    const res = await timed(() => client.chat.completions.create({ model: "test-model", messages }));
    expect(res.choices[0]!.message.content).toBe(fullText);
  });
});

test("a buyer abort cancels the upstream call", async () => {
  upstreamA.scenario = { kind: "happy", intervalMs: 200 };
  const controller = new AbortController();
  const stream = await client.chat.completions.create({ model: "test-model", messages, stream: true }, { signal: controller.signal });
  await (async () => {
    for await (const chunk of stream) if (chunk.choices[0]?.delta.content) controller.abort();
  })().catch(() => {});
  await providers[0]!.waitForEvent("job_ended", (e) => e.terminal_state === "buyer_cancel", 2000);
  await waitFor(() => upstreamA.open === 0, 1000, "the upstream connection to close");
});

test("provider logs never hold the prompt, the output or the upstream key", () => {
  const logs = JSON.stringify(providers.flatMap((p) => p.events));
  expect(logs).toContain("upstream_call_ended");
  for (const secret of [PROMPT, "mock upstream", "sk-local-test", "CUDA out of memory", "Loading model"]) {
    expect(logs).not.toContain(secret);
  }
});
