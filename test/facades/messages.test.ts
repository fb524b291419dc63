// POST /v1/messages through a real gateway with the official @anthropic-ai/sdk as the client and a real
// provider session (synthetic engine) that records the jobs it receives.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import { syntheticText, syntheticToolCall, SYNTHETIC_TOOL_MARKER } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";
import { parseSse, startRecordingProvider, type RecordingProvider } from "./support.ts";

let gw: TestGateway;
let provider: RecordingProvider;
let client: Anthropic;

beforeAll(async () => {
  gw = await startTestGateway({ messagesFacade: true });
  provider = await startRecordingProvider(gw, "prov-rec");
  await waitForReadyProviders(gw, 1);
  client = new Anthropic({ apiKey: gw.apiKey, baseURL: gw.url, maxRetries: 0 });
});

afterAll(async () => {
  await provider.stop();
  await gw.close();
});

const prompt = "Tell me about the sea.";
const expected = (text: string, maxTokens: number) => syntheticText([{ role: "user", content: text }], maxTokens).join("");
const weatherTool = {
  name: "get_weather",
  description: "Current weather of a city",
  input_schema: { type: "object" as const, properties: { city: { type: "string" } }, required: ["city"] },
};

const post = (body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${gw.url}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-api-key": gw.apiKey, "anthropic-version": "2023-06-01", ...headers },
    body: JSON.stringify(body),
  });

describe("messages.create", () => {
  test("plain: a message object with the provider's text, stop_reason and usage; system reaches the provider", async () => {
    const { data: message, response } = await client.messages
      .create({ model: "test-model", max_tokens: 20, system: "You are terse.", messages: [{ role: "user", content: prompt }] })
      .withResponse();
    expect(message.type).toBe("message");
    expect(message.role).toBe("assistant");
    expect(message.id).toMatch(/^msg_[0-9a-f]{24}$/);
    expect(message.model).toBe("test-model");
    expect(message.content as unknown[]).toEqual([{ type: "text", text: expected(prompt, 20) }]);
    expect(message.stop_reason).toBeOneOf(["end_turn", "max_tokens"]);
    expect(message.usage.output_tokens).toBe(syntheticText([{ role: "user", content: prompt }], 20).length);
    expect(message.usage.input_tokens).toBeGreaterThan(0);
    const job = provider.jobOf(response.headers.get("x-request-id")!)!;
    expect(job.messages).toEqual([
      { role: "system", content: "You are terse." },
      { role: "user", content: prompt },
    ]);
    expect(job.params.max_tokens).toBe(20);
  });

  test("stop_sequences, temperature, top_p and tools reach the provider as chat params", async () => {
    const { response } = await client.messages
      // This SDK version's types omit the sampling parameters; the wire format has them (docs/facades.md).
      .create({
        model: "test-model",
        max_tokens: 30,
        messages: [{ role: "user", content: prompt }],
        stop_sequences: ["END"],
        temperature: 0.3,
        top_p: 0.8,
        tools: [weatherTool],
        tool_choice: { type: "auto" },
      } as Anthropic.MessageCreateParamsNonStreaming)
      .withResponse();
    const job = provider.jobOf(response.headers.get("x-request-id")!)!;
    expect(job.params).toEqual({
      max_tokens: 30,
      temperature: 0.3,
      top_p: 0.8,
      stop: ["END"],
      tools: [{ type: "function", function: { name: "get_weather", parameters: weatherTool.input_schema, description: weatherTool.description } }],
      tool_choice: "auto",
    });
  });

  test("stream: true yields the messages event sequence and the provider's text", async () => {
    const stream = await client.messages.create({ model: "test-model", max_tokens: 30, messages: [{ role: "user", content: prompt }], stream: true });
    const types: string[] = [];
    let text = "";
    let stop: string | null = null;
    let outputTokens = 0;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") text += event.delta.text;
      if (event.type === "message_delta") {
        stop = event.delta.stop_reason;
        outputTokens = event.usage.output_tokens;
      }
    }
    expect(text).toBe(expected(prompt, 30));
    expect(types[0]).toBe("message_start");
    expect(types[1]).toBe("content_block_start");
    expect(types.slice(-3)).toEqual(["content_block_stop", "message_delta", "message_stop"]);
    expect(stop).toBeOneOf(["end_turn", "max_tokens"]);
    expect(outputTokens).toBe(syntheticText([{ role: "user", content: prompt }], 30).length);
  });

  test("messages.stream() + finalMessage() assembles the same message", async () => {
    const stream = client.messages.stream({ model: "test-model", max_tokens: 25, messages: [{ role: "user", content: prompt }] });
    const deltas: string[] = [];
    stream.on("text", (delta) => deltas.push(delta));
    const message = await stream.finalMessage();
    expect(message.content as unknown[]).toEqual([{ type: "text", text: expected(prompt, 25) }]);
    expect(deltas.join("")).toBe(expected(prompt, 25));
    expect(message.usage.output_tokens).toBe(syntheticText([{ role: "user", content: prompt }], 25).length);
    expect(message.usage.input_tokens).toBeGreaterThan(0);
  });

  test("every SSE event has an event: line; ping only after message_start; message_stop last", async () => {
    const res = await post({ model: "test-model", max_tokens: 10, stream: true, messages: [{ role: "user", content: prompt }] });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("text/event-stream");
    const events = parseSse(await res.text());
    expect(events.every((e) => e.event !== null && JSON.parse(e.data).type === e.event)).toBe(true);
    expect(events[0]!.event).toBe("message_start");
    expect(events.findIndex((e) => e.event === "ping")).toBeGreaterThan(0);
    expect(events.at(-1)!.event).toBe("message_stop");
  });
});

