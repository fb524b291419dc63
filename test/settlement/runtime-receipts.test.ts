// The enforce happy path with the real reference runtime: two `gateway provider` child processes
// (synthetic engine) sign v0.4 receipts with the runtime's own signer, and the gateway settles every
// completed request `verified` and charges it once — the runtime and the gateway agree end to end.
// A buyer cancel mid-stream against the real runtime settles the delivered prefix.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";
import { utf8 } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, promptBound, settledRow, type Buyer } from "./support.ts";

const messages = [{ role: "user" as const, content: "Count to ten, slowly." }];

let gw: TestGateway;
let providers: ProviderProcess[] = [];
let buyer: Buyer;

beforeAll(async () => {
  // Four requests of one account run in parallel below: above the default 2 concurrent (docs/quotas.md).
  gw = await startTestGateway({ settlementMode: "enforce", paidConcurrentRequests: 4 }, { catalog: ["test-model", "burst-model"] });
  providers = [
    spawnProvider(gw, { id: "runtime-a", maxConcurrency: 2, tokensPerSecond: 400 }),
    spawnProvider(gw, { id: "runtime-b", maxConcurrency: 2, tokensPerSecond: 400 }),
    // Every token at once: the runtime merges them into one chunk frame (docs/decisions.md).
    spawnProvider(gw, { id: "runtime-burst", tokensPerSecond: 0, models: ["burst-model"] }),
  ];
  await waitForReadyProviders(gw, 3, 15_000);
  buyer = await paidBuyer(gw, 1_000_000);
}, 30_000);

afterAll(async () => {
  for (const p of providers) await p.kill();
  await gw.close();
});

test("completed requests (streaming and not, in parallel) settle verified and are charged once each", async () => {
  const before = await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);
  const results = await Promise.all(
    [true, false, true, false].map(async (stream) => {
      if (stream) {
        const s = await buyer.client.chat.completions.create({ model: "test-model", messages, max_tokens: 12, stream: true, stream_options: { include_usage: true } }).withResponse();
        let text = "";
        let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
        for await (const c of s.data) {
          text += c.choices[0]?.delta.content ?? "";
          if (c.usage) usage = c.usage;
        }
        return { requestId: s.response.headers.get("x-request-id")!, text, usage: usage! };
      }
      const r = await buyer.client.chat.completions.create({ model: "test-model", messages, max_tokens: 12 }).withResponse();
      return { requestId: r.response.headers.get("x-request-id")!, text: r.data.choices[0]?.message.content ?? "", usage: r.data.usage! };
    }),
  );
  let debits = 0;
  for (const r of results) {
    expect(r.text.length).toBeGreaterThan(0);
    const row = await settledRow(gw, r.requestId, 0, 10_000);
    expect({ label: row.label, reason: row.reason }).toEqual({ label: "verified", reason: null });
    expect(row.delivered?.end_byte).toBe(utf8(r.text));
    // Billed what the buyer was told it used, at 1 credit a token.
    expect(row.billed_completion_tokens).toBe(r.usage.completion_tokens);
    expect(row.billed_prompt_tokens).toBe(r.usage.prompt_tokens);
    expect(row.billed_prompt_tokens).toBeLessThanOrEqual(promptBound(messages));
    const charge = expectedCharge(row.billed_prompt_tokens, row.billed_completion_tokens, 1_000_000, 1_000_000);
    expect(row).toMatchObject({ debit_credits: charge.debit, provider_credits: charge.provider, platform_credits: charge.platform });
    expect(await gw.gateway.store.listSettlements({ request_id: r.requestId })).toHaveLength(1);
    debits += charge.debit;
  }
  expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(before - debits);
  await expectLedgerBalanced(gw);
}, 30_000);

test("tokens the runtime merged into one frame stream, settle verified and are charged per token", async () => {
  const s = await buyer.client.chat.completions
    .create({ model: "burst-model", messages, max_tokens: 12, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  const deltas: string[] = [];
  let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  for await (const c of s.data) {
    const d = c.choices[0]?.delta.content;
    if (d) deltas.push(d);
    if (c.usage) usage = c.usage;
  }
  expect(usage!.completion_tokens).toBe(12);
  expect(deltas).toHaveLength(1); // twelve tokens, one content delta
  const row = await settledRow(gw, s.response.headers.get("x-request-id")!, 0, 10_000);
  expect({ label: row.label, reason: row.reason }).toEqual({ label: "verified", reason: null });
  expect(row.delivered).toMatchObject({ end_byte: utf8(deltas.join("")), tokens: 12 });
  expect(row.billed_completion_tokens).toBe(12);
  await expectLedgerBalanced(gw);
}, 20_000);

test("a buyer cancel mid-stream against the real runtime settles the delivered prefix, verified", async () => {
  const controller = new AbortController();
  const s = await buyer.client.chat.completions.create({ model: "test-model", messages, max_tokens: 200, stream: true }, { signal: controller.signal }).withResponse();
  let text = "";
  let deltas = 0;
  for await (const c of s.data) {
    const d = c.choices[0]?.delta.content;
    if (!d) continue;
    text += d;
    if (++deltas === 5) controller.abort();
  }
  const requestId = s.response.headers.get("x-request-id")!;
  const row = await settledRow(gw, requestId, 0, 10_000);
  expect({ label: row.label, reason: row.reason }).toEqual({ label: "verified", reason: null });
  expect(row.delivered?.terminal_state).toBe("buyer_cancel");
  // Charged what reached the gateway's buyer-side relay: at least what the SDK read, far below the cap.
  expect(row.delivered!.end_byte).toBeGreaterThanOrEqual(utf8(text));
  expect(row.billed_completion_tokens).toBe(row.delivered!.tokens);
  expect(row.billed_completion_tokens).toBeLessThan(200);
}, 20_000);

test("the audit is clean and each runtime logged the `settled` frame of every attempt it served", async () => {
  for (const row of await gw.gateway.store.listSettlements()) {
    const runtime = providers.find((p) => p.id === row.provider_id)!;
    const settled = await runtime.waitForEvent("settled", (e) => e.request_id === row.request_id && e.attempt_n === row.attempt_n);
    expect(settled).toMatchObject({ label: row.label, reason: row.reason, provider_credits: row.provider_credits });
  }
  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);
});
