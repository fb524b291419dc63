// The pure half of the buyer limits: which limits a principal gets, the per-request cap an entrypoint
// normalises against, and the refusal answers with their rate-limit headers (docs/quotas.md).
import { describe, expect, test } from "bun:test";
import type { BuyerPrincipal } from "../../src/http/auth.ts";
import { errorResponse } from "../../src/http/errors.ts";
import {
  balanceRefusal,
  concurrencyRefusal,
  dailyQuotaRefusal,
  limitsFor,
  nextUtcMidnightMs,
  quotaPolicy,
  requestTokenCapFor,
  utcDay,
} from "../../src/http/quotas.ts";

const settings = {
  freeDailyTokens: 100_000,
  requestTokenCap: 4096,
  freeConcurrentRequests: 2,
  paidDailyTokens: 0,
  paidRequestTokenCap: 8192,
  paidConcurrentRequests: 8,
  demoDailyTokens: 1000,
  demoRequestTokenCap: 512,
  demoConcurrentRequests: 1,
};
const policy = quotaPolicy(settings);
const free: BuyerPrincipal = { kind: "api_key", account_id: "acct_f", key_id: "key_f", tier: "free" };
const paid: BuyerPrincipal = { kind: "api_key", account_id: "acct_p", key_id: "key_p", tier: "paid" };
const demo: BuyerPrincipal = { kind: "demo", account_id: "demo:203.0.113.7/32", ip_key: "203.0.113.7/32", session_id: "s", expires_at_ms: 0 };

test.each([
  ["free", free, { dailyTokens: 100_000, requestTokenCap: 4096, concurrentRequests: 2 }],
  ["paid (daily 0 = none)", paid, { dailyTokens: undefined, requestTokenCap: 8192, concurrentRequests: 8 }],
  ["demo", demo, { dailyTokens: 1000, requestTokenCap: 512, concurrentRequests: 1 }],
] as const)("limits of a %s principal", (_, principal, limits) => {
  expect(limitsFor(policy, principal)).toEqual(limits);
  expect(requestTokenCapFor({ requestTokenCap: 4096, quotas: policy }, principal)).toBe(limits.requestTokenCap);
  // Without a policy (bare unit apps) everyone gets requestTokenCap.
  expect(requestTokenCapFor({ requestTokenCap: 4096 }, principal)).toBe(4096);
});

test("a paid daily limit, when set, applies", () => {
  expect(limitsFor(quotaPolicy({ ...settings, paidDailyTokens: 5000 }), paid).dailyTokens).toBe(5000);
});

test.each([
  ["2026-11-22T00:00:00.000Z", "2026-11-22", "2026-11-23T00:00:00.000Z"],
  ["2026-11-22T23:59:59.999Z", "2026-11-22", "2026-11-23T00:00:00.000Z"],
  ["2026-12-31T12:00:00.000Z", "2026-12-31", "2027-01-01T00:00:00.000Z"],
])("the UTC day of %s is %s and resets at %s", (at, day, reset) => {
  const ms = Date.parse(at);
  expect(utcDay(ms)).toBe(day);
  expect(new Date(nextUtcMidnightMs(ms)).toISOString()).toBe(reset);
});

describe("refusal answers", () => {
  const now = Date.parse("2026-11-22T18:00:00.000Z");
  const headersOf = (r: Response) => Object.fromEntries([...r.headers].filter(([k]) => k.startsWith("x-ratelimit") || k === "retry-after"));

  test("daily quota: holds in the way → retry in 2 s; usage in the way → retry at midnight", () => {
    const holds = errorResponse(dailyQuotaRefusal({ limit: 1000, counted: 990, usedOnly: 400, tokens: 538, nowMs: now }), "r");
    expect(holds.status).toBe(429);
    expect(headersOf(holds)).toEqual({
      "x-ratelimit-limit": "1000",
      "x-ratelimit-remaining": "10",
      "x-ratelimit-reset": String(Date.parse("2026-11-23T00:00:00.000Z") / 1000),
      "x-ratelimit-scope": "tokens_per_day",
      "retry-after": "2",
    });
    const used = errorResponse(dailyQuotaRefusal({ limit: 1000, counted: 1200, usedOnly: 900, tokens: 538, nowMs: now }), "r");
    expect(headersOf(used)["retry-after"]).toBe(String(6 * 3600));
    expect(headersOf(used)["x-ratelimit-remaining"]).toBe("0");
  });

  test("concurrency and credits", () => {
    expect(headersOf(errorResponse(concurrencyRefusal(2, now), "r"))).toEqual({
      "x-ratelimit-limit": "2",
      "x-ratelimit-remaining": "0",
      "x-ratelimit-reset": String(now / 1000 + 1),
      "x-ratelimit-scope": "concurrent_requests",
      "retry-after": "1",
    });
    const credits = errorResponse(balanceRefusal({ balance: 1000, available: 50, needed: 950, nowMs: now }), "r");
    expect(credits.status).toBe(429);
    expect(headersOf(credits)).toEqual({
      "x-ratelimit-limit": "1000",
      "x-ratelimit-remaining": "50",
      "x-ratelimit-reset": String(now / 1000),
      "x-ratelimit-scope": "credits",
      "retry-after": "60",
    });
  });
});
