// GET /metrics: valid Prometheus text exposition whose series move when real traffic flows (openai SDK →
// real gateway → real provider processes), per-gateway registries, the optional metrics token, and
// /healthz reporting running vs draining.
import { afterEach, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

/** One parsed sample: `name{labels} value`. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*";
const SAMPLE_LINE = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (\\S+)(?: (-?\\d+))?$`);
const LABEL = /\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"\s*(,|$)/y;

/**
 * A strict reader of the Prometheus text format (version 0.0.4): every line is a HELP/TYPE comment or a
 * sample; every sample belongs to a family whose TYPE came first (histogram samples via their
 * _bucket/_sum/_count suffixes); label values are properly escaped; values are floats, NaN or ±Inf.
 * Throws on anything else.
 */
function parseExposition(text: string): { samples: Sample[]; types: Map<string, string> } {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  if (!text.endsWith("\n")) throw new Error("exposition must end with a newline");
  for (const line of text.split("\n")) {
    if (line === "") continue;
    if (line.startsWith("#")) {
      const m = new RegExp(`^# (HELP|TYPE) (${NAME}) (.*)$`).exec(line);
      if (!m) throw new Error(`bad comment line: ${line}`);
      if (m[1] === "TYPE") {
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(m[3]!)) throw new Error(`bad type: ${line}`);
        if (types.has(m[2]!)) throw new Error(`TYPE given twice: ${line}`);
        types.set(m[2]!, m[3]!);
      }
      continue;
    }
    const m = SAMPLE_LINE.exec(line);
    if (!m) throw new Error(`bad sample line: ${line}`);
    const [, name, rawLabels, rawValue] = m;
    const family = types.has(name!) ? name! : name!.replace(/_(bucket|sum|count)$/, "");
    if (!types.has(family)) throw new Error(`sample before its TYPE: ${line}`);
    const labels: Record<string, string> = {};
    if (rawLabels) {
      LABEL.lastIndex = 0;
      while (LABEL.lastIndex < rawLabels.length) {
        const l = LABEL.exec(rawLabels);
        if (!l) throw new Error(`bad labels: ${line}`);
        labels[l[1]!] = l[2]!.replace(/\\(["\\n])/g, (_, c: string) => (c === "n" ? "\n" : c));
      }
    }
    const value = rawValue === "+Inf" ? Infinity : rawValue === "-Inf" ? -Infinity : rawValue === "NaN" ? NaN : Number(rawValue);
    if (!/^(NaN|[+-]Inf|-?\d+(\.\d+)?([eE][+-]?\d+)?)$/.test(rawValue!)) throw new Error(`bad value: ${line}`);
    samples.push({ name: name!, labels, value });
  }
  return { samples, types };
}

/** The value of the one sample with this name and (at least) these labels; 0 when absent. */
function valueOf(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  const hits = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (hits.length > 1) throw new Error(`${name} ${JSON.stringify(labels)} matches ${hits.length} series`);
  return hits[0]?.value ?? 0;
}

async function scrape(gw: TestGateway, headers: Record<string, string> = {}) {
  const res = await fetch(`${gw.url}/metrics`, { headers });
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/plain");
  return parseExposition(await res.text());
}

const messages = [{ role: "user" as const, content: "Count the stars." }];
const CHAT = { route: "/v1/chat/completions" };

let gateways: TestGateway[] = [];
let providers: ProviderProcess[] = [];
afterEach(async () => {
  await Promise.all(providers.map((p) => p.kill()));
  await Promise.all(gateways.map((g) => g.close()));
  providers = [];
  gateways = [];
});

async function gatewayWith(providerOpts: Parameters<typeof spawnProvider>[1][], overrides = {}) {
  const gw = await startTestGateway(overrides);
  gateways.push(gw);
  for (const o of providerOpts) providers.push(spawnProvider(gw, o));
  await waitForReadyProviders(gw, providerOpts.length);
  return { gw, client: new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 }) };
}

describe("/metrics", () => {
  test("parses as Prometheus text, and request, token, ttft, overhead, attempt and pool series move with traffic", async () => {
    const { gw, client } = await gatewayWith([{ id: "metrics-prov", maxConcurrency: 2, ttftMs: 20, tokensPerSecond: 400 }]);
    const before = await scrape(gw);
    for (const family of [
      "gateway_requests_total",
      "gateway_http_requests_total",
      "gateway_tokens_total",
      "gateway_attempts_total",
      "gateway_failovers_total",
      "gateway_settlements_total",
      "gateway_provider_sessions",
      "gateway_provider_free_slots",
      "gateway_warm_models",
      "gateway_time_to_first_token_seconds",
      "gateway_overhead_seconds",
      "gateway_request_duration_seconds",
    ]) {
      expect(before.types.has(family)).toBe(true);
    }
    expect(before.types.get("gateway_time_to_first_token_seconds")).toBe("histogram");
    expect(before.types.get("gateway_overhead_seconds")).toBe("histogram");
    // The pool as the provider reported it.
    expect(valueOf(before.samples, "gateway_provider_sessions", { tier: "provisional", state: "ready" })).toBe(1);
    expect(valueOf(before.samples, "gateway_provider_free_slots")).toBe(2);
    expect(valueOf(before.samples, "gateway_warm_models")).toBe(1);
    expect(valueOf(before.samples, "gateway_settlements_total", { label: "verified" })).toBe(0);
    expect(valueOf(before.samples, "gateway_tokens_total", { direction: "output" })).toBe(0);

    const stream = await client.chat.completions.create({
      model: "test-model",
      messages,
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    let streamUsage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) streamUsage = chunk.usage ?? streamUsage;
    const whole = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 5 });
    const unknownModel = await client.chat.completions.create({ model: "no-such-model", messages }).catch((e) => e);
    expect(unknownModel.status).toBe(404);

    const after = await scrape(gw);
    const s = after.samples;
    expect(valueOf(s, "gateway_requests_total", { ...CHAT, outcome: "succeeded", status: "200", stream: "yes" })).toBe(1);
    expect(valueOf(s, "gateway_requests_total", { ...CHAT, outcome: "succeeded", status: "200", stream: "no" })).toBe(1);
    expect(valueOf(s, "gateway_requests_total", { ...CHAT, outcome: "failed", status: "404", stream: "no" })).toBe(1);
    expect(valueOf(s, "gateway_http_requests_total", { ...CHAT, status: "200" })).toBe(2);
    const outputTokens = streamUsage!.completion_tokens + whole.usage!.completion_tokens;
    expect(outputTokens).toBeGreaterThan(0);
    expect(valueOf(s, "gateway_tokens_total", { direction: "output" })).toBe(outputTokens);
    expect(valueOf(s, "gateway_tokens_total", { direction: "input" })).toBe(streamUsage!.prompt_tokens + whole.usage!.prompt_tokens);
    expect(valueOf(s, "gateway_attempts_total", { outcome: "completed" })).toBe(2);
    expect(valueOf(s, "gateway_time_to_first_token_seconds_count", { stream: "yes" })).toBe(1);
    expect(valueOf(s, "gateway_time_to_first_token_seconds_count", { stream: "no" })).toBe(1);
    // The provider waits 20 ms before its first token: ttft includes it, overhead does not.
    expect(valueOf(s, "gateway_time_to_first_token_seconds_sum", { stream: "yes" })).toBeGreaterThanOrEqual(0.02);
    expect(valueOf(s, "gateway_overhead_seconds_count", { stream: "yes" })).toBe(1);
    const overhead = valueOf(s, "gateway_overhead_seconds_sum", { stream: "yes" });
    const total = valueOf(s, "gateway_request_duration_seconds_sum", { stream: "yes" });
    expect(overhead).toBeGreaterThanOrEqual(0);
    expect(overhead).toBeLessThan(total);
    // Bucket counts are cumulative and end with +Inf = count.
    expect(valueOf(s, "gateway_overhead_seconds_bucket", { stream: "yes", le: "+Inf" })).toBe(1);
    expect(valueOf(s, "gateway_live_requests")).toBe(0);
  });

  test("a failover is counted by how the failed attempt ended", async () => {
    // Routing breaks ties by id, so the declining provider is tried first.
    const { gw, client } = await gatewayWith([{ id: "a-declines", fault: "decline" }, { id: "z-healthy" }]);
    const res = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 4 });
    expect(res.choices[0]!.finish_reason).toBeTruthy();
    const { samples } = await scrape(gw);
    expect(valueOf(samples, "gateway_attempts_total", { outcome: "declined" })).toBe(1);
    expect(valueOf(samples, "gateway_attempts_total", { outcome: "completed" })).toBe(1);
    expect(valueOf(samples, "gateway_failovers_total", { after: "declined" })).toBe(1);
    expect(valueOf(samples, "gateway_requests_total", { ...CHAT, outcome: "succeeded", stream: "no" })).toBe(1);
  });

  test("each gateway has its own registry: two gateways in one process do not share series", async () => {
    const a = await gatewayWith([{ id: "prov-a" }]);
    const b = await startTestGateway();
    gateways.push(b);
    await a.client.chat.completions.create({ model: "test-model", messages, max_tokens: 3 });
    expect(valueOf((await scrape(a.gw)).samples, "gateway_requests_total", { ...CHAT, outcome: "succeeded" })).toBe(1);
    expect(valueOf((await scrape(b)).samples, "gateway_requests_total", { ...CHAT, outcome: "succeeded" })).toBe(0);
  });

  test("requests rejected before routing are counted too (outcome rejected)", async () => {
    const gw = await startTestGateway();
    gateways.push(gw);
    const bad = new OpenAI({ apiKey: "gw_not-a-real-key", baseURL: gw.baseURL, maxRetries: 0 });
    expect((await bad.chat.completions.create({ model: "m", messages }).catch((e) => e)).status).toBe(401);
    const { samples } = await scrape(gw);
    expect(valueOf(samples, "gateway_requests_total", { ...CHAT, outcome: "rejected", status: "401", stream: "unknown" })).toBe(1);
  });

  test("with metricsToken set, /metrics needs the bearer token", async () => {
    const gw = await startTestGateway({ metricsToken: "scrape-secret" });
    gateways.push(gw);
    expect((await fetch(`${gw.url}/metrics`)).status).toBe(401);
    expect((await fetch(`${gw.url}/metrics`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401);
    await scrape(gw, { authorization: "Bearer scrape-secret" });
  });
});

describe("/healthz", () => {
  test("200 with ok:true while running, 503 with status draining while draining", async () => {
    // A stream held open by a slow provider keeps the gateway draining long enough to look at it.
    const { gw, client } = await gatewayWith([{ id: "slow-prov", tokensPerSecond: 10 }], { drainGraceMs: 5000 });
    const up = await fetch(`${gw.url}/healthz`);
    expect(up.status).toBe(200);
    expect(await up.json()).toMatchObject({ ok: true, status: "running", providers_admitted: 1 });

    const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 8, stream: true });
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next(); // the stream is live
    const drained = gw.gateway.drain();
    const down = await fetch(`${gw.url}/healthz`);
    expect(down.status).toBe(503);
    expect(await down.json()).toMatchObject({ ok: false, status: "draining", live_requests: 1 });
    while (!(await iterator.next()).done) {}
    await drained;
  });
});
