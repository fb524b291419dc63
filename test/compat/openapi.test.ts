// GET /openapi.json is a valid OpenAPI 3.1 document listing every public route, with the request
// schemas the routes validate with; GET /docs renders it offline, every asset from this gateway.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Validator } from "@seriousme/openapi-schema-validator";
import { chromium } from "playwright-core";
import { ChatCompletionRequest } from "../../src/http/chat/schema.ts";
import { startTestGateway, type TestGateway } from "../support/harness.ts";

type Doc = { openapi: string; paths: Record<string, Record<string, { requestBody?: { content: Record<string, { schema: unknown }> }; summary?: string }>> };

let gw: TestGateway;
let doc: Doc;

beforeAll(async () => {
  gw = await startTestGateway();
  const res = await fetch(`${gw.url}/openapi.json`);
  expect(res.headers.get("content-type")).toContain("application/json");
  doc = (await res.json()) as Doc;
});

afterAll(async () => {
  await gw?.close();
});

const openApiPath = (path: string) => path.replace(/:([^/]+)/g, "{$1}");

test("the document is valid OpenAPI 3.1", async () => {
  expect(doc.openapi).toStartWith("3.1.");
  const result = await new Validator().validate(doc as never);
  expect(result.errors ?? []).toEqual([]);
  expect(result.valid).toBe(true);
});

test("every mounted public route is in it, with a summary, and so is the provider WebSocket", () => {
  const mounted = gw.gateway.httpRoutes().filter((r) => !r.hidden && r.method !== "OPTIONS");
  expect(mounted.length).toBeGreaterThan(20);
  const undocumented = mounted
    .filter((route) => !doc.paths[openApiPath(route.path)]?.[route.method.toLowerCase()]?.summary)
    .map((route) => `${route.method} ${openApiPath(route.path)}`);
  // A new route needs its row in ROUTE_DOCS (or `detail: { hide: true }` when it is not public).
  expect({ "missing from ROUTE_DOCS in src/http/docs/openapi.ts": undocumented }).toEqual({ "missing from ROUTE_DOCS in src/http/docs/openapi.ts": [] });
  expect(doc.paths["/v1/provider/connect"]?.get).toBeDefined();
});

test("every endpoint of the README's table is in it", () => {
  const readme = readFileSync(join(import.meta.dir, "../../README.md"), "utf8");
  const table = readme.slice(readme.indexOf("## Endpoints"), readme.indexOf("## Documentation"));
  const paths = [...table.matchAll(/`(?:(GET|POST) )?(\/[^`\s]*)`/g)].map((m) => m[2]!.replace("<idp>", "{idp}"));
  expect(paths.length).toBeGreaterThan(15);
  for (const path of paths) expect({ path, documented: path in doc.paths }).toEqual({ path, documented: true });
});

test("request bodies are the very schemas the routes check", () => {
  const chat = doc.paths["/v1/chat/completions"]!.post!.requestBody!.content["application/json"]!.schema;
  expect(chat).toEqual(JSON.parse(JSON.stringify(ChatCompletionRequest)));
  for (const path of ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/feedback"]) {
    expect(doc.paths[path]!.post!.requestBody).toBeDefined();
  }
});

const CHROMIUM = "/usr/bin/chromium";
if (!existsSync(CHROMIUM)) console.warn(`SKIPPED: /docs browser test — ${CHROMIUM} not found (install Debian's chromium package).`);

describe.skipIf(!existsSync(CHROMIUM))("/docs in headless Chromium", () => {
  test("renders the reference with every request to this gateway (works offline)", async () => {
    const html = await (await fetch(`${gw.url}/docs`)).text();
    expect(html).not.toMatch(/https?:\/\//);
    const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
    try {
      const page = await browser.newPage();
      const elsewhere: string[] = [];
      // Offline: anything not served by this gateway is refused, as it would be without a network.
      await page.route("**/*", (route) => {
        if (route.request().url().startsWith(gw.url)) return route.continue();
        elsewhere.push(route.request().url());
        return route.abort();
      });
      await page.goto(`${gw.url}/docs`);
      // The renderer is one 4 MB script: parsing it takes seconds on a loaded machine.
      await page.getByText("Create a chat completion", { exact: false }).first().waitFor({ timeout: 60_000 });
      expect(await page.getByText("Inference gateway").count()).toBeGreaterThan(0);
      expect(elsewhere).toEqual([]);
    } finally {
      await browser.close();
    }
  }, 90_000);
});
