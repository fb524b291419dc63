// Observe mode, end to end (docs/receipts.md: "receipts are checked and recorded but billing follows observed
// usage"): every receipt is judged and stored with its verdict, and the payer is debited the observed
// usage — delivered chunk tokens, and the provider's reported prompt tokens capped at the gateway's
// bound — whatever the verdict, also when no receipt ever comes. Uncatalogued models route here with
// empty catalog fields and can never verify.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type EndOptions } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, promptBound, receiptsList, settledRow, type Buyer } from "./support.ts";

const messages = [{ role: "user" as const, content: "Observe me." }];
const BOUND = promptBound(messages);
const PENDING_DEADLINE_MS = 800;
const CHUNK_TOKENS = 3; // "Hello, " 2 + "world!" 1 (the honest script)

let gw: TestGateway;
let provider: ScriptedProvider;
let buyer: Buyer;
let endWith: EndOptions = {};

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "observe", pendingDeadlineMs: PENDING_DEADLINE_MS }, { catalog: ["listed-model"] });
  provider = await ScriptedProvider.connect({
    url: gw.wsUrl,
    id: "observe-prov",
    models: ["listed-model", "unlisted-model"],
    inputTokens: 4,
    script: (a) => {
      a.accept();
      a.chunk("Hello, ", 2);
      a.chunk("world!", 1);
      a.end(endWith);
    },
  });
  await waitForReadyProviders(gw, 1);
  buyer = await paidBuyer(gw, 1_000_000);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

async function request(model: string, end: EndOptions): Promise<string> {
  endWith = end;
  const completion = await buyer.client.chat.completions.create({ model, messages, max_tokens: 16 });
  expect(completion.choices[0]?.message.content).toBe("Hello, world!");
  return provider.lastJob().request_id;
}

describe("billing follows observed usage whatever the receipt verdict", () => {
  test.each<[string, string, EndOptions, { label: "verified" | "quarantined"; reason: string | null }, number]>([
    ["an honest receipt on a catalog model", "listed-model", {}, { label: "verified", reason: null }, 4],
    ["a receipt inflating output tokens", "listed-model", { receipt: { values: { observed_output_tokens: 9, billable_output_tokens: 9 } } }, { label: "quarantined", reason: "output_tokens_inflated" }, 4],
    ["a receipt with a bad signature", "listed-model", { receipt: { mutateEnvelope: (e) => e.slice(0, -10) + (e.at(-10) === "A" ? "B" : "A") + e.slice(-9) } }, { label: "quarantined", reason: "bad_signature" }, 4],
    ["an honest receipt on an uncatalogued model (never verifies)", "unlisted-model", {}, { label: "quarantined", reason: "model_hash_not_in_catalog" }, 4],
    ["prompt tokens reported above the bound: billed at the bound", "listed-model", { inputTokens: BOUND + 50, receipt: { inputTokens: BOUND + 50 } }, { label: "quarantined", reason: "input_tokens_inflated" }, BOUND],
  ])("%s", async (_name, model, end, verdict, billedPrompt) => {
    const before = await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);
    const requestId = await request(model, end);
    const row = await settledRow(gw, requestId);
    const charge = expectedCharge(billedPrompt, CHUNK_TOKENS, 1_000_000, 1_000_000);
    expect({ label: row.label, reason: row.reason }).toEqual(verdict);
    expect(row).toMatchObject({
      mode: "observe",
      billed_prompt_tokens: billedPrompt,
      billed_completion_tokens: CHUNK_TOKENS,
      debit_credits: charge.debit,
      provider_credits: charge.provider,
      platform_credits: charge.platform,
    });
    // The judged receipt is recorded.
    expect(row.receipt).not.toBeNull();
    expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(before - charge.debit);
    expect(await provider.waitForSettled(requestId)).toMatchObject({ label: verdict.label, reason: verdict.reason, provider_credits: charge.provider });
    await expectLedgerBalanced(gw);
  });

  test("uncatalogued models route with empty catalog fields", async () => {
    const requestId = await request("unlisted-model", {});
    expect(provider.lastJob().route).toMatchObject({ catalog_id: "", catalog_body_digest: "", expected_catalog_model_hash: "", route_snapshot_mode: "observe" });
    expect((await settledRow(gw, requestId)).label).toBe("quarantined");
  });

  test("no receipt at all: quarantined no_receipt at the deadline, still billed the observed usage", async () => {
    const before = await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);
    const requestId = await request("listed-model", { receipt: null });
    expect((await gw.gateway.store.getSettlement(requestId, 0))?.label).toBe("pending");
    expect((await gw.gateway.store.getReservation(requestId))?.state).toBe("held");
    const row = await settledRow(gw, requestId, 0, PENDING_DEADLINE_MS + 3000);
    const charge = expectedCharge(4, CHUNK_TOKENS, 1_000_000, 1_000_000);
    expect(row).toMatchObject({ label: "quarantined", reason: "no_receipt", receipt: null, debit_credits: charge.debit, provider_credits: charge.provider });
    expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(before - charge.debit);
    expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "finalised", used_credits: charge.debit });
    expect(receiptsList(gw.dataDir, requestId)).toEqual([
      { request_id: requestId, attempt_n: 0, provider_id: "observe-prov", label: "quarantined", reason: "no_receipt", debit_credits: charge.debit, provider_credits: charge.provider },
    ]);
  });
});

test("the ledger balances and the audit accepts observe-mode charges", async () => {
  await expectLedgerBalanced(gw);
  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);
  expect(provider.errors).toEqual([]);
});