describe("tool use", () => {
  const first = `What is the weather in Oslo? ${SYNTHETIC_TOOL_MARKER}`;

  test("a full round trip: tool_use → tool_result → final text", async () => {
    const asked = await client.messages.create({
      model: "test-model",
      max_tokens: 100,
      tools: [weatherTool],
      messages: [{ role: "user", content: first }],
    });
    expect(asked.stop_reason).toBe("tool_use");
    const toolUse = asked.content.find((b) => b.type === "tool_use");
    if (toolUse?.type !== "tool_use") throw new Error("no tool_use block");
    const scripted = syntheticToolCall([{ role: "user", content: first }], { tools: [{ type: "function", function: { name: "get_weather", parameters: weatherTool.input_schema } }] })!;
    expect(toolUse).toMatchObject({ id: scripted.id, name: "get_weather", input: { city: "synthetic" } });

    const { data: answer, response } = await client.messages
      .create({
        model: "test-model",
        max_tokens: 100,
        tools: [weatherTool],
        messages: [
          { role: "user", content: first },
          { role: "assistant", content: asked.content },
          { role: "user", content: [{ type: "tool_result", tool_use_id: toolUse.id, content: "Sunny, 21 °C" }] },
        ],
      })
      .withResponse();
    expect(answer.stop_reason).toBe("end_turn");
    expect(answer.content as unknown[]).toEqual([{ type: "text", text: expected(first, 100) }]);
    // What the provider saw: the assistant's call and the tool's result, in chat form.
    const job = provider.jobOf(response.headers.get("x-request-id")!)!;
    expect(job.messages.slice(1)).toEqual([
      { role: "assistant", content: null, tool_calls: [{ id: toolUse.id, type: "function", function: { name: "get_weather", arguments: '{"city":"synthetic"}' } }] },
      { role: "tool", content: "Sunny, 21 °C", tool_call_id: toolUse.id },
    ]);
  });

  test("tool_result.is_error reaches the provider as the tool message's content prefix", async () => {
    const call = { type: "tool_use" as const, id: "toolu_1", name: "get_weather", input: { city: "Oslo" } };
    const send = (is_error: boolean | undefined, content: Anthropic.ToolResultBlockParam["content"]) =>
      client.messages
        .create({
          model: "test-model",
          max_tokens: 20,
          tools: [weatherTool],
          messages: [
            { role: "user", content: "Oslo?" },
            { role: "assistant", content: [call] },
            { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content, ...(is_error === undefined ? {} : { is_error }) }] },
          ],
        })
        .withResponse();
    const toolMessage = async (is_error: boolean | undefined, content: Anthropic.ToolResultBlockParam["content"]) => {
      const { response } = await send(is_error, content);
      return provider.jobOf(response.headers.get("x-request-id")!)!.messages.find((m) => m.role === "tool");
    };
    expect(await toolMessage(true, "city not found")).toEqual({ role: "tool", content: "Error: city not found", tool_call_id: "toolu_1" });
    expect(await toolMessage(true, [{ type: "text", text: "time" }, { type: "text", text: "out" }])).toMatchObject({ content: "Error: timeout" });
    expect(await toolMessage(true, undefined)).toMatchObject({ content: "Error: " });
    expect(await toolMessage(false, "Sunny")).toMatchObject({ content: "Sunny" });
    expect(await toolMessage(undefined, "Sunny")).toMatchObject({ content: "Sunny" });
  });

  test("streamed tool use: input_json_delta events assemble the input in finalMessage()", async () => {
    const stream = client.messages.stream({ model: "test-model", max_tokens: 100, tools: [weatherTool], tool_choice: { type: "any" }, messages: [{ role: "user", content: "Oslo?" }] });
    const partials: string[] = [];
    stream.on("inputJson", (partial) => partials.push(partial));
    const message = await stream.finalMessage();
    expect(message.stop_reason).toBe("tool_use");
    expect(message.content).toHaveLength(1);
    expect(message.content[0]).toMatchObject({ type: "tool_use", name: "get_weather", input: { city: "synthetic" } });
    expect(partials.join("")).toBe('{"city":"synthetic"}');
  });
});

