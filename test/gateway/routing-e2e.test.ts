// Routing in the running gateway (docs/routing.md), with scripted providers over real WebSockets and
// the official openai SDK: a failure cools the pair and the next request goes to the other provider at
// once; the admission queue holds a burst until a slot frees, and answers 503 with Retry-After when
// the wait runs out; sticky conversations; what /metrics and /v1/status show.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";

const messages = [{ role: "user" as const, content: "Route me." }];
let gw: TestGateway;
let a: ScriptedProvider;
let b: ScriptedProvider;
let client: OpenAI;
const scripts = new Map<string, Script>();
const honest: Script = (x) => {
  x.accept();
  x.chunk("ok", 1);
  x.end();
};
/** Holds jobs until released (a busy machine). */
const held: (() => void)[] = [];
const holding: Script = (x) => {
  x.accept();
  held.push(() => {
    x.chunk("ok", 1);
    x.end();
  });
};

beforeAll(async () => {
  gw = await startTestGateway({ queueWaitMs: 1_500, stickyRouting: true, maxAttempts: 3, freeConcurrentRequests: 10 });
  const script = (id: string): Script => (x) => (scripts.get(id) ?? honest)(x);
  a = await ScriptedProvider.connect({ url: gw.wsUrl, id: "a-one", models: ["m"], maxConcurrency: 1, script: script("a") });
  b = await ScriptedProvider.connect({ url: gw.wsUrl, id: "b-two", models: ["m"], maxConcurrency: 1, script: script("b") });
  await waitForReadyProviders(gw, 2);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterEach(() => {
  scripts.clear();
  while (held.length > 0) held.shift()!();
  gw.gateway.routing.reset();
});

afterAll(async () => {
  await a.close();
  await b.close();
  await gw.close();
});

const ask = (headers?: Record<string, string>) => client.chat.completions.create({ model: "m", messages, max_tokens: 8 }, { headers });

describe("cooldowns", () => {
  test("after a failure on one provider, the next request goes to the other at once; both show in /metrics and /v1/status", async () => {
    scripts.set("a", (x) => x.decline("internal"));
    const jobsA = a.jobs.length;
    expect((await ask()).choices[0]!.message.content).toBe("ok"); // failed over a → b
    expect(a.jobs.length).toBe(jobsA + 1);
    expect(gw.gateway.routing.cooldowns.health("a-one", "m")).toBe("cooling");
    const started = performance.now();
    expect((await ask()).choices[0]!.message.content).toBe("ok");
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(a.jobs.length).toBe(jobsA + 1); // not tried again
    const status = (await (await fetch(`${gw.url}/v1/status`)).json()) as { capacity: { queued: number; cooldowns: { provider_id: string; state: string; level: number }[] } };
    expect(status.capacity.queued).toBe(0);
    expect(status.capacity.cooldowns).toEqual([expect.objectContaining({ provider_id: "a-one", model: "m", state: "cooling", level: 1 })]);
    const metrics = await (await fetch(`${gw.url}/metrics`)).text();
    expect(metrics).toContain('gateway_provider_cooldowns{state="cooling"} 1');
    expect(metrics).toContain('gateway_cooldown_transitions_total{event="cooled"} 1');
  });

  test("a capacity decline cools nothing", async () => {
    scripts.set("a", (x) => x.decline("queue_full"));
    expect((await ask()).choices[0]!.message.content).toBe("ok");
    expect(gw.gateway.routing.cooldowns.health("a-one", "m")).toBe("healthy");
  });

  test("a provider in cooldown still serves when it is the only one that can", async () => {
    gw.gateway.routing.cooldowns.failed("a-one", "m", "lost_socket");
    scripts.set("b", holding);
    const busyB = ask();
    await waitFor(() => held.length === 1, 3_000, "b busy");
    const jobsA = a.jobs.length;
    expect((await ask()).choices[0]!.message.content).toBe("ok");
    expect(a.jobs.length).toBe(jobsA + 1);
    held.shift()!();
    await busyB;
  });
});

describe("admission queue", () => {
  test("a burst beyond the free slots waits and is served when a slot frees", async () => {
    scripts.set("a", holding);
    scripts.set("b", holding);
    const first = [ask(), ask()];
    await waitFor(() => held.length === 2, 3_000, "both providers busy");
    const waiting = ask();
    await waitFor(() => gw.gateway.routing.queue.depth === 1, 2_000, "one request queued");
    expect(((await (await fetch(`${gw.url}/v1/status`)).json()) as { capacity: { queued: number } }).capacity.queued).toBe(1);
    expect(await (await fetch(`${gw.url}/metrics`)).text()).toContain("gateway_admission_queue_depth 1");
    held.shift()!(); // a slot frees: the queued request is dispatched there
    await waitFor(() => held.length === 2, 2_000, "the queued request dispatched");
    while (held.length > 0) held.shift()!();
    for (const r of [...first, waiting]) expect((await r).choices[0]!.message.content).toBe("ok");
    expect(await (await fetch(`${gw.url}/metrics`)).text()).toContain('gateway_admission_queue_total{outcome="served"} 1');
  });

  test("503 coordinator_unavailable with Retry-After only when the wait runs out", async () => {
    scripts.set("a", holding);
    scripts.set("b", holding);
    const first = [ask(), ask()];
    await waitFor(() => held.length === 2, 3_000, "both providers busy");
    const started = performance.now();
    const error = await ask().catch((e: unknown) => e);
    const waited = performance.now() - started;
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).status).toBe(503);
    expect((error as APIError).code).toBe("coordinator_unavailable");
    expect((error as APIError).headers?.get("retry-after")).toBeTruthy();
    expect(waited).toBeGreaterThanOrEqual(1_400);
    while (held.length > 0) held.shift()!();
    await Promise.all(first);
  });
});

