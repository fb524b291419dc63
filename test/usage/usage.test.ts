// GET /v1/usage (docs/usage.md) after a mixed run — two models, three entrypoints, verified,
// quarantined, zero-settled and pending outcomes, a refused request, two keys (one revoked), ratings —
// checked number by number against the ledger and the settlement rows. No prompt or output text
// appears in any usage or receipt surface, and only API keys may read usage.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { catalogModel, startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type ScriptedAttempt } from "../support/scriptedProvider.ts";
import { cli, settledRow } from "../settlement/support.ts";
import { Gate, chat, day, newAccount, type Account } from "../quotas/support.ts";

const MODEL_A = "usage-model-a";
const MODEL_B = "usage-model-b";
const PROMPT = "PROMPT-CANARY-7f3a: please summarise my secret plans";
const OUTPUT = "OUTPUT-CANARY-91be";
const GRANT = 5_000_000;
const PREMIUM = { slug: "premium", prompt_credits_per_million: 3_000_000, completion_credits_per_million: 5_000_000 };

let gw: TestGateway;
let provider: ScriptedProvider;
const gate = new Gate();

const honest = (a: ScriptedAttempt) => {
  a.chunk(OUTPUT, 3);
  a.chunk(" done", 2);
  a.end();
};
const badSignature = (a: ScriptedAttempt) => {
  a.chunk(OUTPUT, 3);
  a.end({ receipt: { mutateEnvelope: (env) => env.slice(0, -10) + (env.at(-10) === "A" ? "B" : "A") + env.slice(-9) } });
};
const failsBeforeOutput = (a: ScriptedAttempt) => a.end({ terminal_state: "provider_error" });
const receiptWithheld = (a: ScriptedAttempt) => {
  a.chunk(OUTPUT, 3);
  a.end({ receipt: null });
};

beforeAll(async () => {
  gw = await startTestGateway(
    { settlementMode: "enforce", messagesFacade: true, responsesFacade: true, pendingDeadlineMs: 120_000, rateCard: JSON.stringify([PREMIUM]) },
    { catalog: [MODEL_A, catalogModel(MODEL_B, { rate_card_row: "premium" })] },
  );
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "usage-prov", models: [MODEL_A, MODEL_B], maxConcurrency: 16, script: gate.script });
  await waitForReadyProviders(gw, 1);
  gate.open();
});

afterAll(async () => {
  gate.open();
  await provider.close();
  await gw.close();
});

const messages = [{ role: "user" as const, content: PROMPT }];

async function usage(token: string) {
  const r = await fetch(`${gw.baseURL}/usage`, { headers: { authorization: `Bearer ${token}` } });
  return { status: r.status, text: await r.text(), headers: r.headers };
}

/** Runs `answer` for the next job and returns that job's request id once its attempt left `pending` (or not, if `pending`). */
async function run(answer: (a: ScriptedAttempt) => void, send: () => Promise<unknown>, settle = true): Promise<string> {
  gate.answer = answer;
  const before = provider.jobs.length;
  await send().catch(() => undefined);
  await provider.waitForJobs(before + 1);
  const requestId = provider.jobs[before]!.request_id;
  if (settle) await settledRow(gw, requestId);
  return requestId;
}

