// The daily token quota (docs/quotas.md, docs/ledger.md) end to end, in enforce mode: each request reserves its
// prompt bound + max_tokens at admission, atomically in SQLite; settlement finalises the reservation
// to the verified usage or releases it. A quota drained to its last tokens admits nothing beyond them
// even under concurrency; pending receipts keep their reservation; quarantined and zero-settled
// requests give theirs back (tokens and, for paid accounts, credits).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type ScriptedAttempt } from "../support/scriptedProvider.ts";
import { settledRow } from "../settlement/support.ts";
import { Gate, boundOf, chat, day, expectQuota429, honestAnswer, newAccount } from "./support.ts";

const MODEL = "quota-model";
const LIMIT = 1000;
const PENDING_DEADLINE_MS = 1500;
let gw: TestGateway;
let provider: ScriptedProvider;
const gate = new Gate();

beforeAll(async () => {
  gw = await startTestGateway(
    { settlementMode: "enforce", freeDailyTokens: LIMIT, freeConcurrentRequests: 64, paidConcurrentRequests: 64, pendingDeadlineMs: PENDING_DEADLINE_MS },
    { catalog: [MODEL] },
  );
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "quota-prov", models: [MODEL], maxConcurrency: 64, script: gate.script });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  gate.open();
  await provider.close();
  await gw.close();
});

const SHORT = "hi";
/** A body whose reservation is exactly `tokens` (prompt bound of SHORT + max_tokens). */
const body = (tokens: number, content = SHORT) => ({ model: MODEL, messages: [{ role: "user", content }], max_tokens: tokens - boundOf(content) });
const counted = async (accountId: string) => await gw.gateway.store.tokensCountedOn(accountId, day());

/** Fires `n` identical requests at once while the provider holds every admitted one. */
async function blast(token: string, n: number, tokens: number) {
  gate.close();
  const heldBefore = gate.held;
  const pending = Array.from({ length: n }, () => chat(gw, token, body(tokens)));
  const refused: Awaited<(typeof pending)[number]>[] = [];
  pending.forEach((p) => p.then((r) => r.status !== 200 && refused.push(r)));
  await waitFor(() => refused.length + (gate.held - heldBefore) === n, 5000, "every request admitted or refused");
  const admitted = gate.held - heldBefore;
  return {
    admitted,
    refused,
    async finish() {
      gate.open();
      return Promise.all(pending);
    },
  };
}

