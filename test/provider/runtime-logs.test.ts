// The provider runtime's logs (its stdout and stderr as a process) never hold prompts or outputs
// (docs/operator.md): a real gateway, a real `gateway provider` process, a real request.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;

beforeAll(async () => {
  gw = await startTestGateway();
  provider = spawnProvider(gw, { id: "prov-logs", tokensPerSecond: 0 });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.kill();
  await gw.close();
});

async function chat(body: Record<string, unknown>): Promise<Response> {
  return fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "test-model", max_tokens: 24, ...body }),
  });
}

test("a served request leaves ids and counts in the provider's log, never the prompt or the output", async () => {
  const canary = `canary-${crypto.randomUUID()}`;
  const messages = [
    { role: "system", content: `system words ${canary}-system` },
    { role: "user", content: `user words ${canary}-user` },
  ];
  const streamed = await (await chat({ messages, stream: true })).text();
  const plain = (await (await chat({ messages })).json()) as { id: string; choices: { message: { content: string } }[] };
  const output = plain.choices[0]!.message.content;
  expect(output).toBe(syntheticText(messages as never, 24).join(""));
  expect(streamed).toContain("[DONE]");

  // Both jobs' lines are in once both are settled (a job's last line).
  await waitFor(() => provider.events.filter((e) => e.event === "settled").length === 2, 5000, "both jobs settled");
  await provider.kill();
  const logged = JSON.stringify(provider.events) + (await new Response(provider.proc.stderr as ReadableStream).text());
  expect(provider.events.filter((e) => e.event === "job_received")).toHaveLength(2);
  expect(logged).not.toContain(canary);
  expect(logged).not.toContain("words");
  expect(logged).not.toContain(output);
  // Not even a longer piece of it, in case a line held a truncated copy.
  for (const token of syntheticText(messages as never, 24).filter((t) => t.trim().length >= 6)) expect(logged).not.toContain(token);
});