describe("unsupported features are refused with the messages envelope before dispatch", () => {
  const user = (content: unknown) => ({ model: "test-model", max_tokens: 10, messages: [{ role: "user", content }] });
  test.each<[string, Record<string, unknown>, Record<string, string>, string]>([
    ["an image block", user([{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }]), {}, "messages[0].content[0]"],
    ["a document block", user([{ type: "document", source: { type: "text", media_type: "text/plain", data: "x" } }]), {}, "messages[0].content[0]"],
    ["a file block", user([{ type: "text", text: "see file" }, { type: "file", file_id: "file_1" }]), {}, "messages[0].content[1]"],
    ["a server tool", { ...user("search"), tools: [{ type: "web_search_20250305", name: "web_search", max_uses: 1 }] }, {}, "tools[0]"],
    ["an anthropic-beta header", user("hi"), { "anthropic-beta": "prompt-caching-2024-07-31" }, "anthropic-beta"],
    ["thinking", { ...user("hi"), thinking: { type: "enabled", budget_tokens: 1024 } }, {}, "thinking"],
    ["top_k", { ...user("hi"), top_k: 40 }, {}, "top_k"],
  ])("%s", async (_name, body, headers, param) => {
    const before = provider.jobs.length;
    const res = await post(body, headers);
    expect(res.status).toBe(400);
    expect(res.headers.get("x-should-retry")).toBe("false");
    const envelope = (await res.json()) as Record<string, unknown>;
    expect(envelope).toEqual({
      type: "error",
      error: { type: "invalid_request_error", message: expect.any(String), code: "unsupported_content_shape", retryable: false, param },
    });
    expect(provider.jobs.length).toBe(before);
  });

  test("the SDK surfaces the refusal as a 400 APIError carrying the gateway's code", async () => {
    const error = await client.messages
      .create({ model: "test-model", max_tokens: 10, top_k: 5, messages: [{ role: "user", content: "hi" }] } as Anthropic.MessageCreateParamsNonStreaming)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Anthropic.BadRequestError);
    const apiError = error as InstanceType<typeof Anthropic.BadRequestError>;
    expect(apiError.status).toBe(400);
    expect(apiError.error).toMatchObject({ type: "error", error: { code: "unsupported_content_shape", retryable: false, param: "top_k" } });
  });
});

describe("credentials and errors", () => {
  test("x-api-key and Authorization: Bearer are both accepted", async () => {
    const viaHeader = await post({ model: "test-model", max_tokens: 3, messages: [{ role: "user", content: "hi" }] });
    expect(viaHeader.status).toBe(200);
    const viaBearer = await fetch(`${gw.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` },
      body: JSON.stringify({ model: "test-model", max_tokens: 3, messages: [{ role: "user", content: "hi" }] }),
    });
    expect(viaBearer.status).toBe(200);
  });

  test.each<[string, Record<string, string>, string]>([
    ["no credentials", { "x-api-key": "" }, "missing_bearer_token"],
    ["an unknown API key", { "x-api-key": "gw_not_a_key" }, "invalid_api_key"],
  ])("%s → 401 in the messages envelope", async (_name, headers, code) => {
    const res = await post({ model: "test-model", max_tokens: 3, messages: [{ role: "user", content: "hi" }] }, headers);
    expect(res.status).toBe(401);
    expect(await res.json()).toMatchObject({ type: "error", error: { type: "authentication_error", code, retryable: false } });
  });

  test("an unknown model → 404 model_not_available in the messages envelope", async () => {
    const res = await post({ model: "no-such-model", max_tokens: 3, messages: [{ role: "user", content: "hi" }] });
    expect(res.status).toBe(404);
    expect(await res.json()).toMatchObject({ type: "error", error: { type: "not_found_error", code: "model_not_available", param: "model" } });
  });

  test("a schema violation → 400 invalid_request naming the field", async () => {
    const res = await post({ model: "test-model", max_tokens: 3, messages: [{ role: "system", content: "hi" }] });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ type: "error", error: { code: "invalid_request", param: "messages[0].role" } });
  });
});

