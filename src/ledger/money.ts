// Money rules of docs/ledger.md as pure functions over integer credits. BigInt inside, so no product
// of tokens and rates can lose precision; results are checked to be safe integers on the way out.

/** Credits per million tokens for one rate-card row. */
export interface Rates {
  prompt_credits_per_million: number;
  completion_credits_per_million: number;
  /** Provider share in basis points (9000 = 90 %). */
  provider_share_bps: number;
}

export const PROVIDER_SHARE_BPS = 9000;
export const BPS_DENOMINATOR = 10_000;
const MILLION = 1_000_000n;

export interface Charge {
  prompt_tokens: number;
  completion_tokens: number;
  /** What the payer (buyer or promotion account) is debited. */
  debit_credits: number;
  provider_credits: number;
  platform_credits: number;
}

export type MoneyResult = { ok: true; charge: Charge } | { ok: false; code: "invalid_amount" | "too_large" };

const isCount = (n: number) => Number.isSafeInteger(n) && n >= 0;

/**
 * Debit = (prompt × prompt rate + completion × completion rate) / 1,000,000, rounded half up to a
 * whole credit (all terms are ≥ 0, so half up is floor((x + 500,000) / 1,000,000)).
 */
export function debitCredits(prompt_tokens: number, completion_tokens: number, rates: Rates): bigint {
  const micro =
    BigInt(prompt_tokens) * BigInt(rates.prompt_credits_per_million) +
    BigInt(completion_tokens) * BigInt(rates.completion_credits_per_million);
  return (micro + MILLION / 2n) / MILLION;
}

/**
 * Splits a debit: provider = floor(debit × bps / 10,000), platform = debit − provider.
 * Invariant: provider + platform = debit exactly — the platform takes the remainder, so rounding
 * never creates or destroys a credit.
 */
export function splitDebit(debit: bigint, provider_share_bps: number): { provider: bigint; platform: bigint } {
  const provider = (debit * BigInt(provider_share_bps)) / BigInt(BPS_DENOMINATOR);
  return { provider, platform: debit - provider };
}

/** The full charge for billed tokens at a row's rates; invalid inputs are values, not exceptions. */
export function priceUsage(prompt_tokens: number, completion_tokens: number, rates: Rates): MoneyResult {
  if (
    !isCount(prompt_tokens) ||
    !isCount(completion_tokens) ||
    !isCount(rates.prompt_credits_per_million) ||
    !isCount(rates.completion_credits_per_million) ||
    !Number.isInteger(rates.provider_share_bps) ||
    rates.provider_share_bps < 0 ||
    rates.provider_share_bps > BPS_DENOMINATOR
  ) {
    return { ok: false, code: "invalid_amount" };
  }
  const debit = debitCredits(prompt_tokens, completion_tokens, rates);
  if (debit > BigInt(Number.MAX_SAFE_INTEGER)) return { ok: false, code: "too_large" };
  const { provider, platform } = splitDebit(debit, rates.provider_share_bps);
  return {
    ok: true,
    charge: {
      prompt_tokens,
      completion_tokens,
      debit_credits: Number(debit),
      provider_credits: Number(provider),
      platform_credits: Number(platform),
    },
  };
}

/** Credits to hold at admission: the most the request can cost (prompt bound + max_tokens at the row's rates). */
export function reservationCredits(prompt_token_bound: number, max_tokens: number, rates: Rates): MoneyResult {
  return priceUsage(prompt_token_bound, max_tokens, rates);
}

/**
 * Usage billed in observe mode (docs/receipts.md: billing follows observed usage there): output = the chunk
 * tokens the gateway delivered; prompt = what the provider reported, never above the gateway's bound.
 */
export function observedBilling(input: { delivered_tokens: number; reported_input_tokens: number; prompt_token_bound: number }): {
  prompt_tokens: number;
  completion_tokens: number;
} {
  return {
    prompt_tokens: Math.max(0, Math.min(input.reported_input_tokens, input.prompt_token_bound)),
    completion_tokens: input.delivered_tokens,
  };
}