describe("sticky conversations", () => {
  test("a tagged conversation goes back to the provider that served it; hit and miss are counted; DELETE /v1/sticky purges", async () => {
    const before = await (await fetch(`${gw.url}/metrics`)).text();
    const count = (text: string, result: string) => Number(new RegExp(`gateway_sticky_lookups_total\\{result="${result}"\\} (\\d+)`).exec(text)?.[1] ?? 0);
    // Without a pin, consolidation sends it to a-one; pin it to b-two by making a-one fail once.
    scripts.set("a", (x) => x.decline("queue_full"));
    await ask({ "x-conversation-id": "conv-1" });
    expect(b.lastJob()).toBeTruthy();
    const servedBy = b.jobs.at(-1)!.request_id;
    scripts.delete("a");
    const jobsB = b.jobs.length;
    await ask({ "x-conversation-id": "conv-1" });
    expect(b.jobs.length).toBe(jobsB + 1); // b-two again, though a-one would win otherwise
    expect(b.jobs.at(-1)!.request_id).not.toBe(servedBy);
    const after = await (await fetch(`${gw.url}/metrics`)).text();
    expect(count(after, "hit") - count(before, "hit")).toBe(1);
    expect(count(after, "miss") - count(before, "miss")).toBe(1);
    const purge = await fetch(`${gw.url}/v1/sticky`, { method: "DELETE", headers: { authorization: `Bearer ${gw.apiKey}` } });
    expect(await purge.json()).toEqual({ object: "sticky.purged", deleted: 1 });
    const again = await fetch(`${gw.url}/v1/sticky`, { method: "DELETE", headers: { authorization: `Bearer ${gw.apiKey}` } });
    expect(await again.json()).toEqual({ object: "sticky.purged", deleted: 0 });
  });

  test("a malformed X-Conversation-ID is 400 invalid_request naming the header", async () => {
    const error = await ask({ "x-conversation-id": "has spaces" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).status).toBe(400);
    expect((error as APIError).code).toBe("invalid_request");
    expect((error as APIError).param).toBe("X-Conversation-ID");
  });

  test("DELETE /v1/sticky needs credentials", async () => {
    expect((await fetch(`${gw.url}/v1/sticky`, { method: "DELETE" })).status).toBe(401);
  });
});
