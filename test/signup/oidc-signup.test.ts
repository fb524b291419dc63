// Sign-up through an external identity provider, end to end: a real OpenID provider (oidc-provider, as
// a child process), a scripted one for ID tokens the real one will not make, the gateway on a random
// loopback port, and a fetch-driven browser. Every refused case must create no account.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { spawnProvider, waitForReadyProviders, type ProviderProcess } from "../support/harness.ts";
import { Browser, freePort, lastRefusal, loginAtIdp, shownApiKey, startLocalIdp, startLoggingGateway, type LocalIdp } from "../support/oidcBrowser.ts";
import { startScriptedIdp, type ScriptedIdp } from "../support/oidcScripted.ts";

const LOCAL = { client_id: "gateway-local", client_secret: "local-client-secret-0123456789" };
const SCRIPTED = { clientId: "gateway-scripted", clientSecret: "scripted-client-secret-0123456789" };

let gw: Awaited<ReturnType<typeof startLoggingGateway>>;
let idp: LocalIdp;
let scripted: ScriptedIdp;
let provider: ProviderProcess;

beforeAll(async () => {
  const idpPort = freePort();
  const localIssuer = `http://127.0.0.1:${idpPort}`;
  scripted = await startScriptedIdp(SCRIPTED);
  gw = await startLoggingGateway({
    oidcProviders: JSON.stringify([
      { name: "local", issuer: localIssuer, clientId: LOCAL.client_id, clientSecret: LOCAL.client_secret },
      // Same IdP and client, but /auth/unregistered/callback is not among the client's redirect URIs.
      { name: "unregistered", issuer: localIssuer, clientId: LOCAL.client_id, clientSecret: LOCAL.client_secret },
      { name: "scripted", issuer: scripted.issuer, clientId: SCRIPTED.clientId, clientSecret: SCRIPTED.clientSecret },
    ]),
  });
  idp = await startLocalIdp({ port: idpPort, clients: [{ ...LOCAL, redirect_uris: [`${gw.url}/auth/local/callback`] }] });
  provider = spawnProvider(gw, { id: "signup-prov", models: ["test-model"] });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider?.kill();
  await idp?.stop();
  scripted?.stop();
  await gw?.close();
});

const accountCount = async () => (await gw.gateway.store.listAccounts()).length;
const callbackPrefix = (name: string) => `${gw.url}/auth/${name}/callback`;

/** /auth/<idp>/start in `browser`: the IdP authorization URL it redirects to. */
async function startFlow(browser: Browser, name = "local"): Promise<URL> {
  const response = await browser.get(`${gw.url}/auth/${name}/start`);
  expect(response.status).toBe(303);
  return new URL(response.headers.get("location")!);
}

/** Starts a flow and logs in at the local IdP; the callback URL the IdP sends the browser to. */
async function codeFor(browser: Browser, login: string, authorizationUrl?: URL): Promise<string> {
  const url = authorizationUrl ?? (await startFlow(browser));
  const result = await loginAtIdp(browser, url.href, login, callbackPrefix("local"));
  if (result.callbackUrl === null) throw new Error(`IdP refused: ${result.response.status}`);
  return result.callbackUrl;
}

/** Delivers a callback and expects a refusal page for `reason` (as logged); returns the page. */
async function expectRefused(browser: Browser, callbackUrl: string, reason: RegExp): Promise<string> {
  const response = await browser.get(callbackUrl);
  expect(response.status).toBe(400);
  expect(response.headers.get("set-cookie") ?? "").not.toContain("gw_session");
  const html = await response.text();
  expect(html).toContain("signin_failed");
  expect(lastRefusal(gw.logs)).toMatch(reason);
  return html;
}

