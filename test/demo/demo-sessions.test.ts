// Browser demo sessions against a real gateway: issuance and its per-IP hourly limit, where demo tokens
// work, and every way a demo token is refused. The test client reaches the gateway over loopback, which
// is configured as a trusted proxy, so X-Forwarded-For plays the client's address.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { authenticateBuyer, bindBuyerContext } from "../../src/http/auth.ts";
import { demoTokenKey, signDemoToken, verifyDemoToken } from "../../src/http/demo/token.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;

beforeAll(async () => {
  gw = await startTestGateway({ trustedProxies: "127.0.0.1, ::1" });
  provider = spawnProvider(gw, { id: "demo-prov", models: ["test-model"] });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider?.kill();
  await gw?.close();
});

const from = (ip: string) => ({ "x-forwarded-for": ip });

async function newSession(ip: string): Promise<Response> {
  return fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "application/json", ...from(ip) }, body: "{}" });
}

async function tokenFor(ip: string): Promise<string> {
  const response = await newSession(ip);
  expect(response.status).toBe(201);
  return ((await response.json()) as { token: string }).token;
}

const models = (token: string, ip: string) => fetch(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${token}`, ...from(ip) } });

async function expectInvalidDemoToken(response: Response, messagePart: string): Promise<void> {
  expect(response.status).toBe(401);
  const body = (await response.json()) as { error: { code: string; type: string; message: string } };
  expect(body.error.code).toBe("invalid_demo_token");
  expect(body.error.type).toBe("authentication_error");
  expect(body.error.message).toContain(messagePart);
  expect(body.error.message).toContain("Refresh the browser demo session");
}

describe("demo sessions", () => {
  test("a session's token is bound to the client's IP key and names the demo account", async () => {
    const response = await newSession("198.51.100.10");
    expect(response.status).toBe(201);
    expect(response.headers.get("x-ratelimit-limit")).toBe("10");
    expect(response.headers.get("x-ratelimit-remaining")).toBe("9");
    const body = (await response.json()) as { token: string; account_id: string; expires_at: number };
    expect(body.token).toStartWith("demo_");
    expect(body.account_id).toBe("demo:198.51.100.10/32");
    expect(body.expires_at * 1000).toBeGreaterThan(Date.now());
  });

  test("the 11th session from one IP within the hour is refused; other addresses are unaffected", async () => {
    for (let i = 0; i < 10; i++) expect((await newSession("198.51.100.20")).status).toBe(201);
    const refused = await newSession("198.51.100.20");
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(3500);
    expect(refused.headers.get("x-ratelimit-remaining")).toBe("0");
    expect(Number(refused.headers.get("x-ratelimit-reset"))).toBeGreaterThan(Date.now() / 1000);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("quota_exhausted");
    expect((await newSession("198.51.100.21")).status).toBe(201);
  });

  test("IPv6 addresses in one /64 share the allowance", async () => {
    for (let i = 0; i < 10; i++) expect((await newSession(`2001:db8:aa:bb::${i + 1}`)).status).toBe(201);
    expect((await newSession("2001:db8:aa:bb:ffff:ffff:ffff:ffff")).status).toBe(429);
    expect((await newSession("2001:db8:aa:bc::1")).status).toBe(201);
  });

  test("the request must be JSON (so other sites cannot spend a visitor's allowance)", async () => {
    const form = await fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "text/plain", ...from("198.51.100.30") }, body: "" });
    expect(form.status).toBe(400);
    const extra = await fetch(`${gw.url}/auth/demo-session`, { method: "POST", headers: { "content-type": "application/json", ...from("198.51.100.30") }, body: '{"x":1}' });
    expect(extra.status).toBe(400);
  });
});

describe("demo tokens", () => {
  test("work on models and on a chat completion through the openai SDK", async () => {
    const ip = "198.51.100.40";
    const token = await tokenFor(ip);
    expect((await models(token, ip)).status).toBe(200);
    const client = new OpenAI({ apiKey: token, baseURL: gw.baseURL, maxRetries: 0, defaultHeaders: from(ip) });
    const completion = await client.chat.completions.create({ model: "test-model", messages: [{ role: "user", content: "Hi" }], max_tokens: 5 });
    expect(completion.choices[0]!.message.content!.length).toBeGreaterThan(0);
  });

  test("from another IP: refused", async () => {
    const token = await tokenFor("198.51.100.50");
    await expectInvalidDemoToken(await models(token, "198.51.100.51"), "another network address");
  });

  test("forged: refused", async () => {
    const ip = "198.51.100.60";
    const token = await tokenFor(ip);
    const [claims, mac] = token.split(".") as [string, string];
    // Claims rewritten to another address, MAC kept.
    const moved = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(claims.slice(5), "base64url").toString()), ip: "6.6.6.6/32" })).toString("base64url");
    await expectInvalidDemoToken(await models(`demo_${moved}.${mac}`, "6.6.6.6"), "not valid");
    // MAC altered.
    const flipped = mac.slice(0, -2) + (mac.endsWith("AA") ? "BB" : "AA");
    await expectInvalidDemoToken(await models(`${claims}.${flipped}`, ip), "not valid");
    // Signed with another gateway's secret.
    const stranger = signDemoToken(demoTokenKey(new Uint8Array(32).fill(7)), { v: 1, sid: "x", ip: `${ip}/32`, iat: Date.now(), exp: Date.now() + 60_000 });
    await expectInvalidDemoToken(await models(stranger, ip), "not valid");
    await expectInvalidDemoToken(await models("demo_garbage", ip), "not valid");
  });

  test("expired: refused", async () => {
    const ip = "198.51.100.70";
    const key = demoTokenKey(await gw.gateway.store.getOrCreateSecret("gateway_hmac", 32));
    const now = Date.now();
    const expired = signDemoToken(key, { v: 1, sid: "old", ip: `${ip}/32`, iat: now - 7_200_000, exp: now - 1 });
    await expectInvalidDemoToken(await models(expired, ip), "expired");
    // The same claims, still valid, are accepted: only the time differs.
    const valid = signDemoToken(key, { v: 1, sid: "old", ip: `${ip}/32`, iat: now, exp: now + 60_000 });
    expect((await models(valid, ip)).status).toBe(200);
  });

  test("API-key-only endpoints (e.g. /v1/usage) refuse a valid demo token with 401", async () => {
    const ip = "198.51.100.80";
    const token = await tokenFor(ip);
    const request = new Request(`${gw.url}/v1/usage`, { headers: { authorization: `Bearer ${token}` } });
    bindBuyerContext(request, { clientIp: ip, demoKey: demoTokenKey(await gw.gateway.store.getOrCreateSecret("gateway_hmac", 32)), now: Date.now });
    const refused = await authenticateBuyer(gw.gateway.store, request, "api_key_only");
    expect(refused.ok).toBe(false);
    if (!refused.ok) {
      expect(refused.error.code).toBe("invalid_demo_token");
      expect(refused.error.message).toContain("/v1/usage needs an API key");
    }
    const allowed = await authenticateBuyer(gw.gateway.store, request, "demo_allowed");
    expect(allowed.ok && allowed.principal).toMatchObject({ kind: "demo", account_id: `demo:${ip}/32`, ip_key: `${ip}/32` });
  });
});

describe("verifyDemoToken (pure)", () => {
  const key = demoTokenKey(new Uint8Array(32).fill(1));
  const now = 1_800_000_000_000;
  const token = signDemoToken(key, { v: 1, sid: "s", ip: "2001:db8:1:2::/64", iat: now, exp: now + 1000 });
  test.each([
    ["valid", token, "2001:db8:1:2::/64", now, "ok"],
    ["expired at exp", token, "2001:db8:1:2::/64", now + 1000, "expired"],
    ["issued in the future", token, "2001:db8:1:2::/64", now - 120_000, "expired"],
    ["other /64", token, "2001:db8:1:3::/64", now, "other_ip"],
    ["unknown client address", token, null, now, "other_ip"],
    ["truncated", token.slice(0, -1), "2001:db8:1:2::/64", now, "malformed"],
    ["no prefix", token.slice(5), "2001:db8:1:2::/64", now, "malformed"],
  ] as const)("%s", (_what, t, ipKey, at, expected) => {
    const verdict = verifyDemoToken(key, t, ipKey, at);
    expect(verdict.ok ? "ok" : verdict.reason).toBe(expected);
  });
});