describe("GET /v1/usage after a mixed run", async () => {
  let account: Account;
  let secondKey: { key_id: string; api_key: string };
  const ids: Record<string, string> = {};

  beforeAll(async () => {
    account = await newAccount(gw, "paid", GRANT);
    secondKey = await gw.gateway.store.createApiKey({ account_id: account.accountId, label: "ci" });
    const openai = new OpenAI({ apiKey: account.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
    const anthropic = new Anthropic({ apiKey: account.apiKey, baseURL: gw.url, maxRetries: 0 });
    ids.streamA = await run(honest, async () => {
      for await (const _ of await openai.chat.completions.create({ model: MODEL_A, messages, max_tokens: 32, stream: true }));
    });
    ids.jsonA = await run(honest, () => openai.chat.completions.create({ model: MODEL_A, messages, max_tokens: 32 }));
    ids.responsesB = await run(honest, () => openai.responses.create({ model: MODEL_B, input: PROMPT, store: false, max_output_tokens: 32 }));
    ids.messagesA = await run(honest, () => anthropic.messages.create({ model: MODEL_A, max_tokens: 32, messages }));
    ids.quarantinedB = await run(badSignature, () => openai.chat.completions.create({ model: MODEL_B, messages, max_tokens: 32 }));
    ids.zeroA = await run(failsBeforeOutput, () => openai.chat.completions.create({ model: MODEL_A, messages, max_tokens: 32 }));
    ids.pendingB = await run(receiptWithheld, () => openai.chat.completions.create({ model: MODEL_B, messages, max_tokens: 64 }), false);
    ids.secondKeyA = await run(honest, () => chat(gw, secondKey.api_key, { model: MODEL_A, messages, max_tokens: 32 }));
    // Refused before dispatch: no settlement, no reservation.
    expect((await chat(gw, account.apiKey, { model: MODEL_A, messages, max_tokens: 5000 })).status).toBe(400);
    await gw.gateway.store.revokeApiKey(secondKey.key_id);
    for (const [id, rating] of [
      [ids.streamA, "up"],
      [ids.quarantinedB, "down"],
      [ids.responsesB, "up"],
    ] as const) {
      const r = await fetch(`${gw.baseURL}/feedback`, {
        method: "POST",
        headers: { authorization: `Bearer ${account.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({ request_id: `chatcmpl-${id}`, rating }),
      });
      expect(r.status).toBe(201);
    }
  });

  test("every number matches the ledger and the settlement rows", async () => {
    const r = await usage(account.apiKey);
    expect(r.status).toBe(200);
    expect(r.headers.get("cache-control")).toBe("no-store");
    const body = JSON.parse(r.text);
    const store = gw.gateway.store;
    const rows = (await store.listSettlements()).filter((s) => s.account_id === account.accountId);
    const audit = await store.ledgerAuditData();
    const reservations = audit.reservations.filter((x) => x.account_id === account.accountId && x.day === day());
    const buyerEntries = audit.postings
      .filter((p) => p.kind === "settlement")
      .flatMap((p) => p.entries)
      .filter((e) => e.account_id === `buyer:${account.accountId}`);

    expect(body).toMatchObject({ object: "usage", account_id: account.accountId, tier: "paid" });
    // Quota: finalised usage and holds of today, straight from the reservations.
    const used = reservations.filter((x) => x.state === "finalised").reduce((n, x) => n + x.used_tokens, 0);
    const held = reservations.filter((x) => x.state === "held");
    expect(held.map((x) => x.request_id)).toEqual([ids.pendingB!]);
    expect(body.quota).toMatchObject({
      daily_tokens_limit: null,
      daily_tokens_remaining: null,
      daily_tokens_used: used,
      daily_tokens_reserved: held.reduce((n, x) => n + x.tokens, 0),
      request_token_cap: 4096,
      concurrent_requests_limit: 2,
      concurrent_requests_in_use: 0,
    });
    expect(body.quota.window.day).toBe(day());
    expect(used).toBeGreaterThan(0);
    // Balance and spend: sums of ledger entries.
    const spent = -buyerEntries.reduce((n, e) => n + e.amount, 0);
    expect(spent).toBe(rows.reduce((n, s) => n + s.debit_credits, 0));
    expect(body.balance).toEqual({
      balance_credits: await store.ledgerBalance(`buyer:${account.accountId}`),
      held_credits: held.reduce((n, x) => n + x.credits, 0),
      available_credits: await store.availableCredits(account.accountId),
    });
    expect(body.balance.balance_credits).toBe(GRANT - spent);
    expect(body.spend).toEqual({ charged_credits_total: spent, charged_credits_today: spent });
    // Receipt labels: one count per attempt.
    const count = (label: string) => rows.filter((s) => s.label === label).length;
    expect(body.receipts).toEqual({ pending: count("pending"), verified: count("verified"), quarantined: count("quarantined"), zero_settled: count("zero_settled") });
    expect(body.receipts).toEqual({ pending: 1, verified: 5, quarantined: 1, zero_settled: 1 });
    // Per model, from each attempt's route snapshot.
    const snapshots = new Map<string, string>();
    for (const s of rows) snapshots.set(`${s.request_id}#${s.attempt_n}`, (await store.getRouteSnapshot(s.request_id, s.attempt_n))!.snapshot_json);
    const modelOf = (s: (typeof rows)[number]) => JSON.parse(snapshots.get(`${s.request_id}#${s.attempt_n}`)!).model_id as string;
    const expected = [MODEL_A, MODEL_B].map((model) => {
      const of = rows.filter((s) => modelOf(s) === model);
      return {
        model,
        requests: new Set(of.map((s) => s.request_id)).size,
        attempts: of.length,
        billed_prompt_tokens: of.reduce((n, s) => n + s.billed_prompt_tokens, 0),
        billed_completion_tokens: of.reduce((n, s) => n + s.billed_completion_tokens, 0),
        charged_credits: of.reduce((n, s) => n + s.debit_credits, 0),
      };
    });
    expect(body.models).toEqual(expected);
    expect(expected.map((m) => m.requests)).toEqual([5, 3]);
    expect(body.models.reduce((n: number, m: { charged_credits: number }) => n + m.charged_credits, 0)).toBe(spent);
    // Keys: prefixes and status, never a key.
    expect(body.keys).toHaveLength(2);
    const [first, second] = body.keys;
    expect(first).toMatchObject({ status: "active", current: true, label: null });
    expect(second).toMatchObject({ id: secondKey.key_id, status: "revoked", current: false, label: "ci" });
    expect(account.apiKey.startsWith(first.prefix)).toBe(true);
    expect(typeof first.last_used_at).toBe("number");
    expect(r.text).not.toContain(account.apiKey);
    expect(r.text).not.toContain(secondKey.api_key);
    expect(body.ratings).toEqual({ up: 2, down: 1, total: 3 });
    expect(body.settlement_disclosure).toMatchObject({ settlement_mode: "enforce", covered_entrypoints: ["/v1/chat/completions", "/v1/messages", "/v1/responses"] });
    expect(Object.keys(body.settlement_disclosure.labels)).toEqual(["pending", "verified", "quarantined", "zero_settled"]);
  });

  test("no prompt or output text in usage, receipts (buyer and operator) or feedback surfaces", async () => {
    const surfaces: string[] = [(await usage(account.apiKey)).text];
    for (const id of Object.values(ids)) {
      const r = await fetch(`${gw.baseURL}/receipts/${id}`, { headers: { authorization: `Bearer ${account.apiKey}` } });
      expect(r.status).toBe(200);
      surfaces.push(await r.text());
    }
    surfaces.push(cli(["receipts", "list", "--json", "--data-dir", gw.dataDir]).stdout);
    surfaces.push(cli(["feedback", "list", "--json", "--data-dir", gw.dataDir]).stdout);
    for (const text of surfaces) {
      expect(text.length).toBeGreaterThan(0);
      for (const canary of ["PROMPT-CANARY", "secret plans", "OUTPUT-CANARY"]) expect(text).not.toContain(canary);
    }
  });
});

describe("who may read usage", () => {
  test("a free account: the daily quota with its limit and remainder, no balance or spend", async () => {
    const account = await newAccount(gw, "free");
    const body = JSON.parse((await usage(account.apiKey)).text);
    expect(body.tier).toBe("free");
    expect(body.quota).toMatchObject({ daily_tokens_limit: 100_000, daily_tokens_used: 0, daily_tokens_reserved: 0, daily_tokens_remaining: 100_000 });
    expect(body.balance).toBeNull();
    expect(body.spend).toBeNull();
    expect(body.models).toEqual([]);
    expect(body.receipts).toEqual({ pending: 0, verified: 0, quarantined: 0, zero_settled: 0 });
  });

  test("a demo token is 401 invalid_demo_token; no bearer is 401 missing_bearer_token; a bad key 401 invalid_api_key", async () => {
    const session = await fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const { token } = (await session.json()) as { token: string };
    const demo = await usage(token);
    expect(demo.status).toBe(401);
    expect(JSON.parse(demo.text).error).toMatchObject({ code: "invalid_demo_token", type: "authentication_error" });
    const none = await fetch(`${gw.baseURL}/usage`);
    expect(none.status).toBe(401);
    expect(((await none.json()) as { error: { code: string } }).error.code).toBe("missing_bearer_token");
    const bad = await usage("gw_not-a-real-key");
    expect(bad.status).toBe(401);
    expect(JSON.parse(bad.text).error.code).toBe("invalid_api_key");
  });
});
