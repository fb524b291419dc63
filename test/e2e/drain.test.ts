// SIGTERM drain of the real `gateway serve` process: no new requests (503 coordinator_unavailable with
// Retry-After, /healthz 503), in-flight streams finish (finish_reason and [DONE]), providers get
// `drain`, then exit 0 — and a stream still running when the grace period ends is cut cleanly.
import { afterEach, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import OpenAI, { APIError } from "openai";
import { PROVIDER_CONNECT_PATH } from "../../src/compositionRoot.ts";
import { collectJsonLines, MAIN, spawnProvider, tempDir, waitFor, waitForRoutable, type ProviderProcess, type TestGateway } from "../support/harness.ts";

const messages = [{ role: "user" as const, content: "Tell a slow story." }];

interface ServeProcess {
  proc: ReturnType<typeof Bun.spawn>;
  port: number;
  events: Record<string, unknown>[];
  apiKey: string;
  /** Enough of a TestGateway for spawnProvider. */
  asTestGateway: TestGateway;
}

let cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

/** `gateway serve` as a child process on a random port, with a buyer key made by `gateway accounts create`. */
async function spawnServe(extraArgs: string[]): Promise<ServeProcess> {
  const dataDir = tempDir("gw-drain-");
  cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
  const created = Bun.spawnSync(["bun", MAIN, "accounts", "create", "--name", "drain", "--data-dir", dataDir]);
  expect(created.exitCode).toBe(0);
  const { api_key } = JSON.parse(created.stdout.toString());
  const proc = Bun.spawn(["bun", MAIN, "serve", "--data-dir", dataDir, "--port", "0", "--settlement-mode", "observe", ...extraArgs], { stdout: "pipe", stderr: "pipe" });
  cleanup.push(() => {
    if (proc.exitCode === null) proc.kill("SIGKILL");
  });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  await waitFor(() => events.some((e) => e.event === "gateway_listening"), 10_000, "gateway_listening");
  const port = events.find((e) => e.event === "gateway_listening")!.port as number;
  const url = `http://127.0.0.1:${port}`;
  const asTestGateway = {
    url,
    baseURL: `${url}/v1`,
    wsUrl: `ws://127.0.0.1:${port}${PROVIDER_CONNECT_PATH}`,
    apiKey: api_key,
    dataDir,
  } as TestGateway;
  return { proc, port, events, apiKey: api_key, asTestGateway };
}

async function startProvider(gw: ServeProcess, tokensPerSecond: number): Promise<ProviderProcess> {
  const provider = spawnProvider(gw.asTestGateway, { id: "drain-prov", tokensPerSecond, maxConcurrency: 4 });
  cleanup.push(() => provider.kill());
  await provider.waitForEvent("welcome", undefined, 10_000);
  await waitForRoutable(gw.asTestGateway.url); // the gateway is another process
  return provider;
}

/** Reads a raw SSE body to its end. */
async function readAll(reader: { read(): Promise<{ done: boolean; value?: Uint8Array }> }, first: string): Promise<string> {
  const decoder = new TextDecoder();
  let text = first;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return text;
    text += decoder.decode(value, { stream: true });
  }
}

test("SIGTERM: in-flight streams finish with [DONE], new requests get 503, the provider gets drain, exit 0", async () => {
  const gw = await spawnServe(["--drain-grace-ms", "20000"]);
  const provider = await startProvider(gw, 12);
  const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.asTestGateway.baseURL, maxRetries: 0 });

  // Two streams in flight (~1.5 s each): one read raw through the SDK's response, one iterated by the SDK.
  const raw = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 16, stream: true }).asResponse();
  expect(raw.status).toBe(200);
  const reader = raw.body!.getReader();
  const firstBytes = new TextDecoder().decode((await reader.read()).value);
  expect(firstBytes).toContain('"delta"');
  const sdkStream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 16, stream: true });
  const iterator = sdkStream[Symbol.asyncIterator]();
  const firstChunk = await iterator.next();
  expect(firstChunk.done).toBe(false);

  const signalledAt = performance.now();
  gw.proc.kill("SIGTERM");
  await provider.waitForEvent("drain_received", undefined, 5000);

  // New work is refused while the streams finish.
  const refused = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 4 }).catch((e) => e);
  expect(refused).toBeInstanceOf(APIError);
  expect(refused.status).toBe(503);
  expect(refused.code).toBe("coordinator_unavailable");
  expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0);
  const health = await fetch(`${gw.asTestGateway.url}/healthz`);
  expect(health.status).toBe(503);
  expect(await health.json()).toMatchObject({ ok: false, status: "draining" });

  // Both in-flight streams complete normally.
  const rawText = await readAll(reader, firstBytes);
  expect(rawText.endsWith("data: [DONE]\n\n")).toBe(true);
  expect(rawText).toContain('"finish_reason":"length"');
  expect(rawText).not.toContain('"error"');
  let finishReason: string | null | undefined;
  let deltas = 1;
  for (let r = await iterator.next(); !r.done; r = await iterator.next()) {
    finishReason = r.value.choices[0]?.finish_reason ?? finishReason;
    if (r.value.choices[0]?.delta.content) deltas++;
  }
  expect(finishReason).toBe("length");
  expect(deltas).toBe(16);

  // Then the process exits 0, well before the 20 s grace period: it stops as soon as it is idle.
  expect(await gw.proc.exited).toBe(0);
  expect(performance.now() - signalledAt).toBeLessThan(10_000);
  const names = gw.events.map((e) => e.event);
  expect(names).toContain("gateway_draining");
  expect(names).toContain("gateway_stopped");
  expect(gw.events.filter((e) => e.event === "request_completed" && e.outcome === "succeeded")).toHaveLength(2);
  expect(gw.events.filter((e) => e.event === "request_completed" && e.status === 503)).toHaveLength(1);
}, 30_000);

test("a stream still running when the grace period ends is cut with an in-band error, and the process exits 0", async () => {
  const gw = await spawnServe(["--drain-grace-ms", "300"]);
  await startProvider(gw, 5);
  const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.asTestGateway.baseURL, maxRetries: 0 });
  // ~20 s of output: far longer than the grace period.
  const raw = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 100, stream: true }).asResponse();
  const reader = raw.body!.getReader();
  const firstBytes = new TextDecoder().decode((await reader.read()).value);

  const signalledAt = performance.now();
  gw.proc.kill("SIGTERM");
  const text = await readAll(reader, firstBytes);
  expect(text).not.toContain("[DONE]");
  expect(text).toContain('"code":"provider_disconnected"');
  expect(await gw.proc.exited).toBe(0);
  // Grace (300 ms) plus the bounded flush (≤ 1 s) plus process teardown.
  expect(performance.now() - signalledAt).toBeLessThan(5000);
}, 30_000);