describe("sign-up with the local OpenID provider", () => {
  test("the account page shows the new key exactly once, and the key serves a chat completion", async () => {
    const before = await accountCount();
    const browser = new Browser();
    const callback = await browser.get(await codeFor(browser, "alice"));
    expect(callback.status).toBe(303);
    expect(callback.headers.get("location")).toBe("/account");
    const session = callback.headers.getSetCookie().find((c) => c.startsWith("gw_session="))!;
    expect(session).toContain("HttpOnly");
    expect(session).toContain("SameSite=Lax");
    expect(await accountCount()).toBe(before + 1);

    const page = await browser.get(`${gw.url}/account`);
    expect(page.status).toBe(200);
    expect(page.headers.get("cache-control")).toBe("no-store");
    const html = await page.text();
    const apiKey = shownApiKey(html);
    expect(apiKey).toMatch(/^gw_[A-Za-z0-9_-]{43}$/);
    expect(html).toContain("alice@example.test");

    // A reload shows only the prefix.
    const reload = await (await browser.get(`${gw.url}/account`)).text();
    expect(shownApiKey(reload)).toBeNull();
    expect(reload).not.toContain(apiKey!);
    expect(reload).toContain(`${apiKey!.slice(0, 11)}…`);

    const client = new OpenAI({ apiKey: apiKey!, baseURL: gw.baseURL, maxRetries: 0 });
    const completion = await client.chat.completions.create({ model: "test-model", messages: [{ role: "user", content: "Hi" }], max_tokens: 5 });
    expect(completion.choices[0]!.message.content!.length).toBeGreaterThan(0);
  });

  test("signing in again finds the same account and issues no new key", async () => {
    const first = new Browser();
    await first.get(await codeFor(first, "bob"));
    const firstPage = await (await first.get(`${gw.url}/account`)).text();
    const accountId = /Account <code>(acct_[a-z0-9]+)<\/code>/.exec(firstPage)![1];
    const count = await accountCount();

    const second = new Browser();
    expect((await second.get(await codeFor(second, "bob"))).status).toBe(303);
    const secondPage = await (await second.get(`${gw.url}/account`)).text();
    expect(await accountCount()).toBe(count);
    expect(secondPage).toContain(accountId!);
    expect(shownApiKey(secondPage)).toBeNull();
    expect(await gw.gateway.store.listApiKeys(accountId!)).toHaveLength(1);
  });

  test("a bad or missing state is refused and creates nothing", async () => {
    const browser = new Browser();
    const callback = new URL(await codeFor(browser, "carol"));
    const before = await accountCount();
    const tampered = new URL(callback);
    tampered.searchParams.set("state", `${callback.searchParams.get("state")}x`);
    await expectRefused(browser, tampered.href, /^unknown_or_used_state$/);
    const missing = new URL(callback);
    missing.searchParams.delete("state");
    await expectRefused(browser, missing.href, /^missing_state$/);
    expect(await accountCount()).toBe(before);
  });

  test("a callback delivered in another browser (login CSRF) is refused and creates nothing", async () => {
    const attacker = new Browser();
    const callback = await codeFor(attacker, "mallory");
    const before = await accountCount();
    await expectRefused(new Browser(), callback, /^browser_mismatch$/);
    expect(await accountCount()).toBe(before);
  });

  test("a replayed callback (same state and code) is refused", async () => {
    const browser = new Browser();
    const callback = await codeFor(browser, "dave");
    expect((await browser.get(callback)).status).toBe(303);
    const after = await accountCount();
    const html = await expectRefused(browser, callback, /^unknown_or_used_state$/);
    expect(html).toContain("already used");
    expect(await accountCount()).toBe(after);
  });

  test("a code from another sign-in (wrong PKCE verifier) is refused and creates nothing", async () => {
    const browser = new Browser();
    const flowA = await startFlow(browser);
    const flowB = await startFlow(browser);
    const callbackA = new URL(await codeFor(browser, "erin", flowA));
    const before = await accountCount();
    // Flow B's state (so B's verifier is sent) with flow A's code: PKCE binds the code to A's challenge.
    const injected = new URL(callbackA);
    injected.searchParams.set("state", flowB.searchParams.get("state")!);
    await expectRefused(browser, injected.href, /invalid_grant/);
    expect(await accountCount()).toBe(before);
  });

  test("a code issued without the PKCE challenge is refused and creates nothing", async () => {
    const browser = new Browser();
    const flow = await startFlow(browser);
    // The same authorization request with its challenge stripped: the code is bound to no challenge,
    // so the verifier the gateway sends cannot match it.
    flow.searchParams.delete("code_challenge");
    flow.searchParams.delete("code_challenge_method");
    const before = await accountCount();
    await expectRefused(browser, await codeFor(browser, "frank", flow), /invalid_grant/);
    expect(await accountCount()).toBe(before);
  });

  test("a stolen code cannot be redeemed without the PKCE verifier, even with the client secret", async () => {
    const browser = new Browser();
    const callback = new URL(await codeFor(browser, "grace"));
    const before = await accountCount();
    const token = await fetch(`${idp.issuer}/token`, {
      method: "POST",
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        authorization: `Basic ${Buffer.from(`${LOCAL.client_id}:${LOCAL.client_secret}`).toString("base64")}`,
      },
      body: new URLSearchParams({ grant_type: "authorization_code", code: callback.searchParams.get("code")!, redirect_uri: callbackPrefix("local") }),
    });
    expect(token.status).toBe(400);
    expect(((await token.json()) as { error: string }).error).toBe("invalid_grant");
    expect(await accountCount()).toBe(before);
  });

  test("an ID token with another nonce is refused and creates nothing", async () => {
    const browser = new Browser();
    const flow = await startFlow(browser);
    // Same state and PKCE challenge, so the code exchange itself succeeds; only the nonce differs.
    flow.searchParams.set("nonce", "a-nonce-this-gateway-never-issued");
    const before = await accountCount();
    await expectRefused(browser, await codeFor(browser, "heidi", flow), /CLAIM_COMPARISON_FAILED/);
    expect(await accountCount()).toBe(before);
  });

  test("an unregistered redirect URI: the IdP never sends the browser back, nothing is created", async () => {
    const before = await accountCount();
    const browser = new Browser();
    const flow = await startFlow(browser, "unregistered");
    expect(flow.searchParams.get("redirect_uri")).toBe(callbackPrefix("unregistered"));
    const result = await loginAtIdp(browser, flow.href, "ivan", gw.url);
    expect(result.callbackUrl).toBeNull();
    // A forged authorization request pointing the code elsewhere is refused the same way.
    const forged = await startFlow(browser);
    forged.searchParams.set("redirect_uri", "http://127.0.0.1:9/steal");
    expect((await loginAtIdp(browser, forged.href, "ivan", "http://127.0.0.1:9/")).callbackUrl).toBeNull();
    expect(await accountCount()).toBe(before);
  });

  test("an unknown identity provider is the not_found envelope", async () => {
    for (const path of ["/auth/nope/start", "/auth/nope/callback?state=x&code=y"]) {
      const response = await fetch(`${gw.url}${path}`);
      expect(response.status).toBe(404);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("not_found");
    }
  });
});

