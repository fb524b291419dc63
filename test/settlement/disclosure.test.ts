// /v1/models' tier1_disclosure keeps three things apart — what providers report (warm), what the
// signed catalog knows (eligible), what each model is charged (priced) — and names the entrypoints
// settlement covers and the configured ones it does not. /v1/status reports the catalog's health.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { catalogModel, spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;

beforeAll(async () => {
  gw = await startTestGateway(
    {
      settlementMode: "enforce",
      excludedEntrypoints: "https://legacy.example/v1/chat/completions, https://direct.example/v1",
      rateCard: JSON.stringify([{ slug: "premium", prompt_credits_per_million: 2_000_000, completion_credits_per_million: 3_000_000 }]),
      messagesFacade: true,
    },
    { catalog: ["cat-model", catalogModel("priced-model", { rate_card_row: "premium" }), "cold-model"] },
  );
  provider = spawnProvider(gw, { id: "p-disclosure", models: ["cat-model", "priced-model", "uncatalogued-model"] });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider?.kill();
  await gw?.close();
});

test("models: warm, eligible and priced are separate lists; enforce lists only routable models", async () => {
  const res = await fetch(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${gw.apiKey}` } });
  expect(res.status).toBe(200);
  const body = (await res.json()) as {
    data: { id: string }[];
    tier1_disclosure: {
      provider_reported_model_ids: { warm: string[] };
      catalog_hash_status: { catalog_loaded: boolean; catalog_id: string; eligible: string[] };
      settlement_receipt_matching: { settlement_mode: string; priced: { model_id: string; rate_card_row: string; completion_credits_per_million_tokens: number }[]; covered_entrypoints: string[]; excluded_entrypoints: string[] };
    };
  };
  const d = body.tier1_disclosure;
  expect(d.provider_reported_model_ids.warm).toEqual(["cat-model", "priced-model", "uncatalogued-model"]);
  expect(d.catalog_hash_status.catalog_loaded).toBe(true);
  expect(d.catalog_hash_status.catalog_id).toStartWith("cat_");
  expect(d.catalog_hash_status.eligible).toEqual(["cat-model", "cold-model", "priced-model"]);
  expect(d.settlement_receipt_matching.settlement_mode).toBe("enforce");
  // Every routable or catalogued model, with the row and price a request for it is charged at.
  expect(d.settlement_receipt_matching.priced.map((p) => [p.model_id, p.rate_card_row, p.completion_credits_per_million_tokens])).toEqual([
    ["cat-model", "default", 1_000_000],
    ["cold-model", "default", 1_000_000],
    ["priced-model", "premium", 3_000_000],
  ]);
  expect(d.settlement_receipt_matching.covered_entrypoints).toEqual(["/v1/chat/completions", "/v1/messages"]);
  expect(d.settlement_receipt_matching.excluded_entrypoints).toEqual(["https://legacy.example/v1/chat/completions", "https://direct.example/v1"]);
  // Warm and catalogued; not the uncatalogued one (enforce would refuse it) nor the cold one.
  expect(body.data.map((m) => m.id)).toEqual(["cat-model", "priced-model"]);
});

test("status: the catalog's health is part of the pool status", async () => {
  const body = (await (await fetch(`${gw.url}/v1/status`)).json()) as { status: string; catalog: { status: string } };
  expect(body.catalog).toEqual({ status: "ok" });
  expect(body.status).toBe("up");
});

test("the signed feed and its key are served, and the rate card names the row in use", async () => {
  const catalog = await fetch(`${gw.url}/v1/catalog`);
  expect(catalog.status).toBe(200);
  expect(((await catalog.json()) as { models: { model_id: string }[] }).models.map((m) => m.model_id)).toContain("priced-model");
  expect((await fetch(`${gw.url}/v1/catalog.sig`)).status).toBe(200);
  expect((await (await fetch(`${gw.url}/v1/catalog/pubkey`)).text()).trim()).toMatch(/^[A-Za-z0-9+/]{43}=$/);
  const card = (await (await fetch(`${gw.url}/v1/rate-card`)).json()) as {
    rows: Record<string, { slug: string; provider_share_bps: number; model_ids: string[] }>;
  };
  expect(Object.keys(card.rows).sort()).toEqual(["default", "premium"]);
  expect(Object.values(card.rows).every((r) => r.provider_share_bps === 9000)).toBe(true);
  expect(card.rows.premium!.model_ids).toEqual(["priced-model"]);
});
