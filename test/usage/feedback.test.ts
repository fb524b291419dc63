// POST /v1/feedback (docs/usage.md): a rating of one of the caller's own requests, with an API key or a
// demo token; validated (TypeBox), idempotent per request id, limited per client IP per hour; and
// `gateway feedback list` for operators.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { cli } from "../settlement/support.ts";
import { chat, newAccount } from "../quotas/support.ts";

const MODEL = "feedback-model";
const PER_HOUR = 6;
let gw: TestGateway;
let provider: ScriptedProvider;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", trustedProxies: "127.0.0.1, ::1", feedbackPerHour: PER_HOUR }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "feedback-prov", models: [MODEL] });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

const from = (ip: string) => ({ "x-forwarded-for": ip });

async function feedback(token: string, body: unknown, ip: string) {
  const r = await fetch(`${gw.baseURL}/feedback`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...from(ip) },
    body: JSON.stringify(body),
  });
  return { status: r.status, headers: r.headers, json: (await r.json()) as Record<string, any> };
}

/** One completed request of `token`; returns the completion id buyers see (`chatcmpl-req_…`). */
async function completion(token: string, ip: string): Promise<string> {
  const r = await chat(gw, token, { model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 8 }, from(ip));
  expect(r.status).toBe(200);
  return r.json.id as string;
}

describe("POST /v1/feedback", () => {
  test("rates one's own request; sending again replaces the rating (one row per request id)", async () => {
    const ip = "203.0.113.10";
    const account = await newAccount(gw, "free");
    const id = await completion(account.apiKey, ip);
    const requestId = id.replace(/^chatcmpl-/, "");

    const first = await feedback(account.apiKey, { request_id: id, rating: "down", comment: "too short" }, ip);
    expect(first.status).toBe(201);
    expect(first.json).toMatchObject({ object: "feedback", request_id: requestId, rating: "down", comment: "too short", replaced: false });
    const again = await feedback(account.apiKey, { request_id: id, rating: "down", comment: "too short" }, ip);
    expect(again.status).toBe(200);
    expect(again.json).toMatchObject({ request_id: requestId, rating: "down", replaced: true, created_at: first.json.created_at });
    const changed = await feedback(account.apiKey, { request_id: requestId, rating: "up" }, ip);
    expect(changed.json).toMatchObject({ rating: "up", comment: null, replaced: true });
    expect(await gw.gateway.store.listFeedback({ account_id: account.accountId })).toEqual([
      expect.objectContaining({ request_id: requestId, rating: "up", comment: null }),
    ]);
  });

  test("another account's request, an unknown id or a malformed id is 404 not_found (indistinguishable)", async () => {
    const ip = "203.0.113.11";
    const owner = await newAccount(gw, "free");
    const stranger = await newAccount(gw, "free");
    const id = await completion(owner.apiKey, ip);
    for (const request_id of [id, "req_00112233445566778899aabb", "not-a-request"]) {
      const r = await feedback(stranger.apiKey, { request_id, rating: "up" }, ip);
      expect(r.status).toBe(404);
      expect(r.json.error).toMatchObject({ code: "not_found", param: "request_id" });
    }
    expect(await gw.gateway.store.listFeedback({ account_id: stranger.accountId })).toEqual([]);
  });

  test("the body is validated: rating, unknown fields, comment length, JSON", async () => {
    const ip = "203.0.113.12";
    const account = await newAccount(gw, "free");
    const id = await completion(account.apiKey, ip);
    const cases: [unknown, string | null][] = [
      [{ request_id: id, rating: "meh" }, "rating"],
      [{ request_id: id }, "rating"],
      [{ rating: "up" }, "request_id"],
      [{ request_id: id, rating: "up", stars: 5 }, "stars"],
      [{ request_id: id, rating: "up", comment: "x".repeat(2001) }, "comment"],
    ];
    for (const [body, param] of cases) {
      const r = await feedback(account.apiKey, body, ip);
      expect(r.status).toBe(400);
      expect(r.json.error).toMatchObject({ code: "invalid_request", type: "invalid_request_error" });
      if (param) expect(r.json.error.param).toBe(param);
    }
    const notJson = await fetch(`${gw.baseURL}/feedback`, {
      method: "POST",
      headers: { authorization: `Bearer ${account.apiKey}`, "content-type": "application/json", ...from(ip) },
      body: "{nope",
    });
    expect(notJson.status).toBe(400);
    const noBearer = await fetch(`${gw.baseURL}/feedback`, { method: "POST", body: "{}" });
    expect(noBearer.status).toBe(401);
  });

  test("a demo token rates its own (per-IP) demo request", async () => {
    const ip = "203.0.113.13";
    const session = await fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "application/json", ...from(ip) }, body: "{}" });
    const { token } = (await session.json()) as { token: string };
    const id = await completion(token, ip);
    const r = await feedback(token, { request_id: id, rating: "up" }, ip);
    expect(r.status).toBe(201);
    expect(await gw.gateway.store.listFeedback({ account_id: `demo:${ip}/32` })).toHaveLength(1);
    // An API-key account cannot rate the demo request.
    const account = await newAccount(gw, "free");
    expect((await feedback(account.apiKey, { request_id: id, rating: "down" }, ip)).status).toBe(404);
  });

  test(`at most ${PER_HOUR} submissions per client IP per hour (429 quota_exhausted); other IPs are not affected`, async () => {
    const ip = "203.0.113.14";
    const account = await newAccount(gw, "free");
    const id = await completion(account.apiKey, ip);
    for (let i = 0; i < PER_HOUR; i++) expect((await feedback(account.apiKey, { request_id: id, rating: i % 2 ? "up" : "down" }, ip)).status).toBeLessThan(300);
    const limited = await feedback(account.apiKey, { request_id: id, rating: "up" }, ip);
    expect(limited.status).toBe(429);
    expect(limited.json.error).toMatchObject({ code: "quota_exhausted", type: "rate_limit_error", retryable: true });
    expect(limited.headers.get("x-ratelimit-limit")).toBe(String(PER_HOUR));
    expect(limited.headers.get("x-ratelimit-remaining")).toBe("0");
    expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(3500);
    expect((await feedback(account.apiKey, { request_id: id, rating: "up" }, "203.0.113.15")).status).toBe(200);
  });

  test("`gateway feedback list [--json]` shows ratings for operators, newest first", async () => {
    const list = cli(["feedback", "list", "--json", "--data-dir", gw.dataDir]);
    expect(list.exitCode).toBe(0);
    const rows = list.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { request_id: string; account_id: string; rating: string; updated_at_ms: number });
    expect(rows.length).toBe((await gw.gateway.store.listFeedback()).length);
    expect(rows.length).toBe(3);
    for (let i = 1; i < rows.length; i++) expect(rows[i - 1]!.updated_at_ms).toBeGreaterThanOrEqual(rows[i]!.updated_at_ms);
    const table = cli(["feedback", "list", "--data-dir", gw.dataDir]);
    expect(table.exitCode).toBe(0);
    expect(table.stdout.split("\n")[0]).toMatch(/^REQUEST_ID\s+ACCOUNT_ID\s+RATING\s+UPDATED\s+COMMENT$/);
    for (const row of rows) expect(table.stdout).toContain(row.request_id);
    expect(cli(["feedback", "list", "--limit", "0", "--data-dir", gw.dataDir]).exitCode).toBe(64);
    expect(cli(["feedback", "nope", "--data-dir", gw.dataDir]).exitCode).toBe(64);
  }, 60_000); // four CLI processes: seconds each on a loaded CI machine
});
