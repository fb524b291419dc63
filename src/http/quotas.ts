// Buyer limits (docs/quotas.md, docs/ledger.md, docs/buyer-api.md): per tier, a daily token quota (UTC day), a per-request cap on
// max_tokens and a number of concurrent requests. Pure: the limits a principal gets, and the
// quota_exhausted answers with their X-RateLimit-* headers. The atomic checks live in the store
// (reserve for tokens and credits, acquireRequestSlot for concurrency) and run in the pipeline.
import { gatewayError, type GatewayError } from "./errors.ts";
import type { BuyerPrincipal } from "./auth.ts";

export interface TierLimits {
  /** Tokens per UTC day (held reservations + finalised usage); undefined = no daily token limit. */
  dailyTokens: number | undefined;
  /** Largest max_tokens one request may ask for; an absent max_tokens means up to this. */
  requestTokenCap: number;
  /** Requests running at once; a slot is held until the buyer's response ends. */
  concurrentRequests: number;
}

/** The limits of every kind of principal: free and paid API keys, and demo sessions (per IP key). */
export interface QuotaPolicy {
  free: TierLimits;
  paid: TierLimits;
  demo: TierLimits;
}

/** The settings a QuotaPolicy is built from (a subset of GatewayConfig). */
export interface QuotaSettings {
  freeDailyTokens: number;
  requestTokenCap: number;
  freeConcurrentRequests: number;
  paidDailyTokens: number;
  paidRequestTokenCap: number;
  paidConcurrentRequests: number;
  demoDailyTokens: number;
  demoRequestTokenCap: number;
  demoConcurrentRequests: number;
}

export function quotaPolicy(s: QuotaSettings): QuotaPolicy {
  return {
    free: { dailyTokens: s.freeDailyTokens, requestTokenCap: s.requestTokenCap, concurrentRequests: s.freeConcurrentRequests },
    // 0 = none: a paid account is limited by its credit balance unless the operator sets a daily cap.
    paid: { dailyTokens: s.paidDailyTokens === 0 ? undefined : s.paidDailyTokens, requestTokenCap: s.paidRequestTokenCap, concurrentRequests: s.paidConcurrentRequests },
    demo: { dailyTokens: s.demoDailyTokens, requestTokenCap: s.demoRequestTokenCap, concurrentRequests: s.demoConcurrentRequests },
  };
}

export function limitsFor(policy: QuotaPolicy, principal: BuyerPrincipal): TierLimits {
  if (principal.kind === "demo") return policy.demo;
  return principal.tier === "paid" ? policy.paid : policy.free;
}

/**
 * The per-request cap an entrypoint normalises max_tokens against for this principal (docs/buyer-api.md: it
 * limits max_tokens alone; an absent max_tokens becomes the cap, never a refusal). Without a policy
 * (bare unit apps) every principal gets `requestTokenCap`.
 */
export function requestTokenCapFor(deps: { requestTokenCap: number; quotas?: QuotaPolicy }, principal: BuyerPrincipal): number {
  return deps.quotas ? limitsFor(deps.quotas, principal).requestTokenCap : deps.requestTokenCap;
}

/** The UTC day (YYYY-MM-DD) a time falls on: the daily quota's window. */
export const utcDay = (nowMs: number): string => new Date(nowMs).toISOString().slice(0, 10);

/** The next 00:00 UTC after `nowMs`, in ms: when the daily window resets. */
export function nextUtcMidnightMs(nowMs: number): number {
  const midnight = new Date(nowMs);
  midnight.setUTCHours(24, 0, 0, 0);
  return midnight.getTime();
}

const unixSeconds = (ms: number) => String(Math.ceil(ms / 1000));

function rateLimitHeaders(scope: string, limit: number, remaining: number, resetAtMs: number): Record<string, string> {
  return {
    "x-ratelimit-limit": String(limit),
    "x-ratelimit-remaining": String(Math.max(0, remaining)),
    "x-ratelimit-reset": unixSeconds(resetAtMs),
    // Which limit the three headers describe (not a standard header; docs/quotas.md).
    "x-ratelimit-scope": scope,
  };
}

/**
 * The daily token quota is used up for this request. `counted` = held + finalised tokens of the day.
 * When finalised usage alone leaves room (`usedOnly` + `tokens` fits), the refusal is due to holds of
 * requests still running or pending, which come back as they settle: retry soon, not at midnight.
 */
export function dailyQuotaRefusal(input: { limit: number; counted: number; usedOnly: number; tokens: number; nowMs: number }): GatewayError {
  const resetAt = nextUtcMidnightMs(input.nowMs);
  const holdsMayReturn = input.usedOnly + input.tokens <= input.limit;
  const retryAfterSeconds = holdsMayReturn ? 2 : Math.max(1, Math.ceil((resetAt - input.nowMs) / 1000));
  const message = holdsMayReturn
    ? `The daily token quota (${input.limit}) is reserved by requests still running or awaiting settlement; this request needs ${input.tokens} tokens (prompt bound + max_tokens). Retry shortly, or lower max_tokens.`
    : `The daily token quota (${input.limit}) is used up for this request, which needs ${input.tokens} tokens (prompt bound + max_tokens). It resets at 00:00 UTC.`;
  return gatewayError("quota_exhausted", message, {
    retryAfterSeconds,
    headers: rateLimitHeaders("tokens_per_day", input.limit, input.limit - input.counted, resetAt),
  });
}

/** Every concurrency slot of the account is taken. */
export function concurrencyRefusal(limit: number, nowMs: number): GatewayError {
  return gatewayError(
    "quota_exhausted",
    `This account already has ${limit} requests running, the most allowed at once. Retry when one of them has finished.`,
    { retryAfterSeconds: 1, headers: rateLimitHeaders("concurrent_requests", limit, 0, nowMs + 1000) },
  );
}

/** A paid account's available credits do not cover the request's worst-case price. */
export function balanceRefusal(input: { balance: number; available: number; needed: number; nowMs: number }): GatewayError {
  return gatewayError(
    "quota_exhausted",
    `The account's available credit balance (${Math.max(0, input.available)} credits) does not cover this request's worst case (${input.needed} credits). Add credits or lower max_tokens.`,
    // A balance has no reset time: the headers describe credits, and Reset is now (docs/quotas.md).
    { retryAfterSeconds: 60, headers: rateLimitHeaders("credits", Math.max(0, input.balance), input.available, input.nowMs) },
  );
}
