// The operator console in a real headless Chromium (Debian's, driven by playwright-core): sign in with
// the operator token, see the four statecharts drawn (ELK layout), watch the live counts move while
// requests run, follow one actor, and never ask any origin but the gateway's. A screenshot of the page
// under traffic is saved to test-output/console.png.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser } from "playwright-core";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

const CHROMIUM = "/usr/bin/chromium";
const hasChromium = existsSync(CHROMIUM);
if (!hasChromium) console.warn(`SKIPPED: console browser test — ${CHROMIUM} not found (install Debian's chromium package; .ci/run does as root).`);

const TOKEN = `console-test-${crypto.randomUUID()}`;
const OUTPUT = join(import.meta.dir, "../../test-output");

describe.skipIf(!hasChromium)(`operator console in headless Chromium (needs ${CHROMIUM})`, () => {
  let gw: TestGateway;
  const providers: ProviderProcess[] = [];
  let browser: Browser;

  beforeAll(async () => {
    gw = await startTestGateway({ consoleToken: TOKEN, freeConcurrentRequests: 16 });
    providers.push(spawnProvider(gw, { id: "alpha-gpu", models: ["test-model", "llama-3-8b"], tokensPerSecond: 40, maxConcurrency: 4 }));
    providers.push(spawnProvider(gw, { id: "beta-gpu", models: ["test-model"], tokensPerSecond: 40, maxConcurrency: 4 }));
    await waitForReadyProviders(gw, 2, 20_000);
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
  }, 30_000);

  afterAll(async () => {
    await browser?.close();
    for (const p of providers) await p.kill();
    await gw?.close();
  });

  test("sign in, the four machines drawn, live counts move under traffic, one actor followed, same origin only", async () => {
    const page = await browser.newPage({ viewport: { width: 1440, height: 1500 } });
    const failures: string[] = [];
    const requested: string[] = [];
    let signedIn = false;
    page.on("pageerror", (error) => failures.push(String(error)));
    // After sign-in, no console error at all (a CSP refusal would show here); before it, the 401 does.
    page.on("console", (message) => {
      if (signedIn && message.type() === "error") failures.push(message.text());
    });
    page.on("request", (request) => requested.push(request.url()));
    page.on("websocket", (ws) => requested.push(ws.url()));

    // Without a session the console is the login form (401), and holds no data.
    const first = await page.goto(`${gw.url}/console`);
    expect(first!.status()).toBe(401);
    expect(await page.content()).not.toContain("providerSession");
    await page.fill('input[name="token"]', TOKEN);
    signedIn = true;
    await Promise.all([page.waitForURL(`${gw.url}/console`), page.click('button[type="submit"]')]);
    // The four layouts run in a Web Worker: seconds on a loaded machine.
    await page.waitForSelector('body[data-ready="true"]', { timeout: 45_000 }).catch((error) => {
      throw new Error(`the console never got ready: ${String(error).slice(0, 200)}; page errors: ${JSON.stringify(failures)}`);
    });

    // The four statecharts, each laid out by ELK in the page, with a count badge on every state.
    for (const machine of ["gateway", "providerSession", "request", "settlement"]) {
      expect(await page.locator(`[data-machine="${machine}"] svg .state`).count()).toBeGreaterThan(2);
    }
    expect(await page.locator('[data-count-for="request.receiving"]').count()).toBe(1);
    await page.waitForSelector('[data-count-for="providerSession.admitted.ready"]:not(:text("0"))', { timeout: 10_000 });

    // Traffic: streaming requests, a few at a time, while the page is watched.
    let running = true;
    const traffic = (async () => {
      let i = 0;
      while (running) {
        await Promise.all(
          Array.from({ length: 3 }, () =>
            fetch(`${gw.baseURL}/chat/completions`, {
              method: "POST",
              headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
              body: JSON.stringify({ model: "test-model", stream: true, max_tokens: 24, messages: [{ role: "user", content: `console traffic ${i++}` }] }),
            }).then((r) => r.text()),
          ),
        );
      }
    })();
    const seen = new Set<string>();
    const deadline = performance.now() + 15_000;
    while (performance.now() < deadline && (seen.size < 2 || ![...seen].some((v) => v !== "0"))) {
      seen.add((await page.textContent('[data-total-for="request"]')) ?? "");
      await Bun.sleep(100);
    }
    expect([...seen].some((v) => Number(v) > 0)).toBe(true);
    expect(seen.size).toBeGreaterThan(1);

    // Follow one provider session: its state, redacted context and events.
    await page.click('[data-state="providerSession.admitted.ready"], [data-state="providerSession.admitted.busy"]');
    await page.waitForSelector("#actor:not([hidden]) pre.context", { timeout: 10_000 });
    expect(await page.textContent("#actor h2")).toContain("providerSession");

    mkdirSync(OUTPUT, { recursive: true });
    const actorShot = join(OUTPUT, "console-actor.png");
    await page.screenshot({ path: actorShot });
    await page.click("#actor .close");
    const shot = join(OUTPUT, "console.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`console screenshots: ${shot}, ${actorShot}`);
    running = false;
    await traffic;

    const origin = new URL(gw.url).origin;
    expect(requested.length).toBeGreaterThan(5);
    expect(requested.filter((url) => !url.startsWith(origin) && !url.startsWith("data:") && !url.startsWith("blob:"))).toEqual([]);
    expect(failures).toEqual([]);
  }, 120_000);
});
