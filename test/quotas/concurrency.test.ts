// Account concurrency (docs/quotas.md: 2 concurrent requests per account), end to end with the openai SDK:
// of 20 simultaneous requests exactly 2 run and 18 get 429 quota_exhausted with the rate-limit
// headers; the limit is shared by every paid entrypoint (chat, messages, responses); a slot is held
// until the buyer's response ends and comes back when it does, however it ends.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { ANSWER, Gate, chat, expectQuota429, newAccount, sdk } from "./support.ts";

const MODEL = "slot-model";
let gw: TestGateway;
let provider: ScriptedProvider;
const gate = new Gate();

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", messagesFacade: true, responsesFacade: true }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "slot-prov", models: [MODEL], maxConcurrency: 64, script: gate.script });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  gate.open();
  await provider.close();
  await gw.close();
});

const messages = [{ role: "user" as const, content: "Count to three." }];

/** The account's slots in use as GET /v1/usage reports them (the store's, or a cluster's in Redis). */
async function slotsInUse(apiKey: string): Promise<number> {
  const usage = (await (await fetch(`${gw.baseURL}/usage`, { headers: { authorization: `Bearer ${apiKey}` } })).json()) as { quota: { concurrent_requests_in_use: number } };
  return usage.quota.concurrent_requests_in_use;
}

describe("2 concurrent requests per account", () => {
  test("20 simultaneous requests from one account: exactly 2 run, 18 get quota_exhausted (429, retryable, X-RateLimit-*)", async () => {
    gate.close();
    const account = await newAccount(gw, "free");
    const client = sdk(gw, account.apiKey);
    const jobsBefore = provider.jobs.length;
    const run = async (stream: boolean): Promise<string> => {
      if (!stream) return (await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 })).choices[0]?.message.content ?? "";
      let text = "";
      for await (const chunk of await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, stream: true })) {
        text += chunk.choices[0]?.delta.content ?? "";
      }
      return text;
    };
    const outcomes = Array.from({ length: 20 }, (_, i) =>
      run(i % 2 === 0).then(
        (text) => ({ ok: true as const, text }),
        (error: unknown) => ({ ok: false as const, error }),
      ),
    );
    // The 18 refusals come back while the 2 admitted requests are still held by the provider.
    await waitFor(() => gate.held === 2, 5000, "2 held attempts");
    const settledEarly: unknown[] = [];
    outcomes.forEach((p) => p.then((o) => settledEarly.push(o)));
    await waitFor(() => settledEarly.length === 18, 5000, "18 refusals");
    expect(provider.jobs.length - jobsBefore).toBe(2);
    expect(await slotsInUse(account.apiKey)).toBe(2);

    gate.open();
    const results = await Promise.all(outcomes);
    const ran = results.filter((r) => r.ok);
    const refused = results.filter((r) => !r.ok);
    expect(ran.length).toBe(2);
    for (const r of ran) expect(r.ok && r.text).toBe(ANSWER.join(""));
    expect(refused.length).toBe(18);
    for (const r of refused) {
      const e = (r.ok ? null : r.error) as InstanceType<typeof OpenAI.APIError>;
      expect(e).toBeInstanceOf(OpenAI.RateLimitError);
      expect(e.status).toBe(429);
      expect(e.code).toBe("quota_exhausted");
      expect(e.headers?.get("x-ratelimit-limit")).toBe("2");
      expect(e.headers?.get("x-ratelimit-remaining")).toBe("0");
      expect(Number(e.headers?.get("x-ratelimit-reset"))).toBeGreaterThanOrEqual(Math.floor(Date.now() / 1000));
      expect(e.headers?.get("x-ratelimit-scope")).toBe("concurrent_requests");
      expect(e.headers?.get("retry-after")).toBe("1");
    }
    // A refused request reserved nothing: only the 2 that ran hold (then resolved) reservations.
    const reservations = (await gw.gateway.store.ledgerAuditData()).reservations.filter((r) => r.account_id === account.accountId);
    expect(reservations.length).toBe(2);
    // Both slots came back when the responses ended.
    await waitFor(async () => (await slotsInUse(account.apiKey)) === 0, 2000, "slots released");
    const after = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 });
    expect(after.choices[0]?.message.content).toBe(ANSWER.join(""));
  });

  test("the limit is per account: another account's requests run meanwhile", async () => {
    gate.close();
    const a = await newAccount(gw, "free");
    const b = await newAccount(gw, "paid", 1_000_000);
    const first = [0, 1].map(() => chat(gw, a.apiKey, { model: MODEL, messages, max_tokens: 8 }));
    await waitFor(() => gate.held === 2, 5000, "a's 2 held attempts");
    expectQuota429(await chat(gw, a.apiKey, { model: MODEL, messages, max_tokens: 8 }), "concurrent_requests");
    const other = chat(gw, b.apiKey, { model: MODEL, messages, max_tokens: 8 });
    await waitFor(() => gate.held === 3, 5000, "b's attempt held too");
    gate.open();
    for (const r of await Promise.all([...first, other])) expect(r.status).toBe(200);
  });

  test("chat completions, messages and responses share the account's 2 slots", async () => {
    gate.close();
    const account = await newAccount(gw, "free");
    const openai = sdk(gw, account.apiKey);
    const anthropic = new Anthropic({ apiKey: account.apiKey, baseURL: gw.url, maxRetries: 0 });
    const chatting = openai.chat.completions.create({ model: MODEL, messages, max_tokens: 8 });
    const responding = openai.responses.create({ model: MODEL, input: "Count to three.", store: false, max_output_tokens: 8 });
    await waitFor(() => gate.held === 2, 5000, "2 held attempts");
    const refused = await anthropic.messages.create({ model: MODEL, max_tokens: 8, messages }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Anthropic.RateLimitError);
    expect((refused as InstanceType<typeof Anthropic.APIError>).status).toBe(429);
    expect(((refused as InstanceType<typeof Anthropic.APIError>).error as { error: { code: string } }).error.code).toBe("quota_exhausted");
    gate.open();
    expect((await chatting).choices[0]?.message.content).toBe(ANSWER.join(""));
    expect((await responding).output_text).toBe(ANSWER.join(""));
    const message = await anthropic.messages.create({ model: MODEL, max_tokens: 8, messages });
    expect(message.content[0]).toMatchObject({ type: "text", text: ANSWER.join("") });
  });

  test("a buyer who hangs up frees the slot at once; a finished stream frees its own", async () => {
    gate.close();
    const account = await newAccount(gw, "free");
    const hangUp = new AbortController();
    const abandoned = fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${account.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages, max_tokens: 8 }),
      signal: hangUp.signal,
    }).catch(() => null);
    const streaming = sdk(gw, account.apiKey).chat.completions.create({ model: MODEL, messages, max_tokens: 8, stream: true });
    await waitFor(() => gate.held === 2, 5000, "2 held attempts");
    expect(await slotsInUse(account.apiKey)).toBe(2);
    hangUp.abort();
    await abandoned;
    await waitFor(async () => (await slotsInUse(account.apiKey)) === 1, 2000, "the abandoned request's slot");
    gate.open();
    let text = "";
    for await (const chunk of await streaming) text += chunk.choices[0]?.delta.content ?? "";
    expect(text).toBe(ANSWER.join(""));
    await waitFor(async () => (await slotsInUse(account.apiKey)) === 0, 2000, "the stream's slot");
  });
});