describe("free tier: tokens per UTC day", async () => {
  test("a quota drained to its last tokens admits nothing beyond it, even under concurrency", async () => {
    const account = await newAccount(gw, "free");
    // Drain to 949: one request reserving 950 (424 + 526) that uses 424 prompt + 525 completion tokens.
    const long = "x".repeat(400);
    gate.answer = (a: ScriptedAttempt) => {
      a.chunk("y".repeat(525), 525); // a token decodes to at least one byte (docs/receipts.md)
      a.end({ inputTokens: 424 });
    };
    gate.open();
    const first = await chat(gw, account.apiKey, body(950, long));
    expect(first.status).toBe(200);
    await settledRow(gw, provider.lastJob().request_id);
    expect(await counted(account.accountId)).toBe(949);
    gate.answer = honestAnswer; // 7 prompt + 4 completion = 11 tokens used

    // 51 tokens left: of 20 simultaneous 51-token requests exactly one is admitted.
    const round1 = await blast(account.apiKey, 20, 51);
    expect(round1.admitted).toBe(1);
    expect(round1.refused.length).toBe(19);
    expect(await counted(account.accountId)).toBe(1000);
    for (const r of round1.refused) {
      expectQuota429(r, "tokens_per_day");
      expect(r.headers.get("x-ratelimit-limit")).toBe(String(LIMIT));
      expect(r.headers.get("x-ratelimit-remaining")).toBe("0");
      // Only a hold (of a request still running) stands in the way: retry soon, not at midnight.
      expect(r.headers.get("retry-after")).toBe("2");
      const midnight = new Date();
      midnight.setUTCHours(24, 0, 0, 0);
      expect(Number(r.headers.get("x-ratelimit-reset"))).toBe(midnight.getTime() / 1000);
    }
    for (const r of await round1.finish()) expect([200, 429]).toContain(r.status);
    await waitFor(async () => (await counted(account.accountId)) === 960, 5000, "the admitted request finalised to its usage");

    // 40 left: again exactly one of 20 simultaneous 40-token requests.
    const round2 = await blast(account.apiKey, 20, 40);
    expect(round2.admitted).toBe(1);
    expect(await counted(account.accountId)).toBe(1000);
    await round2.finish();
    await waitFor(async () => (await counted(account.accountId)) === 971, 5000, "finalised");

    // 29 left: 30 tokens is refused (usage, not holds, stands in the way: retry after midnight) …
    const over = await chat(gw, account.apiKey, body(30));
    expectQuota429(over, "tokens_per_day");
    expect(over.headers.get("x-ratelimit-remaining")).toBe("29");
    expect(Number(over.headers.get("retry-after"))).toBeGreaterThan(2);
    expect(over.json.error.message).toContain("resets at 00:00 UTC");
    // … and exactly the last 29 are still admitted.
    gate.open();
    expect((await chat(gw, account.apiKey, body(29))).status).toBe(200);
    await settledRow(gw, provider.lastJob().request_id);
    expect(await counted(account.accountId)).toBeLessThanOrEqual(LIMIT);
  }, 15_000);

  test("a pending receipt keeps its reservation; when it is quarantined (no receipt) the tokens come back", async () => {
    const account = await newAccount(gw, "free");
    gate.answer = (a) => {
      for (const c of ["a", "b"]) a.chunk(c, 1);
      a.end({ receipt: null });
    };
    gate.open();
    const first = await chat(gw, account.apiKey, body(950));
    expect(first.status).toBe(200);
    const requestId = provider.lastJob().request_id;
    // The request has ended; its receipt is pending, so the 950 tokens stay reserved (the request's
    // end is written with that attempt's settlement, docs/decisions.md).
    expect((await gw.gateway.store.getSettlement(requestId, 0))?.label).toBe("pending");
    expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "held", tokens: 950 });
    expectQuota429(await chat(gw, account.apiKey, body(100)), "tokens_per_day");

    expect(await settledRow(gw, requestId, 0, PENDING_DEADLINE_MS + 3000)).toMatchObject({ label: "quarantined", reason: "no_receipt", debit_credits: 0 });
    expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "released", used_tokens: 0 });
    expect(await counted(account.accountId)).toBe(0);
    gate.answer = honestAnswer;
    expect((await chat(gw, account.apiKey, body(950))).status).toBe(200);
  });

  test("a quarantined request (bad receipt signature) gives its reservation back", async () => {
    const account = await newAccount(gw, "free");
    gate.answer = (a) => {
      a.chunk("Hello", 1);
      a.end({ receipt: { mutateEnvelope: (env) => env.slice(0, -10) + (env.at(-10) === "A" ? "B" : "A") + env.slice(-9) } });
    };
    gate.open();
    expect((await chat(gw, account.apiKey, body(990))).status).toBe(200);
    const requestId = provider.lastJob().request_id;
    expect((await settledRow(gw, requestId)).label).toBe("quarantined");
    expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "released" });
    expect(await counted(account.accountId)).toBe(0);
    gate.answer = honestAnswer;
    expect((await chat(gw, account.apiKey, body(990))).status).toBe(200);
  });

  test("a zero-settled request (the provider failed before any output) gives its reservation back", async () => {
    const account = await newAccount(gw, "free");
    gate.answer = (a) => a.end({ terminal_state: "provider_error" });
    gate.open();
    const failed = await chat(gw, account.apiKey, body(990));
    expect(failed.status).toBe(503);
    const requestId = provider.lastJob().request_id;
    expect(await settledRow(gw, requestId)).toMatchObject({ label: "zero_settled", debit_credits: 0 });
    await waitFor(async () => (await gw.gateway.store.getReservation(requestId))?.state === "released", 3000, "released");
    expect(await counted(account.accountId)).toBe(0);
    gate.answer = honestAnswer;
    expect((await chat(gw, account.apiKey, body(990))).status).toBe(200);
  });
});

describe("paid tier: the credit balance", () => {
  test("held credits cover concurrent requests atomically; an uncovered one is quota_exhausted (scope credits); quarantine refunds the hold", async () => {
    // Default rates: 1 credit a token, so a 950-token reservation holds 950 credits.
    const account = await newAccount(gw, "paid", 1000);
    gate.answer = (a) => {
      a.chunk("Hello", 1);
      a.end({ receipt: { mutateEnvelope: (env) => env.slice(0, -10) + (env.at(-10) === "A" ? "B" : "A") + env.slice(-9) } });
    };
    const round = await blast(account.apiKey, 10, 950);
    expect(round.admitted).toBe(1);
    expect(round.refused.length).toBe(9);
    for (const r of round.refused) {
      expectQuota429(r, "credits");
      expect(r.headers.get("x-ratelimit-limit")).toBe("1000");
      expect(r.headers.get("x-ratelimit-remaining")).toBe("50");
      expect(r.json.error.message).toContain("Add credits");
    }
    expect(await gw.gateway.store.availableCredits(account.accountId)).toBe(50);
    await round.finish();
    await waitFor(async () => await gw.gateway.store.availableCredits(account.accountId) === 1000, 5000, "the hold refunded");
    expect(await gw.gateway.store.ledgerBalance(`buyer:${account.accountId}`)).toBe(1000);
    // No daily token limit for paid accounts by default (paidDailyTokens 0): only the balance.
    gate.answer = honestAnswer;
    gate.open();
    expect((await chat(gw, account.apiKey, body(990))).status).toBe(200);
  });
});
