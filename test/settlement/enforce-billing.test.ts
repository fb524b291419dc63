// Enforce mode, end to end with the official openai SDK: a completed request settles `verified` and
// debits the payer rate × tokens (docs/ledger.md rounding), credits the provider 90 % (floor) and the
// platform the rest; the ledger balances, the audit is clean and GET /v1/rate-card shows the row used.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { catalogModel, startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { cli, expectedCharge, expectLedgerBalanced, freeBuyer, ledgerAudit, paidBuyer, promptBound, receiptsList, settledRow } from "./support.ts";

const PREMIUM = { slug: "premium", prompt_credits_per_million: 1_500_000, completion_credits_per_million: 2_000_000 };
const messages = [{ role: "user" as const, content: "Say hello." }];
const CHUNKS = ["Hello", ", ", "world", "!"];
const CHUNK_TOKENS = [1, 1, 1, 1];
const INPUT_TOKENS = 7;

const script: Script = (a) => {
  a.accept();
  CHUNKS.forEach((c, i) => a.chunk(c, CHUNK_TOKENS[i]));
  a.end();
};

let gw: TestGateway;
let provider: ScriptedProvider;

beforeAll(async () => {
  gw = await startTestGateway(
    { settlementMode: "enforce", rateCard: JSON.stringify([PREMIUM]) },
    { catalog: ["plain-model", catalogModel("premium-model", { rate_card_row: "premium" })] },
  );
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "billing-prov", models: ["plain-model", "premium-model", "rogue-model"], script, inputTokens: INPUT_TOKENS });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

const completionTokens = CHUNK_TOKENS.reduce((a, b) => a + b, 0);

