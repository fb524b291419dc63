// Tool names split over several deltas reach facade clients whole (the OpenAI streaming format: a
// call's name is the concatenation of its fragments). A real gateway, an in-process provider runtime
// with the `openai` engine, and a mock upstream replaying recorded llama.cpp and vLLM tool-call
// streams. Those servers send each name in one delta; the split-name streams are derived from the
// same recordings here (the name header cut into three events, every other byte as recorded), since
// no published capture of a split name exists (test/fixtures/upstreams/README.md).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { createOpenAIEngine } from "../../src/provider/openai/index.ts";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntime } from "../../src/provider/runtime.ts";
import { startMockUpstream, type MockUpstream, type Scenario } from "../support/mockUpstream.ts";
import { modelHash, startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let mock: MockUpstream;
let runtime: ProviderRuntime;
let anthropic: Anthropic;
let openai: OpenAI;

beforeAll(async () => {
  mock = startMockUpstream();
  gw = await startTestGateway({ messagesFacade: true, responsesFacade: true });
  const key = await loadOrCreateProviderKey(join(gw.dataDir, "provider-keys", "upstream.key"));
  runtime = startProviderRuntime({
    gatewayUrl: gw.wsUrl,
    providerId: "upstream-prov",
    key,
    engine: createOpenAIEngine({ upstream: mock.url, firstTokenTimeoutMs: 2000, idleTimeoutMs: 2000 }),
    models: [{ model_id: "test-model", model_hash: modelHash("test-model"), max_context_tokens: 8192 }],
    maxConcurrency: 2,
    backoff: { minMs: 50, maxMs: 200 },
  });
  await waitForReadyProviders(gw, 1);
  anthropic = new Anthropic({ apiKey: gw.apiKey, baseURL: gw.url, maxRetries: 0 });
  openai = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await runtime.stop();
  await gw.close();
  await mock.close();
});

/**
 * Cuts the first tool-call name of an SSE body into `parts` consecutive events: the first keeps the
 * delta's index, id and type, the last the arguments fragment that came with the name (if any).
 */
function splitFirstName(parts: number) {
  return (body: string): string => {
    let done = false;
    return body
      .split("\n\n")
      .map((event) => {
        if (done || !event.startsWith("data: {")) return event;
        const payload = JSON.parse(event.slice(6));
        const call = payload.choices?.[0]?.delta?.tool_calls?.[0];
        const name: string | undefined = call?.function?.name;
        if (name === undefined) return event;
        done = true;
        const size = Math.ceil(name.length / parts);
        const pieces = Array.from({ length: parts }, (_, i) => name.slice(i * size, (i + 1) * size));
        const { arguments: args, ...fn } = call.function;
        return pieces
          .map((piece, i) => {
            const fragment =
              i === 0 ? { ...call, function: { ...fn, name: piece } } : { index: call.index, function: { name: piece, ...(i === parts - 1 && args !== undefined ? { arguments: args } : {}) } };
            const copy = structuredClone(payload);
            copy.choices[0].delta = { tool_calls: [fragment] };
            return `data: ${JSON.stringify(copy)}`;
          })
          .join("\n\n");
      })
      .join("\n\n");
  };
}

interface Case {
  name: string;
  scenario: Scenario;
  tool: string;
  arguments: string;
  /** Deltas the name arrives in. */
  nameDeltas: number;
}
const llama = { file: "llamacpp-b6522-stream-toolcall-mixed-content.jsonl", tool: "get_current_weather", arguments: '{"location":"Washington DC"}', appendDone: true };
const vllm = { file: "vllm-2025-04-stream-toolcall.sse", tool: "run_command", arguments: '{"command": "ls"}', appendDone: false };
const cases: Case[] = [llama, vllm].flatMap((f) => [
  { name: `${f.file} (recorded)`, scenario: { kind: "fixture" as const, file: f.file, appendDone: f.appendDone }, tool: f.tool, arguments: f.arguments, nameDeltas: 1 },
  {
    name: `${f.file}, name cut into 3 deltas (derived)`,
    scenario: { kind: "fixture" as const, file: f.file, appendDone: f.appendDone, transform: splitFirstName(3) },
    tool: f.tool,
    arguments: f.arguments,
    nameDeltas: 3,
  },
]);

const tools = [{ name: "get_current_weather", input_schema: { type: "object" as const, properties: {} } }, { name: "run_command", input_schema: { type: "object" as const, properties: {} } }];
const fnTools = tools.map((t) => ({ type: "function" as const, name: t.name, parameters: t.input_schema, strict: false }));

describe.each(cases.map((c) => [c.name, c] as const))("%s", (_name, c) => {
  test("messages, streaming: the tool_use block starts with the whole name", async () => {
    mock.next(c.scenario);
    const stream = anthropic.messages.stream({ model: "test-model", max_tokens: 200, tools, messages: [{ role: "user", content: "go" }] });
    const starts: string[] = [];
    stream.on("streamEvent", (e) => {
      if (e.type === "content_block_start" && e.content_block.type === "tool_use") starts.push(e.content_block.name);
    });
    const message = await stream.finalMessage();
    expect(starts).toEqual([c.tool]);
    const use = message.content.find((b) => b.type === "tool_use");
    expect(use).toMatchObject({ name: c.tool, input: JSON.parse(c.arguments) });
    expect(message.stop_reason).toBe("tool_use");
  });

  test("messages, one body: the whole name", async () => {
    mock.next(c.scenario);
    const message = await anthropic.messages.create({ model: "test-model", max_tokens: 200, tools, messages: [{ role: "user", content: "go" }] });
    expect(message.content.find((b) => b.type === "tool_use")).toMatchObject({ name: c.tool, input: JSON.parse(c.arguments) });
  });

  test("responses, streaming: the function_call item is added with the whole name", async () => {
    mock.next(c.scenario);
    const stream = await openai.responses.create({ model: "test-model", input: "go", tools: fnTools, store: false, stream: true });
    const added: string[] = [];
    let final: OpenAI.Responses.Response | null = null;
    for await (const event of stream) {
      if (event.type === "response.output_item.added" && event.item.type === "function_call") added.push(event.item.name);
      if (event.type === "response.completed") final = event.response;
    }
    expect(added).toEqual([c.tool]);
    expect(final!.output.find((i) => i.type === "function_call")).toMatchObject({ name: c.tool, arguments: c.arguments });
  });

  test("responses, one body: the whole name", async () => {
    mock.next(c.scenario);
    const response = await openai.responses.create({ model: "test-model", input: "go", tools: fnTools, store: false });
    expect(response.output.find((i) => i.type === "function_call")).toMatchObject({ name: c.tool, arguments: c.arguments });
  });

  test("chat completions, streaming: the name's fragments relayed as sent, concatenated by the client", async () => {
    mock.next(c.scenario);
    const stream = await openai.chat.completions.create({
      model: "test-model",
      messages: [{ role: "user", content: "go" }],
      tools: fnTools.map((t) => ({ type: "function" as const, function: { name: t.name, parameters: t.parameters } })),
      stream: true,
    });
    let name = "";
    let args = "";
    let nameDeltas = 0;
    for await (const chunk of stream) {
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
        if (d.function?.name) nameDeltas++;
        name += d.function?.name ?? "";
        args += d.function?.arguments ?? "";
      }
    }
    expect({ name, args, nameDeltas }).toEqual({ name: c.tool, args: c.arguments, nameDeltas: c.nameDeltas });
  });
});
