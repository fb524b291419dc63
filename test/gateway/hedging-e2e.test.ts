// Hedged dispatch in the running gateway (docs/routing.md, Hedging), with scripted providers and the
// openai SDK: the first attempt to deliver wins, the other is cancelled at once and settles
// zero_settled with reason hedge_lost in its `settled` frame; only the winner is charged.
import { afterAll, afterEach, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type ScriptedAttempt, type Script } from "../support/scriptedProvider.ts";

const messages = [{ role: "user" as const, content: "Hedge me." }];
let gw: TestGateway;
let a: ScriptedProvider;
let b: ScriptedProvider;
let client: OpenAI;
const scripts = new Map<string, Script>();
const answer = (text: string): Script => (x) => {
  x.accept();
  x.chunk(text, 1);
  x.end();
};
const late: (() => void)[] = [];

beforeAll(async () => {
  gw = await startTestGateway({ hedgeAfterMs: 150, hedgeMaxPercent: 100, freeConcurrentRequests: 10, firstByteTimeoutMs: 10_000 });
  const script = (id: string): Script => (x) => (scripts.get(id) ?? answer(id))(x);
  a = await ScriptedProvider.connect({ url: gw.wsUrl, id: "a-one", models: ["m"], script: script("a") });
  b = await ScriptedProvider.connect({ url: gw.wsUrl, id: "b-two", models: ["m"], script: script("b") });
  await waitForReadyProviders(gw, 2);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterEach(() => {
  scripts.clear();
  while (late.length > 0) late.shift()!();
  gw.gateway.routing.reset();
});

afterAll(async () => {
  await a.close();
  await b.close();
  await gw.close();
});

test("a silent first attempt is hedged; the hedge wins, the first is cancelled and settles hedge_lost", async () => {
  // a-one accepts and stays silent until cancelled.
  scripts.set("a", (x) => x.accept());
  const res = await client.chat.completions.create({ model: "m", messages, max_tokens: 8 });
  expect(res.choices[0]!.message.content).toBe("b");
  const requestId = a.lastJob().request_id;
  expect(b.lastJob()).toMatchObject({ request_id: requestId, attempt_n: 128 });
  const cancel = await a.attempt(requestId, 0).cancelled();
  expect(cancel).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 0 });
  a.attempt(requestId, 0).end({ terminal_state: "gateway_timeout", receipt: { terminal_state: "gateway_timeout", boundBytes: 0 } });
  expect(await a.waitForSettled(requestId, 0)).toMatchObject({ label: "zero_settled", reason: "hedge_lost", provider_credits: 0 });
  const settlements = await gw.gateway.store.listSettlements({ request_id: requestId });
  expect(settlements.find((s) => s.attempt_n === 0)).toMatchObject({ label: "zero_settled", reason: "hedge_lost", debit_credits: 0 });
  const metrics = await (await fetch(`${gw.url}/metrics`)).text();
  expect(metrics).toContain('gateway_hedges_total{result="sent"} 1');
  expect(metrics).toContain('gateway_hedges_total{result="won"} 1');
  await waitFor(() => gw.gateway.registry.attempts.size === 0, 2_000, "attempts released");
});

test("when the first attempt delivers first, the hedge is cancelled and loses", async () => {
  // a-one answers after the hedge went out; b-two (the hedge) stays silent.
  scripts.set("a", (x) => {
    x.accept();
    late.push(() => {});
    setTimeout(() => {
      x.chunk("a", 1);
      x.end();
    }, 400);
  });
  scripts.set("b", (x) => x.accept());
  const res = await client.chat.completions.create({ model: "m", messages, max_tokens: 8 });
  expect(res.choices[0]!.message.content).toBe("a");
  const requestId = a.lastJob().request_id;
  expect(b.lastJob()).toMatchObject({ request_id: requestId, attempt_n: 128 });
  expect(await b.attempt(requestId, 128).cancelled()).toMatchObject({ reason: "gateway_timeout" });
  b.attempt(requestId, 128).end({ terminal_state: "gateway_timeout", receipt: { terminal_state: "gateway_timeout", boundBytes: 0 } });
  expect(await b.waitForSettled(requestId, 128)).toMatchObject({ label: "zero_settled", reason: "hedge_lost" });
  expect(await (await fetch(`${gw.url}/metrics`)).text()).toContain('gateway_hedges_total{result="lost"} 1');
});

test("a first attempt that fails before its first byte hands the request to its running hedge: no third attempt, one charge", async () => {
  // Both accept and stay silent; once the hedge reached b-two, a-one fails (provider_error, no byte).
  let first: ScriptedAttempt | null = null;
  let hedge: ScriptedAttempt | null = null;
  scripts.set("a", (x) => {
    x.accept();
    first = x;
  });
  scripts.set("b", (x) => {
    x.accept();
    hedge = x;
  });
  const jobsBefore = a.jobs.length + b.jobs.length;
  const pending = client.chat.completions.create({ model: "m", messages, max_tokens: 8 });
  await waitFor(() => first !== null && hedge !== null, 5_000, "the first attempt and its hedge");
  const requestId = first!.job.request_id;
  expect(hedge!.job).toMatchObject({ request_id: requestId, attempt_n: 128 });
  first!.end({ terminal_state: "provider_error", receipt: { terminal_state: "provider_error", boundBytes: 0 } });
  // The failed attempt's settlement is written before the adopted hedge answers.
  expect(await a.waitForSettled(requestId, 0)).toMatchObject({ label: "zero_settled", provider_credits: 0 });
  hedge!.chunk("b", 1);
  hedge!.end();
  const res = await pending;
  expect(res.choices[0]!.message.content).toBe("b");
  expect(a.jobs.length + b.jobs.length - jobsBefore).toBe(2);
  // The adopted hedge is the request's answer and the only attempt charged (this gateway observes:
  // its uncatalogued model settles quarantined, still charged and paid).
  expect((await b.waitForSettled(requestId, 128)).provider_credits).toBeGreaterThan(0);
  const settlements = await gw.gateway.store.listSettlements({ request_id: requestId });
  expect(settlements.map((s) => s.attempt_n).sort((x, y) => x - y)).toEqual([0, 128]);
  expect(settlements.find((s) => s.attempt_n === 0)).toMatchObject({ label: "zero_settled", debit_credits: 0 });
  expect(settlements.find((s) => s.attempt_n === 128)!.debit_credits).toBeGreaterThan(0);
  await waitFor(() => gw.gateway.registry.attempts.size === 0, 2_000, "attempts released");
});
