// GET /v1/rate-card (docs/ledger.md): rows by slug, a `default` row at 1,000,000 credits per million tokens,
// usd_per_million_credits, provider_share_bps on every row, generated_at.
import { expect, test } from "bun:test";
import { buildRateCard, rateCardHandler, rowFor, type RateCardBody } from "../../src/ledger/rateCard.ts";

test("the default card has exactly the default row", async () => {
  const built = buildRateCard();
  if (!built.ok) throw new Error(built.message);
  const body = await rateCardHandler({ card: () => built.card, now: () => Date.UTC(2026, 0, 1) })().json();
  expect(body).toEqual({
    object: "rate_card",
    generated_at: "2026-01-01T00:00:00.000Z",
    usd_per_million_credits: 1,
    credits_per_usd: 1_000_000,
    provider_share_bps: 9000,
    default_row: "default",
    rows: {
      default: {
        slug: "default",
        prompt_credits_per_million_tokens: 1_000_000,
        completion_credits_per_million_tokens: 1_000_000,
        prompt_usd_per_million_tokens: 1,
        completion_usd_per_million_tokens: 1,
        provider_share_bps: 9000,
        model_ids: [],
      },
    },
  });
});

test("configured rows, models mapped to their row (unknown rows priced by default)", async () => {
  const built = buildRateCard({ rows: [{ slug: "small", prompt_credits_per_million: 200_000, completion_credits_per_million: 600_000 }] });
  if (!built.ok) throw new Error(built.message);
  const models = [
    { model_id: "llama3.2:1b", rate_card_row: "small" },
    { model_id: "mystery", rate_card_row: "no-such-row" },
  ];
  const body = (await rateCardHandler({ card: () => built.card, now: () => 0, models: () => models })().json()) as RateCardBody;
  expect(Object.keys(body.rows)).toEqual(["default", "small"]);
  expect(body.rows.small).toMatchObject({ prompt_usd_per_million_tokens: 0.2, completion_usd_per_million_tokens: 0.6, provider_share_bps: 9000, model_ids: ["llama3.2:1b"] });
  expect(body.rows.default?.model_ids).toEqual(["mystery"]);
  expect(rowFor(built.card, "no-such-row").slug).toBe("default");
  expect(rowFor(built.card, undefined).slug).toBe("default");
});

test("configuration errors are values", () => {
  const row = { slug: "a", prompt_credits_per_million: 1, completion_credits_per_million: 1 };
  expect(buildRateCard({ rows: [row, row] }).ok).toBe(false);
  expect(buildRateCard({ rows: [{ ...row, slug: "Bad Slug" }] }).ok).toBe(false);
  expect(buildRateCard({ usd_per_million_credits: 0 }).ok).toBe(false);
});
