// The account page after sign-up: keys listed by prefix, rotate (new key shown once, old one revoked),
// revoke, create, sign out — every form protected by a CSRF token bound to the session.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, type TestGateway } from "../support/harness.ts";
import { Browser, shownApiKey } from "../support/oidcBrowser.ts";
import { startScriptedIdp, type ScriptedIdp } from "../support/oidcScripted.ts";

const CLIENT = { clientId: "gateway", clientSecret: "account-page-secret" };
let gw: TestGateway;
let idp: ScriptedIdp;

beforeAll(async () => {
  idp = await startScriptedIdp(CLIENT);
  gw = await startTestGateway({ oidcProviders: JSON.stringify([{ name: "idp", issuer: idp.issuer, ...CLIENT }]) });
});

afterAll(async () => {
  idp?.stop();
  await gw?.close();
});

interface SignedIn {
  browser: Browser;
  accountId: string;
  apiKey: string;
}

async function signUp(subject: string): Promise<SignedIn> {
  idp.subject = subject;
  const browser = new Browser();
  const { url } = await browser.follow(`${gw.url}/auth/idp/start`, (u) => u.startsWith(`${gw.url}/auth/idp/callback`));
  expect((await browser.get(url)).status).toBe(303);
  const html = await (await browser.get(`${gw.url}/account`)).text();
  return { browser, accountId: /Account <code>(acct_[a-z0-9]+)<\/code>/.exec(html)![1]!, apiKey: shownApiKey(html)! };
}

async function page(user: SignedIn) {
  const html = await (await user.browser.get(`${gw.url}/account`)).text();
  return { html, csrf: /name="csrf" value="([^"]+)"/.exec(html)?.[1] ?? "", keyIds: [...html.matchAll(/data-key-id="([^"]+)"/g)].map((m) => m[1]!) };
}

const modelsStatus = async (apiKey: string) => (await fetch(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${apiKey}` } })).status;

describe("account page", () => {
  test("rotate shows the new key once and revokes the old one at the same moment", async () => {
    const user = await signUp("rotator");
    const before = await page(user);
    expect(before.keyIds).toHaveLength(1);
    const rotated = await user.browser.postForm(`${gw.url}/account/keys/${before.keyIds[0]}/rotate`, { csrf: before.csrf });
    expect(rotated.status).toBe(303);
    const after = await page(user);
    const newKey = shownApiKey(after.html);
    expect(newKey).toMatch(/^gw_/);
    expect(newKey).not.toBe(user.apiKey);
    expect(shownApiKey((await page(user)).html)).toBeNull();

    expect(await modelsStatus(user.apiKey)).toBe(401);
    expect(await modelsStatus(newKey!)).toBe(200);
    const keys = await gw.gateway.store.listApiKeys(user.accountId);
    expect(keys.map((k) => k.revoked_at_ms === null)).toEqual([false, true]);
    expect(keys[1]!.label).toBe(keys[0]!.label);
  });

  test("revoke ends a key; create issues another, shown once", async () => {
    const user = await signUp("revoker");
    const { csrf, keyIds } = await page(user);
    expect((await user.browser.postForm(`${gw.url}/account/keys/${keyIds[0]}/revoke`, { csrf })).status).toBe(303);
    expect(await modelsStatus(user.apiKey)).toBe(401);
    const listed = await page(user);
    expect(listed.html).toContain("revoked");
    expect(shownApiKey(listed.html)).toBeNull();

    expect((await user.browser.postForm(`${gw.url}/account/keys`, { csrf })).status).toBe(303);
    const created = shownApiKey((await page(user)).html);
    expect(await modelsStatus(created!)).toBe(200);
  });

  test("forms without the session's CSRF token, or from another origin, change nothing", async () => {
    const user = await signUp("csrf-target");
    const other = await signUp("csrf-attacker");
    const { csrf, keyIds } = await page(user);
    const foreignCsrf = (await page(other)).csrf;
    const revoke = `${gw.url}/account/keys/${keyIds[0]}/revoke`;
    for (const [fields, headers] of [
      [{}, {}],
      [{ csrf: "forged" }, {}],
      [{ csrf: foreignCsrf }, {}],
      [{ csrf }, { origin: "https://evil.example" }],
    ] as [Record<string, string>, Record<string, string>][]) {
      const response = await user.browser.postForm(revoke, fields, headers);
      expect(response.status).toBe(403);
      expect(await response.text()).toContain("invalid_csrf_token");
    }
    expect(await modelsStatus(user.apiKey)).toBe(200);
  });

  test("another account's key cannot be rotated or revoked", async () => {
    const owner = await signUp("owner");
    const intruder = await signUp("intruder");
    const ownerKeyId = (await page(owner)).keyIds[0]!;
    const { csrf } = await page(intruder);
    for (const action of ["rotate", "revoke"]) {
      const response = await intruder.browser.postForm(`${gw.url}/account/keys/${ownerKeyId}/${action}`, { csrf });
      expect(response.status).toBe(404);
    }
    expect(await modelsStatus(owner.apiKey)).toBe(200);
    expect(await gw.gateway.store.listApiKeys(intruder.accountId)).toHaveLength(1);
  });

  test("without a session the account page and its forms ask to sign in", async () => {
    const anonymous = new Browser();
    const view = await anonymous.get(`${gw.url}/account`);
    expect(view.status).toBe(401);
    expect(await view.text()).toContain("/auth/idp/start");
    expect((await anonymous.postForm(`${gw.url}/account/keys`, { csrf: "x" })).status).toBe(401);
  });

  test("sign out ends the session for good", async () => {
    const user = await signUp("leaver");
    const cookie = user.browser.cookie(gw.url, "gw_session")!;
    const { csrf } = await page(user);
    expect((await user.browser.postForm(`${gw.url}/account/logout`, { csrf })).status).toBe(303);
    expect((await user.browser.get(`${gw.url}/account`)).status).toBe(401);
    // The old cookie value, replayed, is dead too.
    expect((await fetch(`${gw.url}/account`, { headers: { cookie: `gw_session=${cookie}` } })).status).toBe(401);
  });
});
