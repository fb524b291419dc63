// Nothing a request leaves behind once it ended: the gateway runs in this process, real provider
// runtimes in others. A first batch of every kind of request — streaming and not, served, refused,
// aborted by the buyer, failed over, cut by a provider dying mid-stream — ends and settles; then, after
// a full collection, the live objects by type are the baseline. A batch four times larger follows,
// and no type of object, and none of the gateway's registries, may have grown with it.
// Run by retention.test.ts in a fresh `bun test` process: its heap must hold this test's gateway only.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { heapStats } from "bun:jsc";
import { join } from "node:path";
import OpenAI, { APIError } from "openai";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { readUntilFirstDelta } from "../support/freshProcess.ts";
import { flushTestGateways, spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

/** The replay copy's bound in this gateway: both batches finish more results than it holds. */
const REPLAY_BOUND = 16;
/**
 * Rounds of the first batch: enough to fill every bounded window a request feeds before the baseline
 * (the operator console keeps a provider's last 50 failed attempts: 7 declines a round, and 16 lost
 * attempts a death, every other round).
 */
const FIRST_ROUNDS = 8;
const DECLINES = 7;
const DOOMED_STREAMS = 12;
/**
 * Models of the non-streaming jobs that fail over from each dying provider, one job each: a
 * (provider, model) pair that failed is routed one trial at a time, so each job needs a pair of its own.
 */
const FAILOVER_MODELS = ["doomed-json-1", "doomed-json-2", "doomed-json-3", "doomed-json-4"];
const FAILOVERS = FAILOVER_MODELS.length;
/** The second batch is this many times the first. */
const SCALE = 3;

let gw: TestGateway;
let client: OpenAI;
/** Serves `test-model` at once; the slow one sends a first token and then holds until cancelled. */
let fast: ProviderProcess;
let slow: ProviderProcess;
/** Declines every job: its model's requests fail over, then fail (no one else serves it). */
let decliner: ProviderProcess;
/** Takes over the dying provider's non-streaming jobs. */
let rescue: ProviderProcess;
const doomedKeyFile = () => join(gw.dataDir, "provider-keys", "doomed.key");

beforeAll(async () => {
  gw = await startTestGateway({
    freeConcurrentRequests: 64,
    freeDailyTokens: 1e9,
    replayCacheEntries: REPLAY_BOUND,
    // A receipt that never comes (the provider died) settles `no_receipt` within the test's wait.
    pendingDeadlineMs: 1000,
    // The dying provider is routed again as soon as it is back (a pinned provider comes first).
    cooldownBaseMs: 1,
    cooldownMaxMs: 1,
  });
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
  // Pinned, so routing prefers it over `rescue` for the non-streaming job that must fail over.
  const key = await loadOrCreateProviderKey(doomedKeyFile());
  await gw.gateway.store.pinProvider("doomed", key.publicKeyRaw);
  fast = spawnProvider(gw, { id: "fast", tokensPerSecond: 0, maxConcurrency: 8 });
  slow = spawnProvider(gw, { id: "slow", models: ["slow-model"], tokensPerSecond: 4, maxConcurrency: 8, fault: "stall-after:1" });
  decliner = spawnProvider(gw, { id: "decliner", models: ["declined-model"], fault: "decline" });
  rescue = spawnProvider(gw, { id: "rescue", models: FAILOVER_MODELS, maxConcurrency: 4 });
  await waitForReadyProviders(gw, 4, 60_000);
}, 90_000);

afterAll(async () => {
  await Promise.all([fast, slow, decliner, rescue].map((p) => p?.kill()));
  await gw?.close();
});

const messages = (i: number) => [{ role: "user" as const, content: `request ${i}: describe a lighthouse.` }];
let sequence = 0;

const post = (body: object, init: { key?: string; signal?: AbortSignal } = {}) =>
  fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${init.key ?? gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify(body),
    signal: init.signal,
  });

/** Reads an SSE body until its first content delta; the reader stays open. */
async function untilFirstDelta(res: Response) {
  expect(res.status).toBe(200);
  return readUntilFirstDelta(res);
}

const jobsOf = (p: ProviderProcess) => p.events.filter((e) => e.event === "job_received").length;

/** A stream and a non-streaming request served in full (the official SDK). */
async function served(): Promise<void> {
  const stream = await client.chat.completions.create({ model: "test-model", messages: messages(++sequence), max_tokens: 8, stream: true });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  expect(text.length).toBeGreaterThan(0);
  const whole = await client.chat.completions.create({ model: "test-model", messages: messages(++sequence), max_tokens: 8 });
  expect(whole.choices[0]!.message.content!.length).toBeGreaterThan(0);
}

