// A tool-heavy conversation, end to end (enforce mode, openai SDK): the gateway's prompt-token bound
// counts each assistant tool call's name and arguments (+ 8), so a provider that reports the honest
// prompt count of such a conversation is paid, and one that reports more is still quarantined
// (`input_tokens_inflated`). The bound is computed here by the independent rule (docs/receipts.md).
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { promptBoundOf } from "../receipts/independent-signer.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, paidBuyer, settledRow, type Buyer } from "./support.ts";

const MODEL = "tools-model";
const tools: ChatCompletionTool[] = [
  { type: "function", function: { name: "search_documents", parameters: { type: "object", properties: { query: { type: "string" } } } } },
];
// Long tool-call arguments and short texts: the calls carry most of the prompt.
const args = JSON.stringify({ query: "Zürich city council minutes on bicycle lanes, 2019–2024, all sessions" });
const messages: ChatCompletionMessageParam[] = [
  { role: "user", content: "Find the minutes." },
  {
    role: "assistant",
    content: null,
    tool_calls: [
      { id: "call_a", type: "function", function: { name: "search_documents", arguments: args } },
      { id: "call_b", type: "function", function: { name: "search_documents", arguments: args } },
    ],
  },
  { role: "tool", tool_call_id: "call_a", content: "3 hits" },
  { role: "tool", tool_call_id: "call_b", content: "0 hits" },
];
const BOUND = promptBoundOf(messages as never, tools);
const withoutCalls = promptBoundOf(messages.map((m) => ({ role: m.role, content: (m.content as string | null) ?? null })), tools);

let gw: TestGateway;
let provider: ScriptedProvider;
let buyer: Buyer;
let inputTokens = 0;

const script: Script = (a) => {
  a.accept();
  a.chunk("Found ", 1);
  a.chunk("them.", 2);
  a.end({ inputTokens });
};

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "tools-prov", models: [MODEL], script });
  await waitForReadyProviders(gw, 1);
  buyer = await paidBuyer(gw, 1_000_000);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

async function run(reported: number) {
  inputTokens = reported;
  const before = provider.jobs.length;
  const completion = await buyer.client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 16 });
  expect(completion.choices[0]?.message.content).toBe("Found them.");
  await provider.waitForJobs(before + 1);
  return settledRow(gw, provider.jobs[before]!.request_id);
}

test("the conversation's tool calls are most of its prompt", () => {
  expect(BOUND - withoutCalls).toBeGreaterThan(100);
});

test("an honest prompt count at the bound, carried mostly by assistant tool calls, settles verified", async () => {
  // A prompt count the old bound (no tool calls) refused, but the real prompt could have.
  const reported = withoutCalls + 50;
  expect(reported).toBeLessThanOrEqual(BOUND);
  const row = await run(reported);
  expect({ label: row.label, reason: row.reason }).toEqual({ label: "verified", reason: null });
  expect(row.billed_prompt_tokens).toBe(reported);
  expect(row.debit_credits).toBe(expectedCharge(reported, 3, 1_000_000, 1_000_000).debit);
  const atBound = await run(BOUND);
  expect({ label: atBound.label, reason: atBound.reason }).toEqual({ label: "verified", reason: null });
  await expectLedgerBalanced(gw);
});

test("one token above the bound is still quarantined input_tokens_inflated", async () => {
  const row = await run(BOUND + 1);
  expect({ label: row.label, reason: row.reason }).toEqual({ label: "quarantined", reason: "input_tokens_inflated" });
  expect(row.debit_credits).toBe(0);
});
