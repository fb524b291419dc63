// The browser demo page in a real headless browser (Debian's Chromium driven by playwright-core): no
// demo session until the first prompt, the token reused across reloads, answers streamed into a chat
// transcript with the usage at the end, errors shown in place, and a refusal that says when to come
// back, disables Send and says how to get a key.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { chromium, type Browser, type Page } from "playwright-core";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

const CHROMIUM = "/usr/bin/chromium";
const hasChromium = existsSync(CHROMIUM);
if (!hasChromium) {
  // Visible in every run's output, beside the skipped test's name.
  console.warn(`SKIPPED: demo page browser test — ${CHROMIUM} not found (install Debian's chromium package; .ci/run does as root).`);
}

/**
 * Polls a page-side expression (a string: this project's TypeScript has no DOM types) from the test:
 * waitForFunction's in-page polling evaluates the string with eval, which the page's CSP
 * (script-src 'self') refuses whenever the first check is not already true.
 */
async function until(page: Page, expression: string, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await page.evaluate(expression))) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(5);
  }
}

describe.skipIf(!hasChromium)(`demo page in headless Chromium (needs ${CHROMIUM})`, () => {
  let gw: TestGateway;
  let provider: ProviderProcess;
  let browser: Browser;

  beforeAll(async () => {
    gw = await startTestGateway();
    provider = spawnProvider(gw, { id: "browser-prov", models: ["test-model"], tokensPerSecond: 100 });
    await waitForReadyProviders(gw, 1);
    // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
  }, 30_000);

  afterAll(async () => {
    await browser?.close();
    await provider?.kill();
    await gw?.close();
  });

  /** A new tab on /demo that counts the demo sessions it asks for. */
  async function openDemo(context = browser) {
    const page = await context.newPage();
    const failures: string[] = [];
    const sessions: string[] = [];
    page.on("pageerror", (error) => failures.push(String(error)));
    page.on("request", (request) => {
      if (request.url().endsWith("/auth/demo-session")) sessions.push(request.method());
    });
    await page.goto(`${gw.url}/demo`);
    await page.waitForSelector('#status[data-state="ready"]', { timeout: 10_000 });
    return { page, failures, sessions };
  }

  async function send(page: Page, prompt: string) {
    await page.fill("#prompt", prompt);
    await page.click("#send");
  }

  test("no session on load; the first prompt gets one and streams into the transcript, usage at the end", async () => {
    const { page, failures, sessions } = await openDemo();
    expect(await page.inputValue("#model")).toBe("test-model");
    expect(sessions).toEqual([]);

    const prompt = "Say hello in one sentence.";
    await send(page, prompt);
    // Streamed, not delivered whole: part of the answer is on the page while the stream still runs.
    await until(page, '(() => { const a = document.querySelector(".turn.assistant"); return a && a.dataset.state === "streaming" && a.textContent.length > 0; })()', "streaming text");
    await page.waitForSelector('.turn.assistant[data-state="done"]', { timeout: 15_000 });
    const expected = syntheticText([{ role: "user", content: prompt }], 256);
    expect(await page.textContent(".turn.user")).toBe(prompt);
    expect(await page.evaluate('document.querySelector(".turn.assistant").firstChild.textContent')).toBe(expected.join(""));
    expect(await page.textContent(".turn.assistant .usage")).toMatch(new RegExp(`^\\d+ prompt \\+ ${expected.length} answer tokens$`));
    expect(sessions).toEqual(["POST"]);
    expect(failures).toEqual([]);
    await page.close();
  }, 30_000);

  test("reloading keeps the live token: eleven reloads and prompts in one tab use one session", async () => {
    const context = await browser.newContext();
    try {
      const { page, sessions } = await openDemo(context as unknown as Browser);
      for (let i = 0; i < 11; i++) {
        if (i > 0) {
          await page.reload();
          await page.waitForSelector('#status[data-state="ready"]', { timeout: 10_000 });
        }
        if (i % 5 === 0) {
          await send(page, `Reload ${i}`);
          await page.waitForSelector('.turn.assistant[data-state="done"]', { timeout: 15_000 });
        }
      }
      expect(sessions).toEqual(["POST"]);
    } finally {
      await context.close();
    }
  }, 60_000);

  test("an error is shown in place, in the answer's bubble, and Send works again", async () => {
    const { page } = await openDemo();
    await page.route("**/v1/chat/completions", (route) =>
      route.fulfill({ status: 400, contentType: "application/json", body: JSON.stringify({ error: { message: "'messages' is required.", type: "invalid_request_error", code: "invalid_request", param: "messages", retryable: false } }) }),
    );
    await send(page, "anything");
    await page.waitForSelector('.turn.assistant.error[data-state="error"]', { timeout: 10_000 });
    expect(await page.textContent(".turn.assistant.error")).toBe("'messages' is required.");
    expect(await page.isDisabled("#send")).toBe(false);
    await page.close();
  }, 30_000);
});