/** A stream the buyer hangs up on after its first delta, and a non-streaming request aborted while its job runs. */
async function abandoned(): Promise<void> {
  const jobsBefore = jobsOf(slow);
  const reader = await untilFirstDelta(await post({ model: "slow-model", stream: true, max_tokens: 50, messages: messages(++sequence) }));
  const abort = new AbortController();
  const pending = post({ model: "slow-model", max_tokens: 50, messages: messages(++sequence) }, { signal: abort.signal }).catch((e: unknown) => e);
  await waitFor(() => jobsOf(slow) === jobsBefore + 2, 5000, "both jobs at the slow provider");
  abort.abort();
  expect(await pending).toMatchObject({ name: "AbortError" });
  await reader.cancel();
}

/**
 * Refused before any provider (bad key, bad body), and declined by the only provider serving the
 * model (DECLINES of them: see FIRST_ROUNDS).
 */
async function refused(): Promise<void> {
  expect((await post({ model: "test-model", messages: messages(++sequence) }, { key: "gw_not_a_key" })).status).toBe(401);
  expect((await post({ model: "test-model", messages: "not a list" })).status).toBe(400);
  await Promise.all(
    Array.from({ length: DECLINES }, async () => {
      const error = await client.chat.completions.create({ model: "declined-model", messages: messages(++sequence), max_tokens: 8 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(APIError);
      expect((error as APIError).status).toBe(503);
    }),
  );
}

/**
 * The pinned provider `doomed` takes DOOMED_STREAMS streams and then FAILOVERS non-streaming jobs,
 * and its process exits mid-output: every stream ends with the in-band provider_disconnected, the
 * other requests fail over to `rescue` and are served. A new `doomed` process (the same key) comes up for
 * each round.
 */
async function providerDies(): Promise<void> {
  const doomed = spawnProvider(gw, { id: "doomed", models: ["doomed-stream", ...FAILOVER_MODELS], tokensPerSecond: 20, maxConcurrency: 32, fault: "exit-after:20" });
  try {
    await waitFor(() => [...gw.gateway.registry.providerViews()].some((v) => v.providerId === "doomed" && v.state === "ready"), 60_000, "doomed ready");
    const readers = await Promise.all(
      Array.from({ length: DOOMED_STREAMS }, async () => untilFirstDelta(await post({ model: "doomed-stream", stream: true, max_tokens: 100, messages: messages(++sequence) }))),
    );
    const wholes = FAILOVER_MODELS.map((model) => client.chat.completions.create({ model, messages: messages(++sequence), max_tokens: 40 }));
    await waitFor(() => jobsOf(doomed) === DOOMED_STREAMS + FAILOVERS, 10_000, "every job at the doomed provider");
    // Watched (weakly) until collected: see settled().
    for (const [, actor] of gw.gateway.settlements.actors()) settlementActors.push(new WeakRef(actor));
    for (const reader of readers) {
      let rest = "";
      const decoder = new TextDecoder();
      for (let r = await reader.read(); !r.done; r = await reader.read()) rest += decoder.decode(r.value);
      expect(rest).toContain("provider_disconnected");
    }
    for (const whole of await Promise.all(wholes)) expect(whole.choices[0]!.message.content!.length).toBeGreaterThan(0);
    await doomed.proc.exited;
  } finally {
    await doomed.kill();
  }
}

/** `rounds` rounds of every kind of request; the dying provider in every other one. */
async function batch(rounds: number): Promise<void> {
  for (let r = 0; r < rounds; r++) {
    // The abandoned pairs one after the other: each waits for its own two jobs at the slow provider.
    await Promise.all([served(), served(), abandoned().then(abandoned), refused()]);
    if (r % 2 === 0) await providerDies();
  }
}

/** Settlement actors of the dying provider's attempts, held weakly; how long settled() last waited for them to go. */
let settlementActors: WeakRef<object>[] = [];
let actorsWaitMs = 0;

/** Everything of the batch ended: no request, attempt or settlement open, every gauge at zero. */
async function settled(): Promise<void> {
  const g = gw.gateway;
  await waitFor(() => g.liveRequests() === 0 && g.registry.attempts.size === 0, 10_000, "requests and attempts ended");
  await waitFor(() => g.settlements.openCount() === 0, 10_000, "every attempt settled");
  await waitFor(() => [...g.registry.providerViews()].every((v) => v.inFlight === 0) && g.registry.sessions.size === 4, 10_000, "sessions idle");
  const metrics = await (await fetch(`${gw.url}/metrics`)).text();
  for (const gauge of ["gateway_live_requests", "gateway_retries_waiting", "gateway_admission_turn_waiting"]) {
    expect(metrics).toMatch(new RegExp(`^${gauge}(\\{[^}]*\\})? 0$`, "m"));
  }
  for (const line of metrics.split("\n").filter((l) => /^gateway_(provider_in_flight_attempts|admission_queue_depth)\b/.test(l))) expect(line).toMatch(/ 0$/);
  flushTestGateways();
  // The settlement actors of a dying provider's attempts, settled (no_receipt) at their pending
  // deadline, have been seen counted for a while after it (no path from a root in a heap snapshot):
  // the census waits until the runtime let every one of them go.
  const since = performance.now();
  await waitFor(
    () => {
      Bun.gc(true);
      return settlementActors.every((ref) => ref.deref() === undefined);
    },
    30_000,
    "the settlement actors collected",
  );
  actorsWaitMs = Math.round(performance.now() - since);
  settlementActors = [];
  // What this process keeps of the providers' log lines is the test's, not the gateway's.
  for (const p of [fast, slow, decliner, rescue]) p.events.length = 0;
}

/** Censuses the last `census()` took (in the log line). */
let censusesTaken = 0;

/** Live objects by type after a full collection, compiled code aside. */
function oneCensus(): Record<string, number> {
  Bun.gc(true);
  const counts: Record<string, number> = {};
  for (const [type, n] of Object.entries(heapStats().objectTypeCounts)) if (!CODE_TYPES.has(type)) counts[type] = n;
  return counts;
}

/**
 * The census once the heap stops shrinking: the runtime lets some objects of an ended request go a
 * little after the request is done (seen: the settlement actors of a dying provider's last streams,
 * settled and done, still counted, with no path from a root in a heap snapshot), so censuses are taken
 * until one loses no more than a few objects of any type against the one before.
 */
async function census(): Promise<Record<string, number>> {
  censusesTaken = 1;
  let last = oneCensus();
  const shrinking = (next: Record<string, number>) => Object.entries(last).some(([type, n]) => n - (next[type] ?? 0) > 2);
  for (let tries = 0; tries < 50; tries++) {
    await Bun.sleep(100);
    const next = oneCensus();
    censusesTaken++;
    const stable = !shrinking(next);
    last = next;
    if (stable && tries >= 2) break;
  }
  return last;
}

/** The gateway's registries and caches, by name. */
function registries(): Record<string, number> {
  const g = gw.gateway;
  return {
    attempts: g.registry.attempts.size,
    forwarded: g.registry.forwarded.size,
    sessions: g.registry.sessions.size,
    admittedProviders: g.registry.admittedByProvider.size,
    liveRequests: g.liveRequests(),
    openSettlements: g.settlements.openCount(),
    replayEntries: Math.min(g.replayEntries(), REPLAY_BOUND),
  };
}

/**
 * Types of compiled code and of the JIT's bookkeeping: they grow while more of the path is compiled
 * and tiered up (the second batch runs it longer), not with what a request keeps.
 */
const CODE_TYPES = new Set(["FunctionCodeBlock", "ProgramCodeBlock", "ModuleProgramCodeBlock", "UnlinkedFunctionCodeBlock", "FunctionExecutable", "UnlinkedFunctionExecutable", "NativeExecutable", "Structure", "StructureRareData", "StructureChain", "PropertyTable", "SymbolTable", "CodeBlockRareData", "JSPropertyNameEnumerator"]);

test("requests that ended leave nothing behind: no object type or registry grows with their number", async () => {
  await batch(FIRST_ROUNDS);
  await settled();
  const before = await census();
  const baselineCensuses = censusesTaken;
  const baselineWaitMs = actorsWaitMs;
  const registriesBefore = registries();
  const requestsBefore = sequence;

  await batch(SCALE * FIRST_ROUNDS);
  await settled();
  const after = await census();
  const requests = sequence - requestsBefore;

  // A kind of request that keeps one object grows its type by that kind's count in the second batch:
  // at least two a round (served, abandoned; FAILOVERS every other round). Half of that is the bound.
  const bound = (SCALE * FIRST_ROUNDS * 2) / 2;
  const grown = Object.entries(after)
    .map(([type, n]) => [type, n - (before[type] ?? 0)] as const)
    .filter(([, d]) => d > 0)
    .sort((a, b) => b[1] - a[1]);
  console.log(`[retention] ${requests} requests after the baseline (censuses ${baselineCensuses}, ${censusesTaken}; waited ${baselineWaitMs}, ${actorsWaitMs} ms for the settlement actors to go); grown (code aside): ${grown.map(([t, d]) => `${t} +${d}`).join(", ") || "nothing"}`);
  expect(registries()).toEqual(registriesBefore);
  expect(gw.gateway.replayEntries()).toBeLessThanOrEqual(REPLAY_BOUND);
  expect(grown.filter(([, d]) => d > bound)).toEqual([]);
}, 400_000);
