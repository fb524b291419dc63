// GET /v1/usage (docs/usage.md): an API-key account's quota, balance and spend, keys, per-model
// usage, rating summary, receipt-label counts and the settlement disclosure. Counts, sums and key
// prefixes only: never a prompt, an output, a key, a provider identity or a receipt envelope.
import type { ApiKeyPrincipal } from "./auth.ts";
import { limitsFor, nextUtcMidnightMs, utcDay, type QuotaPolicy } from "./quotas.ts";
import { buyerAccount } from "../store/index.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";

export interface UsageContext {
  store: Store;
  now: () => number;
  settlementMode: "observe" | "enforce";
  quotas?: QuotaPolicy;
  /** Fallback per-request cap when no policy is configured (bare unit apps). */
  requestTokenCap: number;
  coveredEntrypoints: readonly string[];
  excludedEntrypoints: readonly string[];
  /** A cluster's concurrency slots (held in Redis, not in the store): the in-use count comes from there. */
  sharedSlots?: { inUse(account_id: string): Promise<number> };
}

const seconds = (ms: number) => Math.floor(ms / 1000);

/** What each receipt label means to a buyer (docs/receipts.md). */
const LABELS = {
  pending: "Receipt verification is incomplete; the reservation is not final usage. Quota or balance may stay reserved.",
  verified: "A settlement-capable receipt matched the route-time catalog snapshot; buyer debit and provider settlement may finalize.",
  quarantined: "Not charged, because model-integrity or receipt verification failed. Not treated as buyer fault.",
  zero_settled: "Not charged, because no billable verified work was produced. Not treated as buyer fault.",
} as const;

export function settlementDisclosure(c: Pick<UsageContext, "settlementMode" | "coveredEntrypoints" | "excludedEntrypoints">) {
  return {
    settlement_mode: c.settlementMode,
    description:
      c.settlementMode === "enforce"
        ? "Charges and quota usage become final only for attempts whose provider-signed receipt matched the route-time catalog snapshot (verified). A matching receipt shows what the provider claimed to run; it does not prove it."
        : "Observe mode: receipts are checked and recorded, but billing follows observed usage and no attempt is presented as matching the catalog.",
    reservations:
      "daily_tokens_reserved includes reservations of requests still running and of receipts still pending after a request completed; outcomes that do not become verified release or refund that reservation.",
    labels: LABELS,
    covered_entrypoints: c.coveredEntrypoints,
    excluded_entrypoints: c.excludedEntrypoints,
    limits:
      "Prompts and outputs are processed as plaintext on provider hardware. No private inference, hardware attestation or protection from a dishonest provider is claimed.",
  };
}

/** The body of GET /v1/usage for an API-key principal. */
export async function usageBody(c: UsageContext, principal: ApiKeyPrincipal) {
  const nowMs = c.now();
  const day = utcDay(nowMs);
  const account = await c.store.getAccount(principal.account_id);
  const tier = account?.tier ?? principal.tier;
  const usage = await c.store.accountUsage(principal.account_id, day);
  const limits = c.quotas ? limitsFor(c.quotas, { ...principal, tier }) : null;
  const dailyLimit = limits?.dailyTokens ?? null;
  const paid = tier === "paid";
  const balance = paid ? await c.store.ledgerBalance(buyerAccount(principal.account_id)) : null;
  const ratings = await c.store.feedbackSummary(principal.account_id);
  const slotsInUse = c.sharedSlots ? await c.sharedSlots.inUse(principal.account_id) : c.store.requestSlotsInUse(principal.account_id);
  return {
    object: "usage",
    account_id: principal.account_id,
    tier,
    generated_at: seconds(nowMs),
    quota: {
      window: { kind: "utc_day", day, start: seconds(Date.parse(`${day}T00:00:00Z`)), resets_at: seconds(nextUtcMidnightMs(nowMs)) },
      daily_tokens_limit: dailyLimit,
      daily_tokens_used: usage.daily_tokens_used,
      daily_tokens_reserved: usage.daily_tokens_reserved,
      daily_tokens_remaining: dailyLimit === null ? null : Math.max(0, dailyLimit - usage.daily_tokens_used - usage.daily_tokens_reserved),
      request_token_cap: limits?.requestTokenCap ?? c.requestTokenCap,
      concurrent_requests_limit: limits?.concurrentRequests ?? null,
      concurrent_requests_in_use: slotsInUse,
    },
    // Paid accounts only: free-tier usage is paid by the operator's promotion account (docs/ledger.md).
    balance:
      balance === null
        ? null
        : { balance_credits: balance, held_credits: usage.held_credits, available_credits: balance - usage.held_credits },
    spend: paid ? { charged_credits_total: usage.spent_credits_total, charged_credits_today: usage.spent_credits_day } : null,
    keys: (await c.store.listApiKeys(principal.account_id)).map((k) => ({
      id: k.key_id,
      prefix: k.display_prefix,
      label: k.label,
      created_at: seconds(k.created_at_ms),
      last_used_at: k.last_used_at_ms === null ? null : seconds(k.last_used_at_ms),
      status: k.revoked_at_ms === null ? "active" : "revoked",
      current: k.key_id === principal.key_id,
    })),
    models: usage.models,
    ratings: { up: ratings.up, down: ratings.down, total: ratings.up + ratings.down },
    receipts: usage.labels,
    settlement_disclosure: settlementDisclosure(c),
  };
}
