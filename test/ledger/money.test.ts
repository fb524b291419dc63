// Money rules of docs/ledger.md: debit rounding, the 90/10 split, and the property that a charge neither
// creates nor destroys a credit.
import { describe, expect, test } from "bun:test";
import { debitCredits, observedBilling, priceUsage, splitDebit, type Rates } from "../../src/ledger/money.ts";

const rates = (prompt: number, completion: number, bps = 9000): Rates => ({
  prompt_credits_per_million: prompt,
  completion_credits_per_million: completion,
  provider_share_bps: bps,
});
const DEFAULT = rates(1_000_000, 1_000_000);

describe("debit = (prompt × prompt rate + completion × completion rate) / 1e6, half up", () => {
  test.each<[string, number, number, Rates, number]>([
    ["default row: one credit a token", 31, 8, DEFAULT, 39],
    ["nothing billed", 0, 0, DEFAULT, 0],
    ["0.4999995 credit rounds down", 0, 1, rates(0, 499_999), 0],
    ["exactly half rounds up", 0, 1, rates(0, 500_000), 1],
    ["1.5 rounds up to 2", 3, 0, rates(500_000, 0), 2],
    ["2.499999 rounds down", 2_499_999, 0, rates(1, 0), 2],
    ["mixed rates", 1000, 1000, rates(150_000, 600_000), 750],
    ["large counts stay exact", 9_000_000_000, 9_000_000_000, rates(1_000_000, 1_000_000), 18_000_000_000],
  ])("%s", (_n, p, c, r, expected) => {
    expect(debitCredits(p, c, r)).toBe(BigInt(expected));
  });
});

describe("split: provider = floor(debit × 9000 / 10000), platform the rest", () => {
  test.each([
    [0, 0, 0],
    [1, 0, 1],
    [9, 8, 1],
    [10, 9, 1],
    [11, 9, 2],
    [39, 35, 4],
    [1_000_000, 900_000, 100_000],
  ])("debit %d → provider %d, platform %d", (debit, provider, platform) => {
    expect(splitDebit(BigInt(debit), 9000)).toEqual({ provider: BigInt(provider), platform: BigInt(platform) });
  });
});

test("invalid inputs are values, not exceptions", () => {
  expect(priceUsage(-1, 0, DEFAULT)).toEqual({ ok: false, code: "invalid_amount" });
  expect(priceUsage(1.5, 0, DEFAULT)).toEqual({ ok: false, code: "invalid_amount" });
  expect(priceUsage(0, 0, rates(1, 1, 10_001))).toEqual({ ok: false, code: "invalid_amount" });
  expect(priceUsage(Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, rates(Number.MAX_SAFE_INTEGER, 0))).toEqual({
    ok: false,
    code: "too_large",
  });
});

test("observe-mode billing: delivered tokens out, reported prompt capped at the bound", () => {
  expect(observedBilling({ delivered_tokens: 8, reported_input_tokens: 500, prompt_token_bound: 40 })).toEqual({
    prompt_tokens: 40,
    completion_tokens: 8,
  });
  expect(observedBilling({ delivered_tokens: 0, reported_input_tokens: 12, prompt_token_bound: 40 })).toEqual({
    prompt_tokens: 12,
    completion_tokens: 0,
  });
});

describe("property: debit = provider + platform, no credit made or lost (seeded random cases)", () => {
  // xorshift32: reproducible cases without a dependency; the seed is in the test name.
  function rng(seed: number) {
    let x = seed >>> 0 || 1;
    return (max: number) => {
      x ^= x << 13;
      x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      return x % (max + 1);
    };
  }

  test.each([[1], [42], [20260101]])("seed %d: 20,000 charges", (seed) => {
    const next = rng(seed);
    for (let i = 0; i < 20_000; i++) {
      const p = next(200_000);
      const c = next(10_000);
      const r = rates(next(50_000_000), next(50_000_000), next(10) === 0 ? next(10_000) : 9000);
      const result = priceUsage(p, c, r);
      if (!result.ok) throw new Error(`unexpected ${result.code}`);
      const { debit_credits: debit, provider_credits: provider, platform_credits: platform } = result.charge;
      // Invariant: the split is exact and both shares are non-negative integers.
      expect(provider + platform).toBe(debit);
      expect(provider).toBeGreaterThanOrEqual(0);
      expect(platform).toBeGreaterThanOrEqual(0);
      expect(Number.isSafeInteger(debit)).toBe(true);
      // Half-up rounding: within half a credit of the exact amount, never below on a tie.
      const exact = (p * r.prompt_credits_per_million + c * r.completion_credits_per_million) / 1_000_000;
      expect(Math.abs(debit - exact)).toBeLessThanOrEqual(0.5 + 1e-6);
      // The provider never gets more than its share of the exact debit.
      expect(provider * 10_000).toBeLessThanOrEqual(debit * r.provider_share_bps);
      expect((provider + 1) * 10_000).toBeGreaterThan(debit * r.provider_share_bps);
    }
  });

  test("summed over many attempts, debits equal provider plus platform credits", () => {
    const next = rng(7);
    let debits = 0n;
    let credits = 0n;
    for (let i = 0; i < 5_000; i++) {
      const debit = debitCredits(next(100_000), next(4096), rates(next(5_000_000), next(5_000_000)));
      const { provider, platform } = splitDebit(debit, 9000);
      debits += debit;
      credits += provider + platform;
    }
    expect(credits).toBe(debits);
  });
});
