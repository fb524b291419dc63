// Structured request logs: one `request_completed` JSON line per buyer request with ids, counts and
// timings — and never the prompt, the output or an API key, at any log level.
import { afterEach, expect, test } from "bun:test";
import OpenAI from "openai";
import { createLog } from "../../src/log.ts";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess } from "../support/harness.ts";

const PROMPT = "SECRET-PROMPT-7f3a: my bank password is hunter2";
const messages = [{ role: "user" as const, content: PROMPT }];

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

/** A real gateway whose log lines (debug and up) are captured, plus one real provider process. */
async function loggedGateway() {
  const lines: string[] = [];
  const gw = await startTestGateway({ logLevel: "debug" }, { log: createLog("debug", (l) => lines.push(l)) });
  cleanup.push(() => gw.close());
  const provider: ProviderProcess = spawnProvider(gw, { id: "log-prov", ttftMs: 10 });
  cleanup.push(() => provider.kill());
  await waitForReadyProviders(gw, 1);
  return { gw, lines, provider, client: new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 }) };
}

const completedLines = (lines: string[]) =>
  lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.event === "request_completed");

test("one request_completed line per request, with ids, counts and timings", async () => {
  const { gw, lines, client } = await loggedGateway();
  const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 6, stream: true });
  let streamId = "";
  for await (const chunk of stream) streamId = chunk.id;
  const whole = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 4 });
  await client.chat.completions.create({ model: "no-such-model", messages }).catch(() => null);

  const completed = completedLines(lines);
  expect(completed).toHaveLength(3);
  const [first, second, third] = completed as [Record<string, unknown>, Record<string, unknown>, Record<string, unknown>];
  expect(`chatcmpl-${first.request_id}`).toBe(streamId);
  expect(first).toMatchObject({ level: "info", model: "test-model", stream: true, outcome: "succeeded", status: 200, attempts: 1, output_tokens: 6, error_code: null });
  expect(`chatcmpl-${second.request_id}`).toBe(whole.id);
  expect(second).toMatchObject({ stream: false, outcome: "succeeded", status: 200, output_tokens: 4, input_tokens: whole.usage!.prompt_tokens });
  expect(third).toMatchObject({ model: "no-such-model", outcome: "failed", status: 404, error_code: "model_not_available", attempts: 0, ttft_ms: null });
  for (const line of completed) {
    // The account is named by id, never by key.
    if (line.outcome !== "rejected") expect(line.account_id).toBe(gw.accountId);
    for (const field of ["total_ms", "overhead_ms"]) expect(typeof line[field]).toBe("number");
    expect(line.overhead_ms as number).toBeLessThanOrEqual(line.total_ms as number);
  }
  // The provider's 10 ms to first token is in ttft, not in the gateway's overhead.
  expect(first.ttft_ms as number).toBeGreaterThanOrEqual(10);
  expect(first.ttft_ms as number).toBeLessThanOrEqual(first.total_ms as number);
});

test("no log line — gateway or provider, any level — carries the prompt, the output or the API key", async () => {
  const { gw, lines, provider, client } = await loggedGateway();
  const stream = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 12, stream: true });
  let output = "";
  for await (const chunk of stream) output += chunk.choices[0]?.delta.content ?? "";
  const whole = await client.chat.completions.create({ model: "test-model", messages, max_tokens: 12 });
  expect(output).toBe(syntheticText(messages, 12).join(""));
  expect(whole.choices[0]!.message.content).toBe(output);
  // A rejected request with a wrong key: that key must not be logged either.
  const wrongKey = "gw_wrongwrongwrongwrongwrongwrongwrongwrongwro";
  await new OpenAI({ apiKey: wrongKey, baseURL: gw.baseURL, maxRetries: 0 }).chat.completions.create({ model: "test-model", messages }).catch(() => null);
  await provider.waitForEvent("job_received");

  const providerLog = provider.events.map((e) => JSON.stringify(e)).join("\n");
  const everything = lines.join("\n") + "\n" + providerLog;
  expect(lines.some((l) => l.includes('"event":"request_completed"'))).toBe(true);
  expect(lines.some((l) => l.includes('"level":"debug"'))).toBe(true);
  for (const secret of [PROMPT, "SECRET-PROMPT", "hunter2", gw.apiKey, gw.apiKey.slice(3), wrongKey, output.trim()]) {
    expect(everything).not.toContain(secret);
  }
  // No distinctive word of the output either.
  for (const word of output.split(/\W+/).filter((w) => w.length >= 6)) expect(everything).not.toContain(word);
});