describe.skipIf(!hasChromium)("demo page refusals and sign-up (headless Chromium)", () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
  }, 30_000);
  afterAll(async () => {
    await browser?.close();
  });

  test("out of sessions: the time to come back in words, Send disabled, a link to sign up", async () => {
    // An identity provider is configured (never contacted here), so sign-up is on and the page links to it.
    const oidcProviders = JSON.stringify([{ name: "idp", issuer: "http://127.0.0.1:9/", clientId: "c", clientSecret: "s" }]);
    const gw = await startTestGateway({ demoSessionsPerHour: 0, oidcProviders });
    try {
      const page = await browser.newPage();
      await page.goto(`${gw.url}/demo`);
      expect(await page.getAttribute("a#get-key", "href")).toBe("/account");
      // No provider is needed to be refused; the page's own model load (which finds none) must end
      // first, or it empties the list after the test fills it.
      await page.waitForFunction('document.getElementById("status").textContent !== "Loading the models…"');
      await page.evaluate('document.getElementById("model").innerHTML = "<option>test-model</option>"');
      await send(page, "hello");
      await page.waitForSelector('#status[data-state="refused"]', { timeout: 20_000 });
      const refusal = (await page.textContent("#refusal"))!;
      expect(refusal).toStartWith("This network address has started 0 demo sessions in the last hour. You can send again at ");
      expect(refusal).toMatch(/You can send again at \d{1,2}:\d{2}/);
      expect(refusal).not.toContain("Retry-After");
      expect(await page.getAttribute("#refusal a", "href")).toBe("/account");
      expect(await page.isDisabled("#send")).toBe(true);
      const retryAt = Date.parse((await page.getAttribute("#refusal", "data-retry-at"))!);
      expect(retryAt).toBeGreaterThan(Date.now() + 30 * 60_000); // the oldest session of the hour leaves it
    } finally {
      await gw.close();
    }
  }, 30_000);

  test("out of the day's demo tokens: the same refusal, with the time the quota resets", async () => {
    const gw = await startTestGateway({ demoDailyTokens: 10 });
    try {
      const page = await browser.newPage();
      await page.goto(`${gw.url}/demo`);
      // No provider is needed to be refused; the page's own model load (which finds none) must end
      // first, or it empties the list after the test fills it.
      await page.waitForFunction('document.getElementById("status").textContent !== "Loading the models…"');
      await page.evaluate('document.getElementById("model").innerHTML = "<option>test-model</option>"');
      await send(page, "hello");
      await page.waitForSelector('#status[data-state="refused"]', { timeout: 20_000 });
      const refusal = (await page.textContent("#refusal"))!;
      expect(refusal).toStartWith("The daily token quota (10) is used up for this request");
      expect(refusal).toMatch(/You can send again at \d{1,2}:\d{2}/);
      expect(refusal).toContain("ask this gateway's operator for an API key");
      expect(await page.isDisabled("#send")).toBe(true);
      // The time shown is the quota's reset: the next 00:00 UTC.
      const retryAt = new Date((await page.getAttribute("#refusal", "data-retry-at"))!);
      const midnight = new Date();
      midnight.setUTCHours(24, 0, 0, 0);
      expect(Math.abs(retryAt.getTime() - midnight.getTime())).toBeLessThan(5_000);
      // The refusal is also in the answer's own bubble.
      expect(await page.textContent(".turn.assistant.error")).toContain("daily token quota");
    } finally {
      await gw.close();
    }
  }, 30_000);

  test("sign-up off: the page says so and what the operator runs instead", async () => {
    const gw = await startTestGateway();
    try {
      const page = await browser.newPage();
      await page.goto(`${gw.url}/demo`);
      expect(await page.locator("a#get-key").count()).toBe(0);
      expect(await page.textContent(".note")).toContain("Sign-up is not enabled on this gateway");
      expect(await page.textContent("#get-key")).toBe("gateway accounts create --tier free --name NAME");
    } finally {
      await gw.close();
    }
  }, 30_000);

  async function send(page: Page, prompt: string) {
    await page.fill("#prompt", prompt);
    await page.click("#send");
  }
});
