// With the operator's flags off (the default), a facade's path answers 404 endpoint_disabled in that
// endpoint's own error style, saying the endpoint exists but is off on this gateway.
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

const post = (base: string, path: string, apiKey: string) =>
  fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}`, "x-api-key": apiKey },
    body: JSON.stringify({ model: "test-model", max_tokens: 5, input: "hi", messages: [{ role: "user", content: "hi" }] }),
  });

test.each(["/v1/messages", "/v1/messages/count_tokens"])("POST %s → 404 in the messages envelope, naming the flag", async (path) => {
  const res = await post(gw.url, path, gw.apiKey);
  expect(res.status).toBe(404);
  const body = (await res.json()) as { type: string; error: { code: string; type: string; message: string } };
  expect(body).toMatchObject({ type: "error", error: { code: "endpoint_disabled", type: "not_found_error" } });
  expect(body.error.message).toContain("exists but is disabled on this gateway");
  expect(body.error.message).toContain("--messages-facade");
  expect(res.headers.get("request-id")).toBe(res.headers.get("x-request-id"));
});

test("POST /v1/responses → 404 in the OpenAI envelope, naming the flag", async () => {
  const res = await post(gw.url, "/v1/responses", gw.apiKey);
  expect(res.status).toBe(404);
  const body = (await res.json()) as { error: { code: string; message: string } };
  expect(body).toMatchObject({ error: { code: "endpoint_disabled", type: "not_found_error" } });
  expect(body.error.message).toContain("--responses-facade");
  expect(res.headers.get("x-request-id")).toMatch(/^req_/);
});

test("the Anthropic SDK gets a NotFoundError that says why, with its request id", async () => {
  const client = new Anthropic({ apiKey: gw.apiKey, baseURL: gw.url, maxRetries: 0 });
  const error = await client.messages.create({ model: "test-model", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }).catch((e: unknown) => e);
  expect(error).toBeInstanceOf(Anthropic.NotFoundError);
  expect((error as Error).message).toContain("disabled on this gateway");
  expect((error as InstanceType<typeof Anthropic.NotFoundError>).requestID).toMatch(/^req_/);
});

test("the openai SDK gets a NotFoundError that says why", async () => {
  const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
  const error = await client.responses.create({ model: "test-model", input: "hi" }).catch((e: unknown) => e);
  expect(error).toBeInstanceOf(OpenAI.NotFoundError);
  expect((error as Error).message).toContain("disabled on this gateway");
});

test("enabling one facade leaves the other disabled", async () => {
  const only = await startTestGateway({ messagesFacade: true });
  try {
    const res = await post(only.baseURL, "/responses", only.apiKey);
    expect(res.status).toBe(404);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("endpoint_disabled");
  } finally {
    await only.close();
  }
});
