// The per-request cap (docs/buyer-api.md: it limits max_tokens alone; an absent max_tokens means "up to the
// cap", never a refusal) per tier, and the demo limits of docs/quotas.md (512 tokens per request, 1000
// tokens per client IP per UTC day, shared by every demo session of that IP).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { settledRow } from "../settlement/support.ts";
import { Gate, boundOf, chat, day, expectQuota429, honestAnswer, newAccount } from "./support.ts";

const MODEL = "cap-model";
let gw: TestGateway;
let provider: ScriptedProvider;
const gate = new Gate();

beforeAll(async () => {
  gw = await startTestGateway(
    // Loopback is a trusted proxy here, so X-Forwarded-For plays the client's address (demo limits are per IP).
    { settlementMode: "enforce", trustedProxies: "127.0.0.1, ::1", paidRequestTokenCap: 8000, responsesFacade: true },
    { catalog: [MODEL] },
  );
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "cap-prov", models: [MODEL], maxConcurrency: 16, script: gate.script });
  await waitForReadyProviders(gw, 1);
  gate.open();
});

afterAll(async () => {
  gate.open();
  await provider.close();
  await gw.close();
});

const messages = [{ role: "user", content: "hi" }];

/** The over-cap answer: quota_exhausted, but 400 invalid_request_error and not retryable. */
function expectOverCap(r: { status: number; headers: Headers; json: Record<string, any> }, param: string, cap: number) {
  expect(r.status).toBe(400);
  expect(r.json.error).toMatchObject({ code: "quota_exhausted", type: "invalid_request_error", retryable: false, param });
  expect(r.json.error.message).toContain(String(cap));
  expect(r.headers.get("x-should-retry")).toBe("false");
}

describe("per-request cap on max_tokens", () => {
  test("free API key: above 4096 is refused (max_tokens or max_completion_tokens); absent means up to 4096", async () => {
    const account = await newAccount(gw, "free");
    expectOverCap(await chat(gw, account.apiKey, { model: MODEL, messages, max_tokens: 4097 }), "max_tokens", 4096);
    expectOverCap(await chat(gw, account.apiKey, { model: MODEL, messages, max_completion_tokens: 4097 }), "max_completion_tokens", 4096);
    expect((await chat(gw, account.apiKey, { model: MODEL, messages, max_tokens: 4096 })).status).toBe(200);

    const absent = await chat(gw, account.apiKey, { model: MODEL, messages });
    expect(absent.status).toBe(200);
    const job = provider.lastJob();
    expect(job.params.max_tokens).toBe(4096);
    expect((await gw.gateway.store.getReservation(job.request_id))?.tokens).toBe(boundOf("hi") + 4096);
  });

  test("the paid tier's cap is its own setting (paidRequestTokenCap = 8000 here)", async () => {
    const paid = await newAccount(gw, "paid", 1_000_000);
    const free = await newAccount(gw, "free");
    expect((await chat(gw, paid.apiKey, { model: MODEL, messages, max_tokens: 6000 })).status).toBe(200);
    expect(provider.lastJob().params.max_tokens).toBe(6000);
    expectOverCap(await chat(gw, free.apiKey, { model: MODEL, messages, max_tokens: 6000 }), "max_tokens", 4096);
    expectOverCap(await chat(gw, paid.apiKey, { model: MODEL, messages, max_tokens: 8001 }), "max_tokens", 8000);
    expect((await chat(gw, paid.apiKey, { model: MODEL, messages })).status).toBe(200);
    expect(provider.lastJob().params.max_tokens).toBe(8000);
  });
});

describe("demo mode", () => {
  const from = (ip: string) => ({ "x-forwarded-for": ip });
  async function demoToken(ip: string): Promise<string> {
    const r = await fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "application/json", ...from(ip) }, body: "{}" });
    expect(r.status).toBe(201);
    return ((await r.json()) as { token: string }).token;
  }

  test("512 tokens per request: above is refused, absent means up to 512 (chat and responses)", async () => {
    const ip = "198.51.100.71";
    const token = await demoToken(ip);
    expectOverCap(await chat(gw, token, { model: MODEL, messages, max_tokens: 513 }, from(ip)), "max_tokens", 512);
    const responses = await fetch(`${gw.baseURL}/responses`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...from(ip) },
      body: JSON.stringify({ model: MODEL, input: "hi", store: false, max_output_tokens: 513 }),
    });
    expectOverCap({ status: responses.status, headers: responses.headers, json: (await responses.json()) as Record<string, any> }, "max_output_tokens", 512);

    const absent = await chat(gw, token, { model: MODEL, messages }, from(ip));
    expect(absent.status).toBe(200);
    expect(provider.lastJob().params.max_tokens).toBe(512);
    expect(await gw.gateway.store.getReservation(provider.lastJob().request_id)).toMatchObject({ account_id: `demo:${ip}/32`, tokens: boundOf("hi") + 512 });
  });

  test("1000 tokens per IP per day, shared by every demo session of that IP; another IP has its own", async () => {
    const ip = "198.51.100.72";
    const accountId = `demo:${ip}/32`;
    const token = await demoToken(ip);
    // Use 538 tokens: 26 prompt (the whole bound) + 512 completion.
    gate.answer = (a) => {
      a.chunk("y".repeat(512), 512); // a token decodes to at least one byte (docs/receipts.md)
      a.end({ inputTokens: boundOf("hi") });
    };
    expect((await chat(gw, token, { model: MODEL, messages }, from(ip))).status).toBe(200);
    await settledRow(gw, provider.lastJob().request_id);
    expect(await gw.gateway.store.tokensCountedOn(accountId, day())).toBe(538);
    gate.answer = honestAnswer;

    // 462 left: another full-cap request (538) is refused, from this session or a fresh one of the IP.
    const refused = await chat(gw, token, { model: MODEL, messages }, from(ip));
    expectQuota429(refused, "tokens_per_day");
    expect(refused.headers.get("x-ratelimit-limit")).toBe("1000");
    expect(refused.headers.get("x-ratelimit-remaining")).toBe("462");
    expectQuota429(await chat(gw, await demoToken(ip), { model: MODEL, messages }, from(ip)), "tokens_per_day");
    // What still fits is admitted: 26 + 436 = 462, the last tokens of the day.
    expect((await chat(gw, token, { model: MODEL, messages, max_tokens: 436 }, from(ip))).status).toBe(200);
    await settledRow(gw, provider.lastJob().request_id);

    const other = "198.51.100.73";
    expect((await chat(gw, await demoToken(other), { model: MODEL, messages }, from(other))).status).toBe(200);
  });
});
