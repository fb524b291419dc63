// A 400 reaches an SDK user in plain words: which field, and what it allows.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { startTestGateway, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let client: OpenAI;
beforeAll(async () => {
  gw = await startTestGateway();
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});
afterAll(async () => {
  await gw?.close();
});

test.each([
  [{ model: "m", messages: [{ role: "user", content: "hi" }], temperature: 3 }, "'temperature' must be a number between 0 and 2.", "temperature"],
  [{ model: "m" }, "'messages' is required.", "messages"],
  [{ model: "m", messages: [{ role: "robot", content: "hi" }] }, "'messages[0].role' must be one of 'system', 'developer', 'user', 'assistant' or 'tool'.", "messages[0].role"],
] as const)("%j → %s", async (body, message, param) => {
  const error = await client.chat.completions.create(body as never).catch((e: unknown) => e);
  expect(error).toBeInstanceOf(OpenAI.BadRequestError);
  expect((error as InstanceType<typeof OpenAI.BadRequestError>).error).toMatchObject({ message, param, code: "invalid_request", type: "invalid_request_error" });
});
