// With the operator's flags off (the default), neither facade is mounted: its path is not_found.
import { afterAll, beforeAll, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { startTestGateway, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway();
});

afterAll(async () => {
  await gw.close();
});

test.each(["/v1/messages", "/v1/responses"])("POST %s → 404 not_found", async (path) => {
  const res = await fetch(`${gw.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}`, "x-api-key": gw.apiKey },
    body: JSON.stringify({ model: "test-model", max_tokens: 5, input: "hi", messages: [{ role: "user", content: "hi" }] }),
  });
  expect(res.status).toBe(404);
  expect(await res.json()).toMatchObject({ error: { code: "not_found", type: "not_found_error" } });
  expect(res.headers.get("x-request-id")).toMatch(/^req_/);
});

test("the Anthropic SDK gets a NotFoundError", async () => {
  const client = new Anthropic({ apiKey: gw.apiKey, baseURL: gw.url, maxRetries: 0 });
  const error = await client.messages.create({ model: "test-model", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }).catch((e: unknown) => e);
  expect(error).toBeInstanceOf(Anthropic.NotFoundError);
});

test("the openai SDK gets a NotFoundError", async () => {
  const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
  const error = await client.responses.create({ model: "test-model", input: "hi" }).catch((e: unknown) => e);
  expect(error).toBeInstanceOf(OpenAI.NotFoundError);
});

test("enabling one facade does not mount the other", async () => {
  const only = await startTestGateway({ messagesFacade: true });
  try {
    const res = await fetch(`${only.baseURL}/responses`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${only.apiKey}` },
      body: JSON.stringify({ model: "test-model", input: "hi" }),
    });
    expect(res.status).toBe(404);
  } finally {
    await only.close();
  }
});
