// Popular client libraries, unmodified, against a real gateway: the Vercel AI SDK's OpenAI-compatible
// provider and LangChain's ChatOpenAI (over chat completions, and over /v1/responses with
// useResponsesApi). Only the base URL and the API key are set.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { streamText } from "ai";
import { ChatOpenAI } from "@langchain/openai";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { startRecordingProvider, type RecordingProvider } from "./support.ts";

let gw: TestGateway;
let provider: RecordingProvider;

beforeAll(async () => {
  gw = await startTestGateway({ responsesFacade: true });
  provider = await startRecordingProvider(gw, "prov-rec");
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.stop();
  await gw.close();
});

const prompt = "Tell me about the sea.";
const expected = (maxTokens: number) => syntheticText([{ role: "user", content: prompt }], maxTokens).join("");

describe("Vercel AI SDK (ai + @ai-sdk/openai-compatible)", () => {
  test("streamText streams the provider's text through chat completions", async () => {
    const gateway = createOpenAICompatible({ name: "gateway", baseURL: gw.baseURL, apiKey: gw.apiKey });
    const result = streamText({ model: gateway.chatModel("test-model"), prompt, maxOutputTokens: 20, maxRetries: 0 });
    const parts: string[] = [];
    for await (const part of result.textStream) parts.push(part);
    expect(parts.length).toBeGreaterThan(1);
    expect(parts.join("")).toBe(expected(20));
  });
});

describe("LangChain ChatOpenAI (@langchain/openai)", () => {
  test("stream() over chat completions", async () => {
    const model = new ChatOpenAI({ model: "test-model", apiKey: gw.apiKey, maxTokens: 20, maxRetries: 0, configuration: { baseURL: gw.baseURL } });
    const parts: string[] = [];
    for await (const chunk of await model.stream(prompt)) parts.push(String(chunk.content));
    expect(parts.length).toBeGreaterThan(1);
    expect(parts.join("")).toBe(expected(20));
  });

  test("stream() over the responses facade (useResponsesApi)", async () => {
    const model = new ChatOpenAI({
      model: "test-model",
      apiKey: gw.apiKey,
      maxTokens: 20,
      maxRetries: 0,
      useResponsesApi: true,
      configuration: { baseURL: gw.baseURL },
    });
    let text = "";
    for await (const chunk of await model.stream(prompt)) text += chunk.text;
    expect(text).toBe(expected(20));
  });
});
