// The output-token bound (docs/receipts.md): a token decodes to at least one byte, so the
// tokens an attempt claims are bounded by its delivered content bytes + tool-call bytes + 4. A chunk
// whose running count passes that bound ends the attempt as a provider failure — failover before the
// first byte, the in-band error after it — and is never relayed or billed. A scripted provider claims
// `tokens = 40` for a single "x"; an honest provider serves the failover.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, utf8, type Script } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, settledRow, type Buyer } from "./support.ts";

const MODEL = "bound-model";
const messages = [{ role: "user" as const, content: "Say x." }];
const INPUT_TOKENS = 4;
const HONEST = "Honest answer.";

let gw: TestGateway;
// "a-…" sorts first: routing tries it first.
let inflating: ScriptedProvider;
let honest: ScriptedProvider;
let buyer: Buyer;
let script: Script;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: [MODEL] });
  inflating = await ScriptedProvider.connect({ url: gw.wsUrl, id: "a-inflating", models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => script(a) });
  honest = await ScriptedProvider.connect({
    url: gw.wsUrl,
    id: "b-honest",
    models: [MODEL],
    inputTokens: INPUT_TOKENS,
    script: (a) => {
      a.accept();
      a.chunk(HONEST, 3);
      a.end();
    },
  });
  await waitForReadyProviders(gw, 2);
  buyer = await paidBuyer(gw, 1_000_000);
});

// Each test scripts the first provider anew: what routing learned from the last one's failure (a
// cooldown, docs/routing.md) would send the next request to the honest provider first.
beforeEach(() => gw.gateway.routing.reset());

afterAll(async () => {
  await inflating.close();
  await honest.close();
  await gw.close();
});

const buyerBalance = () => gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);

describe("the first chunk passes the bound: failover, nothing relayed or billed", () => {
  test.each([
    ["non-streaming", false],
    ["streaming", true],
  ])("%s: one 'x' claiming 40 tokens", async (_name, stream) => {
    script = (a) => {
      a.accept();
      a.chunk("x", 40);
      a.end();
    };
    const before = await buyerBalance();
    let text = "";
    let completionTokens = -1;
    if (stream) {
      const s = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64, stream: true, stream_options: { include_usage: true } });
      for await (const c of s) {
        text += c.choices[0]?.delta.content ?? "";
        if (c.usage) completionTokens = c.usage.completion_tokens;
      }
    } else {
      const r = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64 });
      text = r.choices[0]!.message.content!;
      completionTokens = r.usage!.completion_tokens;
    }
    expect({ text, completionTokens }).toEqual({ text: HONEST, completionTokens: 3 });
    const requestId = inflating.lastJob().request_id;
    expect((await inflating.attempt(requestId).cancelled()).reason).toBe("gateway_timeout");
    expect(await settledRow(gw, requestId, 0)).toMatchObject({ provider_id: "a-inflating", label: "zero_settled", debit_credits: 0 });
    const served = await settledRow(gw, requestId, 1);
    const charge = expectedCharge(INPUT_TOKENS, 3, 1_000_000, 1_000_000);
    expect(served).toMatchObject({ provider_id: "b-honest", label: "verified", debit_credits: charge.debit });
    expect(await buyerBalance()).toBe(before - charge.debit);
  });

  test("at the bound exactly (1 byte + 4) the chunk is relayed and billed", async () => {
    script = (a) => {
      a.accept();
      a.chunk("x", 5);
      a.end();
    };
    const r = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64 });
    expect({ text: r.choices[0]!.message.content, tokens: r.usage!.completion_tokens }).toEqual({ text: "x", tokens: 5 });
    expect(await settledRow(gw, inflating.lastJob().request_id)).toMatchObject({ label: "verified", billed_completion_tokens: 5 });
  });

  test("tool-call bytes count: a call's name and arguments bound its tokens too", async () => {
    const args = '{"city":"Zürich"}';
    script = (a) => {
      a.accept();
      a.chunk(undefined, utf8("get_weather") + utf8(args) + 4, [{ index: 0, id: "call_1", name: "get_weather", arguments: args }]);
      a.end({ finish_reason: "tool_calls" });
    };
    const r = await buyer.client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 64,
      tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object" } } }],
    });
    expect(r.choices[0]!.message.tool_calls?.[0]).toMatchObject({ function: { name: "get_weather", arguments: args } });
    expect(await settledRow(gw, inflating.lastJob().request_id)).toMatchObject({ label: "verified" });
  });
});

describe("a later chunk passes the bound", () => {
  test("streaming: the in-band error after the delivered prefix; only the prefix is billed", async () => {
    script = async (a) => {
      a.accept();
      a.chunk("Hello", 2);
      a.chunk("x", 40);
      const cancel = await a.cancelled();
      a.end({ terminal_state: cancel.reason, receipt: { terminal_state: cancel.reason, finish_reason: null, boundBytes: cancel.delivered_output_bytes } });
    };
    const before = await buyerBalance();
    let text = "";
    let error: unknown = null;
    try {
      const s = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64, stream: true });
      for await (const c of s) text += c.choices[0]?.delta.content ?? "";
    } catch (e) {
      error = e;
    }
    expect(text).toBe("Hello");
    expect(error).toMatchObject({ code: "provider_disconnected" });
    const requestId = inflating.lastJob().request_id;
    expect(await inflating.attempt(requestId).cancelled()).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 5 });
    const charge = expectedCharge(INPUT_TOKENS, 2, 1_000_000, 1_000_000);
    expect(await settledRow(gw, requestId)).toMatchObject({ label: "verified", billed_completion_tokens: 2, debit_credits: charge.debit });
    expect(await buyerBalance()).toBe(before - charge.debit);
  });

  test("non-streaming: nothing was written yet, so the request fails over", async () => {
    script = (a) => {
      a.accept();
      a.chunk("Hello", 2);
      a.chunk("x", 40);
      a.end();
    };
    const r = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64 });
    expect({ text: r.choices[0]!.message.content, tokens: r.usage!.completion_tokens }).toEqual({ text: HONEST, tokens: 3 });
    const requestId = inflating.lastJob().request_id;
    expect(await settledRow(gw, requestId, 0)).toMatchObject({ label: "zero_settled", debit_credits: 0 });
    expect(await settledRow(gw, requestId, 1)).toMatchObject({ provider_id: "b-honest", label: "verified" });
  });
});

test("the ledger balances and the audit is clean", () => {
  expectLedgerBalanced(gw);
  expect(ledgerAudit(gw.dataDir).report.findings).toEqual([]);
  expect(inflating.errors).toEqual([]);
});
