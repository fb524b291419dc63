// Failover before the first buyer-visible byte, mid-stream loss after it, and buyer cancellation —
// the openai SDK against a real gateway and real provider processes with injected faults.
import { afterEach, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

const messages = [{ role: "user" as const, content: "Describe a lighthouse." }];
const expected = (maxTokens: number) => syntheticText(messages, maxTokens).join("");

let gw: TestGateway | undefined;
let providers: ProviderProcess[] = [];

afterEach(async () => {
  await Promise.all(providers.map((p) => p.kill()));
  providers = [];
  await gw?.close();
  gw = undefined;
});

/** A faulty provider named to sort first (routing breaks ties by id), and a healthy one. */
async function setup(fault: string, overrides = {}) {
  gw = await startTestGateway({ firstByteTimeoutMs: 400, ...overrides });
  providers = [spawnProvider(gw, { id: "a-faulty", fault }), spawnProvider(gw, { id: "z-healthy" })];
  await waitForReadyProviders(gw, 2);
  return new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
}

async function streamText(client: OpenAI, maxTokens = 12) {
  const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: maxTokens, stream: true });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  return text;
}

describe("failover before the first byte is invisible to the buyer", () => {
  test.each([
    ["declined", "decline"],
    ["dying before its first chunk", "exit-before-first-chunk"],
    ["not answering within the first-byte timeout", "stall"],
  ])("a provider %s: the stream is served by another", async (_, fault) => {
    const client = await setup(fault);
    expect(await streamText(client)).toBe(expected(12));
    const faulty = providers[0]!;
    await faulty.waitForEvent("job_received");
  });

  test("non-streaming requests fail over too", async () => {
    const client = await setup("decline");
    const res = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 12 });
    expect(res.choices[0]!.message.content).toBe(expected(12));
  });

  test("a non-streaming request fails over even after partial output (nothing was written yet)", async () => {
    const client = await setup("exit-after:3");
    const res = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 12 });
    expect(res.choices[0]!.message.content).toBe(expected(12));
  });

  test("every provider failing → one clean 503 coordinator_unavailable, nothing hangs", async () => {
    gw = await startTestGateway({ firstByteTimeoutMs: 300 });
    providers = [spawnProvider(gw, { id: "p-decline", fault: "decline" }), spawnProvider(gw, { id: "p-stall", fault: "stall" })];
    await waitForReadyProviders(gw, 2);
    const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
    const started = performance.now();
    const error = await client.chat.completions.create({ model: "test-model", messages, stream: true }).catch((e) => e);
    expect(error).toBeInstanceOf(APIError);
    expect(error.status).toBe(503);
    expect(error.code).toBe("coordinator_unavailable");
    expect(error.headers.get("retry-after")).toBe("1");
    expect(performance.now() - started).toBeLessThan(3000);
    // The stalled provider got a cancel for its timed-out attempt, and both slots are free again.
    await providers[1]!.waitForEvent("cancel_received");
    await waitFor(() => gw!.gateway.registry.attempts.size === 0, 2000, "attempts released");
  });
});

describe("after the first byte", () => {
  test("a provider dying mid-stream → the SDK raises provider_disconnected", async () => {
    gw = await startTestGateway();
    providers = [spawnProvider(gw, { id: "dies", fault: "exit-after:3" })];
    await waitForReadyProviders(gw, 1);
    const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
    let text = "";
    const error = await (async () => {
      const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 20, stream: true });
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    })().catch((e) => e);
    expect(error).toBeInstanceOf(APIError);
    expect(String(error.message) + JSON.stringify(error.error)).toContain("provider_disconnected");
    expect(text).toBe(syntheticText(messages, 20).slice(0, 3).join(""));
  });

  test("on the wire: exactly one in-band error frame and no [DONE]", async () => {
    gw = await startTestGateway();
    providers = [spawnProvider(gw, { id: "dies", fault: "error-after:2" })];
    await waitForReadyProviders(gw, 1);
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "test-model", messages, max_tokens: 20, stream: true }),
    });
    expect(res.status).toBe(200);
    const frames = (await res.text()).split("\n\n").filter(Boolean);
    const errors = frames.filter((f) => f.includes('"error"'));
    expect(errors).toHaveLength(1);
    expect(JSON.parse(errors[0]!.slice("data: ".length)).error).toMatchObject({ code: "provider_disconnected", type: "server_error", retryable: true });
    expect(frames.at(-1)).toBe(errors[0]);
    expect(frames).not.toContain("data: [DONE]");
  });

  test("aborting the SDK mid-stream cancels the provider job within 1 s and frees its slot", async () => {
    gw = await startTestGateway();
    providers = [spawnProvider(gw, { id: "slow", tokensPerSecond: 20, maxConcurrency: 1 })];
    await waitForReadyProviders(gw, 1);
    const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: "test-model", messages, max_tokens: 100, stream: true },
      { signal: controller.signal },
    );
    let seen = 0;
    const consumed = (async () => {
      for await (const chunk of stream) if (chunk.choices[0]?.delta.content && ++seen === 2) controller.abort();
    })().catch((e) => e);
    await consumed;
    const abortedAt = performance.now();
    const cancel = await providers[0]!.waitForEvent("cancel_received", () => true, 1000);
    expect(performance.now() - abortedAt).toBeLessThan(1000);
    expect(cancel.reason).toBe("buyer_cancel");
    await waitFor(() => gw!.gateway.registry.attempts.size === 0, 1000, "slot released");
    // With max_concurrency 1, the next request is served by the same provider.
    expect(await streamText(client, 3)).toBe(expected(3));
  });
});
