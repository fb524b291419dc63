// The official openai SDK against a real gateway with two real provider runtimes (child processes).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let providers: ProviderProcess[];
let client: OpenAI;

beforeAll(async () => {
  gw = await startTestGateway();
  providers = [
    spawnProvider(gw, { id: "prov-a", tokensPerSecond: 50 }),
    spawnProvider(gw, { id: "prov-b", tokensPerSecond: 50 }),
  ];
  await waitForReadyProviders(gw, 2);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await Promise.all(providers.map((p) => p.kill()));
  await gw.close();
});

const messages = [
  { role: "system" as const, content: "You are terse." },
  { role: "user" as const, content: "Tell me about the sea." },
];
const expected = (maxTokens: number) => syntheticText(messages, maxTokens).join("");

describe("chat completions through the gateway", () => {
  test("non-streaming: the text equals the provider's, with usage and finish_reason", async () => {
    const res = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 20 });
    expect(res.object).toBe("chat.completion");
    expect(res.choices[0]!.message.content).toBe(expected(20));
    expect(res.choices[0]!.finish_reason).toBeOneOf(["stop", "length"]);
    expect(res.usage!.completion_tokens).toBe(syntheticText(messages, 20).length);
    expect(res.usage!.prompt_tokens).toBeGreaterThan(0);
  });

  test("streaming: chunks arrive incrementally and join to the provider's text", async () => {
    const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 30, stream: true });
    const arrivals: number[] = [];
    let text = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (choice?.delta.content) {
        text += choice.delta.content;
        arrivals.push(performance.now());
      }
      if (choice?.finish_reason) finish = choice.finish_reason;
    }
    expect(text).toBe(expected(30));
    expect(finish).not.toBeNull();
    // At 50 tokens/s the provider needs > 100 ms for the whole answer: the first chunk must
    // reach the buyer well before the last one (no buffering of the whole answer).
    expect(arrivals.length).toBeGreaterThan(5);
    expect(arrivals.at(-1)! - arrivals[0]!).toBeGreaterThan(60);
  });

  test("stream_options.include_usage adds a final usage chunk with empty choices", async () => {
    const stream = await client.chat.completions.create({
      model: "test-model",
      messages,
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.completion_tokens).toBe(syntheticText(messages, 8).length);
    expect(last.usage!.total_tokens).toBe(last.usage!.prompt_tokens + last.usage!.completion_tokens);
  });

  test("text-only content arrays are joined and served like strings", async () => {
    const res = await client.chat.completions.create({
      model: "test-model",
      max_tokens: 12,
      messages: [
        { role: "system", content: [{ type: "text", text: "You are terse." }] },
        { role: "user", content: [{ type: "text", text: "Tell me " }, { type: "text", text: "about the sea." }] },
      ],
    });
    expect(res.choices[0]!.message.content).toBe(expected(12));
  });

  test("two concurrent streams are served by both providers", async () => {
    const run = async () => {
      const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 10, stream: true });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
      return text;
    };
    const [a, b] = await Promise.all([run(), run()]);
    expect(a).toBe(expected(10));
    expect(b).toBe(expected(10));
  });

  test("the response carries X-Request-ID", async () => {
    const { response } = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 2 }).withResponse();
    expect(response.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{24}$/);
  });

  test("a client UUID X-Request-ID is echoed", async () => {
    const uuid = crypto.randomUUID();
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json", "x-request-id": uuid },
      body: JSON.stringify({ model: "test-model", messages, max_tokens: 2 }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toBe(uuid);
  });
});