describe("a provider failing after the first event", () => {
  let faultyGw: TestGateway;
  let faulty: ProviderProcess;

  beforeAll(async () => {
    faultyGw = await startTestGateway({ messagesFacade: true });
    faulty = spawnProvider(faultyGw, { id: "prov-faulty", fault: "error-after:3" });
    await waitForReadyProviders(faultyGw, 1);
  });

  afterAll(async () => {
    await faulty.kill();
    await faultyGw.close();
  });

  test("ends the stream with event: error (provider_disconnected) and no message_stop", async () => {
    const res = await fetch(`${faultyGw.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": faultyGw.apiKey },
      body: JSON.stringify({ model: "test-model", max_tokens: 50, stream: true, messages: [{ role: "user", content: prompt }] }),
    });
    expect(res.status).toBe(200);
    const events = parseSse(await res.text());
    expect(events[0]!.event).toBe("message_start");
    expect(events.filter((e) => e.event === "content_block_delta")).toHaveLength(3);
    expect(events.at(-1)!.event).toBe("error");
    expect(JSON.parse(events.at(-1)!.data)).toMatchObject({ type: "error", error: { code: "provider_disconnected", retryable: true } });
    expect(events.some((e) => e.event === "message_stop")).toBe(false);
  });

  test("the SDK's stream throws an APIError", async () => {
    const client = new Anthropic({ apiKey: faultyGw.apiKey, baseURL: faultyGw.url, maxRetries: 0 });
    const stream = client.messages.stream({ model: "test-model", max_tokens: 50, messages: [{ role: "user", content: prompt }] });
    const error = await stream.finalMessage().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Anthropic.APIError);
  });
});

describe("request ids and count_tokens", () => {
  test("a message carries `request-id` (what the Anthropic SDK reads) equal to x-request-id", async () => {
    const { data: message, response } = await client.messages
      .create({ model: "test-model", max_tokens: 5, messages: [{ role: "user", content: "hi" }] })
      .withResponse();
    expect(response.headers.get("request-id")).toMatch(/^req_/);
    expect(response.headers.get("request-id")).toBe(response.headers.get("x-request-id"));
    expect((message as unknown as { _request_id?: string })._request_id).toBe(response.headers.get("request-id")!);
  });

  test("an error carries it too: the SDK's error.requestID is set", async () => {
    const error = await client.messages.create({ model: "test-model", max_tokens: 5, messages: [] }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Anthropic.BadRequestError);
    expect((error as InstanceType<typeof Anthropic.BadRequestError>).requestID).toMatch(/^req_/);
    expect((error as Error).message).toContain("'messages' must be a non-empty array");
  });

  test("messages.countTokens() answers the gateway's prompt-token bound, which the real count never exceeds", async () => {
    const params = { model: "test-model", system: "Be brief.", messages: [{ role: "user" as const, content: prompt }] };
    const counted = await client.messages.countTokens(params);
    // 16 + (8 + bytes) per message, system included (docs/facades.md).
    expect(counted.input_tokens).toBe(16 + 8 + "Be brief.".length + 8 + prompt.length);
    const message = await client.messages.create({ ...params, max_tokens: 5 });
    expect(message.usage.input_tokens).toBeLessThanOrEqual(counted.input_tokens);
    const withTools = await client.messages.countTokens({ ...params, tools: [weatherTool] });
    expect(withTools.input_tokens).toBeGreaterThan(counted.input_tokens);
  });

  test("count_tokens errors use the messages envelope", async () => {
    const error = await client.messages.countTokens({ model: "test-model", messages: "nope" as never }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Anthropic.BadRequestError);
    expect((error as InstanceType<typeof Anthropic.BadRequestError>).error).toMatchObject({ type: "error", error: { type: "invalid_request_error" } });
    const unauthenticated = new Anthropic({ apiKey: "gw_wrong", baseURL: gw.url, maxRetries: 0 });
    expect(await unauthenticated.messages.countTokens({ model: "test-model", messages: [{ role: "user", content: "x" }] }).catch((e: unknown) => e)).toBeInstanceOf(
      Anthropic.AuthenticationError,
    );
  });
});
