// The money rules and JCS under random input. Money: integer credits, the split never creates or
// destroys a credit, the debit is the rounded-half-up price, more tokens never cost less, and the
// reservation covers every charge a request can reach. JCS: canonical text parses back to the value,
// is a fixed point, and sorts members by UTF-16 code units.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { BPS_DENOMINATOR, priceUsage, reservationCredits, observedBilling } from "../../src/ledger/money.ts";
import { canonicalize, JcsError } from "../../src/receipts/jcs.ts";
import { runs } from "./runs.ts";

const rates = fc.record({
  prompt_credits_per_million: fc.integer({ min: 0, max: 100_000_000 }),
  completion_credits_per_million: fc.integer({ min: 0, max: 100_000_000 }),
  provider_share_bps: fc.integer({ min: 0, max: BPS_DENOMINATOR }),
});
const tokens = fc.integer({ min: 0, max: 10_000_000 });

/** The rule written out again with BigInt: round half up of micro-credits / 1,000,000. */
const expectedDebit = (p: number, c: number, r: { prompt_credits_per_million: number; completion_credits_per_million: number }) => {
  const micro = BigInt(p) * BigInt(r.prompt_credits_per_million) + BigInt(c) * BigInt(r.completion_credits_per_million);
  return Number(micro / 1_000_000n + (micro % 1_000_000n >= 500_000n ? 1n : 0n));
};

describe("money rules (fuzzed)", () => {
  test("a charge balances, is integer, and is the rounded price", () => {
    fc.assert(
      fc.property(tokens, tokens, rates, (p, c, r) => {
        const priced = priceUsage(p, c, r);
        if (!priced.ok) throw new Error(`valid input refused: ${priced.code}`);
        const { debit_credits, provider_credits, platform_credits } = priced.charge;
        for (const n of [debit_credits, provider_credits, platform_credits]) if (!Number.isSafeInteger(n) || n < 0) throw new Error(`not a credit count: ${n}`);
        if (provider_credits + platform_credits !== debit_credits) throw new Error("split does not add up");
        if (debit_credits !== expectedDebit(p, c, r)) throw new Error("debit is not the rounded price");
        if (provider_credits !== Math.floor((debit_credits * r.provider_share_bps) / BPS_DENOMINATOR)) throw new Error("provider share");
      }),
      runs(2000),
    );
  }, 3_600_000);

  test("more tokens never cost less; the reservation covers every reachable charge", () => {
    fc.assert(
      fc.property(tokens, tokens, tokens, tokens, rates, (bound, maxTokens, p0, c0, r) => {
        const p = p0 % (bound + 1);
        const c = c0 % (maxTokens + 1);
        const reserved = reservationCredits(bound, maxTokens, r);
        const charged = priceUsage(p, c, r);
        if (!reserved.ok || !charged.ok) throw new Error("valid input refused");
        if (charged.charge.debit_credits > reserved.charge.debit_credits) throw new Error("charge above the reservation");
        const more = priceUsage(p + 1, c + 1, r);
        if (!more.ok || more.charge.debit_credits < charged.charge.debit_credits) throw new Error("more tokens cost less");
        // Observe-mode billing never bills a prompt above the gateway's own bound.
        const observed = observedBilling({ delivered_tokens: c, reported_input_tokens: p0, prompt_token_bound: bound });
        if (observed.prompt_tokens > bound || observed.prompt_tokens < 0) throw new Error("observed prompt outside the bound");
      }),
      runs(2000),
    );
  }, 3_600_000);

  test("invalid amounts are values, never exceptions", () => {
    const bad = fc.oneof(fc.double(), fc.integer({ min: -1e9, max: -1 }), fc.constantFrom(Number.NaN, Infinity, 2 ** 60, -0.5, 1.5));
    fc.assert(
      fc.property(fc.oneof(tokens, bad), fc.oneof(tokens, bad), rates, fc.oneof(fc.integer({ min: -5, max: 20_000 }), bad), (p, c, r, bps) => {
        const result = priceUsage(p, c, { ...r, provider_share_bps: bps });
        if (result.ok) {
          const { debit_credits, provider_credits, platform_credits } = result.charge;
          if (provider_credits + platform_credits !== debit_credits || provider_credits < 0 || platform_credits < 0) throw new Error("unbalanced");
        }
      }),
      runs(2000),
    );
  }, 3_600_000);
});

/** JSON values JCS accepts: I-JSON (no lone surrogates; numbers are doubles). */
const iJson = fc.jsonValue({ maxDepth: 4 }).filter((v) => !JSON.stringify(v).includes("\\ud") && !Object.is(v, -0));

/** RFC 8785 written again for the test: members sorted by UTF-16 code units, ES number and string forms. */
const independentJcs = (value: unknown): string => {
  if (Array.isArray(value)) return `[${value.map(independentJcs).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${independentJcs((value as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
};

describe("JCS (fuzzed)", () => {
  test("canonical text parses back to the value, is a fixed point, and sorts members", () => {
    fc.assert(
      fc.property(iJson, (value) => {
        const text = canonicalize(value);
        const back = JSON.parse(text);
        expect(back).toEqual(JSON.parse(JSON.stringify(value)));
        if (canonicalize(back) !== text) throw new Error("not a fixed point");
        if (text !== independentJcs(value)) throw new Error(`differs from the independent writer: ${text}`);
      }),
      runs(2000),
    );
  }, 3_600_000);

  test("anything else is a JcsError, never another exception", () => {
    fc.assert(
      fc.property(fc.anything({ maxDepth: 3, withBigInt: true, withMap: true, withSet: true, withDate: true, withTypedArray: true, withSparseArray: true }), (value) => {
        try {
          canonicalize(value);
        } catch (e) {
          if (!(e instanceof JcsError)) throw e;
        }
      }),
      runs(2000),
    );
  }, 3_600_000);

  test("strings with any code points (lone surrogates refused)", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (s) => {
        let text: string;
        try {
          text = canonicalize({ s });
        } catch (e) {
          if (!(e instanceof JcsError) || s.isWellFormed()) throw e;
          return;
        }
        if (!s.isWellFormed()) throw new Error("a lone surrogate was canonicalised");
        if (JSON.parse(text).s !== s) throw new Error("string changed");
      }),
      runs(2000),
    );
  }, 3_600_000);
});