describe("ID tokens the stock provider will not issue (scripted provider)", () => {
  async function scriptedSignIn(subject: string): Promise<Response> {
    scripted.subject = subject;
    const browser = new Browser();
    const { url } = await browser.follow(`${gw.url}/auth/scripted/start`, (u) => u.startsWith(callbackPrefix("scripted")));
    return browser.get(url);
  }

  test("a well-formed ID token signs up (the control case)", async () => {
    scripted.mode = "good";
    const before = await accountCount();
    expect((await scriptedSignIn("control")).status).toBe(303);
    expect(await accountCount()).toBe(before + 1);
  });

  test.each([
    ["from another issuer", "foreign_issuer", /CLAIM_COMPARISON_FAILED/],
    ["expired", "expired", /TIMESTAMP_CHECK_FAILED/],
    ["signed with a key outside the JWKS", "wrong_key", /./],
    ["for another audience", "wrong_audience", /CLAIM_COMPARISON_FAILED/],
    ["issued an hour in the future", "issued_in_future", /^iat_in_future$/],
  ] as const)("an ID token %s is refused and creates nothing", async (_what, mode, reason) => {
    scripted.mode = mode;
    const issued = scripted.tokensIssued;
    const before = await accountCount();
    const response = await scriptedSignIn(`victim-${mode}`);
    expect(response.status).toBe(400);
    expect(await response.text()).toContain("signin_failed");
    // The provider did issue the token: the gateway itself refused it.
    expect(scripted.tokensIssued).toBe(issued + 1);
    expect(await accountCount()).toBe(before);
    expect(lastRefusal(gw.logs)).toMatch(reason);
  });
});