describe("a completed request is charged exactly once at the route-time row", () => {
  test("paid buyer, default row, streaming: buyer −debit, provider +90 % (floor), platform the rest", async () => {
    const buyer = await paidBuyer(gw, 1_000_000);
    expect(INPUT_TOKENS).toBeLessThanOrEqual(promptBound(messages));
    const stream = await buyer.client.chat.completions.create({ model: "plain-model", messages, stream: true, max_tokens: 64 });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    expect(text).toBe(CHUNKS.join(""));

    const requestId = provider.lastJob().request_id;
    const row = await settledRow(gw, requestId);
    const charge = expectedCharge(INPUT_TOKENS, completionTokens, 1_000_000, 1_000_000);
    expect(charge).toEqual({ debit: 11, provider: 9, platform: 2 });
    expect(row).toMatchObject({
      label: "verified",
      reason: null,
      payer: "buyer",
      billed_prompt_tokens: INPUT_TOKENS,
      billed_completion_tokens: completionTokens,
      debit_credits: charge.debit,
      provider_credits: charge.provider,
      platform_credits: charge.platform,
      rates: { prompt_credits_per_million: 1_000_000, completion_credits_per_million: 1_000_000, provider_share_bps: 9000 },
    });
    expect(row.receipt).not.toBeNull();

    const store = gw.gateway.store;
    expect(await store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(1_000_000 - charge.debit);
    expect(await store.availableCredits(buyer.accountId)).toBe(1_000_000 - charge.debit);
    expect(await store.ledgerBalance("provider:billing-prov")).toBe(charge.provider);
    expect(await store.ledgerBalance("promotion")).toBe(0);
    expect(await store.getReservation(requestId)).toMatchObject({
      state: "finalised",
      used_credits: charge.debit,
      used_tokens: INPUT_TOKENS + completionTokens,
    });
    await expectLedgerBalanced(gw);

    // The provider is told, with its credit.
    expect(await provider.waitForSettled(requestId)).toMatchObject({ label: "verified", reason: null, provider_credits: charge.provider });
    // The operator's view.
    expect(receiptsList(gw.dataDir, requestId)).toEqual([
      { request_id: requestId, attempt_n: 0, provider_id: "billing-prov", label: "verified", reason: null, debit_credits: charge.debit, provider_credits: charge.provider },
    ]);
    // The stored envelope is the one the provider signed.
    const exported = cli(["receipts", "export", "--request-id", requestId, "--attempt", "0", "--data-dir", gw.dataDir]);
    expect(exported.exitCode).toBe(0);
    expect(exported.stdout.trim()).toBe(row.receipt!);
  });

  test("free buyer: the promotion account pays, the provider is paid the same", async () => {
    const buyer = freeBuyer(gw);
    const providerBefore = await gw.gateway.store.ledgerBalance("provider:billing-prov");
    const platformBefore = await gw.gateway.store.ledgerBalance("platform");
    const completion = await buyer.client.chat.completions.create({ model: "plain-model", messages, max_tokens: 64 });
    expect(completion.choices[0]?.message.content).toBe(CHUNKS.join(""));
    expect(completion.usage).toMatchObject({ prompt_tokens: INPUT_TOKENS, completion_tokens: completionTokens });

    const requestId = provider.lastJob().request_id;
    const row = await settledRow(gw, requestId);
    const charge = expectedCharge(INPUT_TOKENS, completionTokens, 1_000_000, 1_000_000);
    expect(row).toMatchObject({ label: "verified", payer: "promotion", debit_credits: charge.debit, provider_credits: charge.provider });
    const store = gw.gateway.store;
    expect(await store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(0);
    expect(await store.ledgerBalance("promotion")).toBe(-charge.debit);
    expect(await store.ledgerBalance("provider:billing-prov") - providerBefore).toBe(charge.provider);
    expect(await store.ledgerBalance("platform") - platformBefore).toBe(charge.platform);
    expect(await store.getReservation(requestId)).toMatchObject({ state: "finalised", used_credits: charge.debit });
    await expectLedgerBalanced(gw);
  });

  test("a configured row on a catalog entry: priced at that row, half-up rounding, shown on /v1/rate-card", async () => {
    const buyer = await paidBuyer(gw, 500_000);
    const completion = await buyer.client.chat.completions.create({ model: "premium-model", messages, max_tokens: 64 });
    expect(completion.choices[0]?.message.content).toBe(CHUNKS.join(""));
    const requestId = provider.lastJob().request_id;
    const row = await settledRow(gw, requestId);
    // 7 × 1.5 + 4 × 2.0 = 18.5 credits → 19 (half up); provider floor(17.1) = 17; platform 2.
    const charge = expectedCharge(INPUT_TOKENS, completionTokens, PREMIUM.prompt_credits_per_million, PREMIUM.completion_credits_per_million);
    expect(charge).toEqual({ debit: 19, provider: 17, platform: 2 });
    expect(row).toMatchObject({
      label: "verified",
      debit_credits: charge.debit,
      provider_credits: charge.provider,
      platform_credits: charge.platform,
      rates: { prompt_credits_per_million: PREMIUM.prompt_credits_per_million, completion_credits_per_million: PREMIUM.completion_credits_per_million, provider_share_bps: 9000 },
    });
    expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(500_000 - charge.debit);

    const card = (await (await fetch(`${gw.url}/v1/rate-card`)).json()) as {
      default_row: string;
      provider_share_bps: number;
      rows: Record<string, { slug: string; prompt_credits_per_million_tokens: number; completion_credits_per_million_tokens: number; provider_share_bps: number; model_ids: string[] }>;
    };
    expect(card.default_row).toBe("default");
    expect(card.provider_share_bps).toBe(9000);
    expect(card.rows.premium).toEqual({
      slug: "premium",
      prompt_credits_per_million_tokens: PREMIUM.prompt_credits_per_million,
      completion_credits_per_million_tokens: PREMIUM.completion_credits_per_million,
      prompt_usd_per_million_tokens: 1.5,
      completion_usd_per_million_tokens: 2,
      provider_share_bps: 9000,
      model_ids: ["premium-model"],
    } as never);
    expect(card.rows.default).toMatchObject({ prompt_credits_per_million_tokens: 1_000_000, completion_credits_per_million_tokens: 1_000_000, provider_share_bps: 9000, model_ids: ["plain-model"] });
  });

  test("refused before dispatch, nothing reserved: an uncatalogued model (404) and a balance below the worst case (429)", async () => {
    const jobsBefore = provider.jobs.length;
    const rich = await paidBuyer(gw, 1_000_000);
    // The provider advertises it, but enforce routes only catalog models.
    const uncatalogued = await rich.client.chat.completions.create({ model: "rogue-model", messages, max_tokens: 8 }).catch((e) => e);
    expect(uncatalogued.status).toBe(404);
    expect(uncatalogued.code).toBe("model_not_available");
    // Worst case = prompt bound + max_tokens at 1 credit a token; one credit short of it.
    const poor = await paidBuyer(gw, promptBound(messages) + 64 - 1);
    const tooPoor = await poor.client.chat.completions.create({ model: "plain-model", messages, max_tokens: 64 }).catch((e) => e);
    expect(tooPoor.status).toBe(429);
    expect(tooPoor.code).toBe("quota_exhausted");
    expect(provider.jobs.length).toBe(jobsBefore);
    expect(await gw.gateway.store.availableCredits(poor.accountId)).toBe(promptBound(messages) + 63);
    // Exactly the worst case is enough.
    expect((await gw.gateway.store.grantCredits(poor.accountId, 1)).ok).toBe(true);
    const ok = await poor.client.chat.completions.create({ model: "plain-model", messages, max_tokens: 64 });
    expect(ok.choices[0]?.message.content).toBe(CHUNKS.join(""));
  });

  test("after all of it: every posting balances and `gateway ledger audit` is clean", async () => {
    await expectLedgerBalanced(gw);
    const audit = ledgerAudit(gw.dataDir);
    expect(audit.report.findings).toEqual([]);
    expect(audit.exitCode).toBe(0);
    expect(audit.report.totals.sum_of_all_entries).toBe(0);
    expect(provider.errors).toEqual([]);
  });
});
