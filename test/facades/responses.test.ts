// POST /v1/responses through a real gateway with the official openai SDK as the client and a real
// provider session (synthetic engine) that records the jobs it receives.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { syntheticText, SYNTHETIC_TOOL_MARKER } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";
import { parseSse, startRecordingProvider, type RecordingProvider } from "./support.ts";

let gw: TestGateway;
let provider: RecordingProvider;
let client: OpenAI;

beforeAll(async () => {
  gw = await startTestGateway({ responsesFacade: true });
  provider = await startRecordingProvider(gw, "prov-rec");
  await waitForReadyProviders(gw, 1);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await provider.stop();
  await gw.close();
});

const prompt = "Tell me about the sea.";
const expected = (text: string, maxTokens: number) => syntheticText([{ role: "user", content: text }], maxTokens).join("");
const tokens = (text: string, maxTokens: number) => syntheticText([{ role: "user", content: text }], maxTokens).length;
const weatherTool = {
  type: "function" as const,
  name: "get_weather",
  description: "Current weather of a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
  strict: true,
};

const post = (body: unknown) =>
  fetch(`${gw.baseURL}/responses`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` },
    body: JSON.stringify(body),
  });

describe("responses.create", () => {
  test("plain: a response object with resp_/msg_ ids, output_text and usage; instructions reach the provider", async () => {
    const { data: response, response: http } = await client.responses
      .create({ model: "test-model", instructions: "You are terse.", input: prompt, max_output_tokens: 20, store: false })
      .withResponse();
    expect(response.object).toBe("response");
    expect(response.id).toMatch(/^resp_[0-9a-f]{24}$/);
    expect(response.output).toHaveLength(1);
    expect(response.output[0]).toMatchObject({ type: "message", role: "assistant", id: expect.stringMatching(/^msg_/) });
    expect(response.output_text).toBe(expected(prompt, 20));
    expect(response.status).toBeOneOf(["completed", "incomplete"]);
    expect(response.usage!.output_tokens).toBe(tokens(prompt, 20));
    expect(response.usage!.total_tokens).toBe(response.usage!.input_tokens + response.usage!.output_tokens);
    expect((response as unknown as { store: unknown }).store).toBe(false);
    const job = provider.jobOf(http.headers.get("x-request-id")!)!;
    expect(job.messages).toEqual([
      { role: "system", content: "You are terse." },
      { role: "user", content: prompt },
    ]);
    expect(job.params.max_tokens).toBe(20);
  });

  test("max_output_tokens reached → status incomplete, reason max_output_tokens", async () => {
    const response = await client.responses.create({ model: "test-model", input: prompt, max_output_tokens: 3 });
    expect(response.status).toBe("incomplete");
    expect(response.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(response.output_text).toBe(expected(prompt, 3));
  });

  test("streaming: typed events with increasing sequence_number, deltas join to the text", async () => {
    const stream = await client.responses.create({ model: "test-model", input: prompt, max_output_tokens: 30, stream: true });
    const types: string[] = [];
    const sequence: number[] = [];
    let text = "";
    for await (const event of stream) {
      types.push(event.type);
      sequence.push(event.sequence_number);
      if (event.type === "response.output_text.delta") text += event.delta;
    }
    expect(text).toBe(expected(prompt, 30));
    expect(sequence).toEqual(sequence.map((_, i) => i));
    expect(types.slice(0, 4)).toEqual(["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
    expect(types.slice(-4)).toEqual(["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]);
  });

  test("responses.stream() + finalResponse() assembles the same response", async () => {
    const stream = client.responses.stream({ model: "test-model", input: prompt, max_output_tokens: 25 });
    const deltas: string[] = [];
    stream.on("response.output_text.delta", (event) => deltas.push(event.delta));
    const response = await stream.finalResponse();
    expect(response.output_text).toBe(expected(prompt, 25));
    expect(deltas.join("")).toBe(expected(prompt, 25));
    expect(response.status).toBe("completed");
    expect(response.usage!.output_tokens).toBe(tokens(prompt, 25));
  });

  test("every SSE event names its type in an event: line and in the data", async () => {
    const res = await post({ model: "test-model", input: prompt, max_output_tokens: 5, stream: true });
    expect(res.status).toBe(200);
    const events = parseSse(await res.text());
    expect(events.every((e) => e.event !== null && JSON.parse(e.data).type === e.event)).toBe(true);
    expect(events.at(-1)!.event).toBe("response.incomplete");
  });
});

describe("function calling", () => {
  const first = `What is the weather in Oslo? ${SYNTHETIC_TOOL_MARKER}`;

  test("a round trip: function_call → function_call_output → final text", async () => {
    const asked = await client.responses.create({ model: "test-model", input: first, tools: [weatherTool, { type: "web_search" }] });
    expect(asked.output).toHaveLength(1);
    const call = asked.output[0]!;
    if (call.type !== "function_call") throw new Error(`expected a function_call, got ${call.type}`);
    expect(call.id).toMatch(/^fc_/);
    expect(call.call_id).toMatch(/^call_/);
    expect(call.name).toBe("get_weather");
    expect(JSON.parse(call.arguments)).toEqual({ city: "synthetic" });
    // The hosted web_search tool was dropped before dispatch.
    expect(asked.tools).toHaveLength(1);

    const { data: answer, response: http } = await client.responses
      .create({
        model: "test-model",
        tools: [weatherTool],
        input: [
          { role: "user", content: first },
          // The output items are sent back as they came (replaying output as input is the stateless way).
          ...(asked.output as OpenAI.Responses.ResponseInputItem[]),
          { type: "function_call_output", call_id: call.call_id, output: "Sunny, 21 °C" },
        ],
      })
      .withResponse();
    expect(answer.status).toBe("completed");
    expect(answer.output_text).toBe(expected(first, 4096));
    const job = provider.jobOf(http.headers.get("x-request-id")!)!;
    expect(job.messages).toEqual([
      { role: "user", content: first },
      { role: "assistant", content: null, tool_calls: [{ id: call.call_id, type: "function", function: { name: "get_weather", arguments: call.arguments } }] },
      { role: "tool", content: "Sunny, 21 °C", tool_call_id: call.call_id },
    ]);
    expect(job.params.tools).toEqual([
      { type: "function", function: { name: "get_weather", parameters: weatherTool.parameters, description: weatherTool.description, strict: true } },
    ]);
  });

  test("streamed: function_call_arguments deltas, and finalResponse() holds the call", async () => {
    const stream = client.responses.stream({ model: "test-model", input: "Oslo?", tools: [weatherTool], tool_choice: "required" });
    const deltas: string[] = [];
    stream.on("response.function_call_arguments.delta", (event) => deltas.push(event.delta));
    const response = await stream.finalResponse();
    expect(response.output).toHaveLength(1);
    expect(response.output[0]).toMatchObject({ type: "function_call", name: "get_weather", arguments: '{"city":"synthetic"}' });
    expect(deltas.join("")).toBe('{"city":"synthetic"}');
  });
});

describe("structured output", () => {
  test("text.format json_schema reaches the provider as response_format, and the output follows it", async () => {
    const schema = {
      type: "object",
      properties: { city: { type: "string" }, temperature_c: { type: "number" } },
      required: ["city", "temperature_c"],
      additionalProperties: false,
    };
    const { data: response, response: http } = await client.responses
      .create({ model: "test-model", input: "Weather in Oslo as JSON.", text: { format: { type: "json_schema", name: "weather", schema, strict: true } } })
      .withResponse();
    const job = provider.jobOf(http.headers.get("x-request-id")!)!;
    expect(job.params.response_format).toEqual({ type: "json_schema", json_schema: { name: "weather", schema, strict: true } });
    expect(JSON.parse(response.output_text)).toEqual({ city: "synthetic", temperature_c: 1 });
    expect(response.text).toEqual({ format: { type: "json_schema", name: "weather", schema, strict: true } });
  });

  test("text.format json_object reaches the provider", async () => {
    const { response: http } = await client.responses.create({ model: "test-model", input: "JSON please", text: { format: { type: "json_object" } } }).withResponse();
    expect(provider.jobOf(http.headers.get("x-request-id")!)!.params.response_format).toEqual({ type: "json_object" });
  });
});

describe("unsupported parameters are refused before dispatch, naming the parameter", () => {
  test.each<[string, Record<string, unknown>, string]>([
    ["previous_response_id", { previous_response_id: "resp_0123" }, "previous_response_id"],
    ["store: true", { store: true }, "store"],
    ["conversation", { conversation: "conv_0123" }, "conversation"],
    ["background: true", { background: true }, "background"],
    ["truncation auto", { truncation: "auto" }, "truncation"],
    ["response_format", { response_format: { type: "json_object" } }, "response_format"],
    ["image input", { input: [{ role: "user", content: [{ type: "input_image", image_url: "https://example.invalid/cat.png", detail: "auto" }] }] }, "input[0].content[0]"],
    ["file input", { input: [{ role: "user", content: [{ type: "input_text", text: "read" }, { type: "input_file", file_id: "file_1" }] }] }, "input[0].content[1]"],
  ])("%s", async (_name, extra, param) => {
    const before = provider.jobs.length;
    const error = await client.responses.create({ model: "test-model", input: "hi", ...extra } as never).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.BadRequestError);
    const apiError = error as InstanceType<typeof OpenAI.BadRequestError>;
    expect(apiError.status).toBe(400);
    expect(apiError.code).toBe("unsupported_parameter");
    expect(apiError.param).toBe(param);
    expect(apiError.type).toBe("invalid_request_error");
    expect(provider.jobs.length).toBe(before);
  });

  test("the envelope is the chat-completions one", async () => {
    const res = await post({ model: "test-model", input: "hi", store: true });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      error: { message: expect.any(String), type: "invalid_request_error", param: "store", code: "unsupported_parameter", retryable: false },
    });
  });

  test("tolerated without effect: include, reasoning summary, parallel_tool_calls, store false, truncation disabled", async () => {
    const response = await client.responses.create({
      model: "test-model",
      input: prompt,
      max_output_tokens: 5,
      include: ["reasoning.encrypted_content"],
      reasoning: { summary: "auto" },
      parallel_tool_calls: false,
      store: false,
      truncation: "disabled",
    });
    expect(response.output_text).toBe(expected(prompt, 5));
  });
});

describe("a provider failing after the first event", () => {
  let faultyGw: TestGateway;
  let faulty: ProviderProcess;

  beforeAll(async () => {
    faultyGw = await startTestGateway({ responsesFacade: true });
    faulty = spawnProvider(faultyGw, { id: "prov-faulty", fault: "error-after:3" });
    await waitForReadyProviders(faultyGw, 1);
  });

  afterAll(async () => {
    await faulty.kill();
    await faultyGw.close();
  });

  test("ends the stream with response.failed carrying provider_disconnected", async () => {
    const res = await fetch(`${faultyGw.baseURL}/responses`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${faultyGw.apiKey}` },
      body: JSON.stringify({ model: "test-model", input: prompt, stream: true }),
    });
    expect(res.status).toBe(200);
    const events = parseSse(await res.text());
    expect(events.filter((e) => e.event === "response.output_text.delta")).toHaveLength(3);
    const last = JSON.parse(events.at(-1)!.data);
    expect(last).toMatchObject({ type: "response.failed", response: { status: "failed", error: { code: "provider_disconnected" } } });
    expect(events.some((e) => e.event === "response.completed")).toBe(false);
  });
});
