// Partial charges, end to end (enforce mode, openai SDK): buyer cancel, gateway timeout, provider
// error, upstream disconnect and a lost socket each charge only the receipt-bound delivered prefix —
// never what the provider produced but the buyer did not get (docs/receipts.md, issue 4 §7).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { APIUserAbortError } from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, utf8, type Script } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, settledRow, type Buyer } from "./support.ts";

const MODEL = "partial-model";
const messages = [{ role: "user" as const, content: "Tell a long story." }];
const INPUT_TOKENS = 6;
const STALL_MS = 800;
const PROVIDER_SEED = new Uint8Array(32).fill(0x70);
// Delivered before the interruption, and produced after it (never delivered).
const DELIVERED: [string, number][] = [
  ["Once upon ", 3],
  ["a time… ", 2],
];
const UNDELIVERED: [string, number][] = [["there was ", 3]];
const DELIVERED_TEXT = DELIVERED.map(([c]) => c).join("");
const DELIVERED_TOKENS = DELIVERED.reduce((n, [, t]) => n + t, 0);

let gw: TestGateway;
let provider: ScriptedProvider;
let buyer: Buyer;
let script: Script;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", streamIdleTimeoutMs: STALL_MS }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "partial-prov", seed: PROVIDER_SEED, models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => script(a) });
  await waitForReadyProviders(gw, 1);
  buyer = await paidBuyer(gw, 1_000_000);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

/** Streams until `stopAfter` content deltas (then aborts), or to the end; returns the text seen. */
async function stream(stopAfter?: number): Promise<{ text: string; error: unknown }> {
  const controller = new AbortController();
  let text = "";
  let deltas = 0;
  try {
    const s = await buyer.client.chat.completions.create({ model: MODEL, messages, stream: true, max_tokens: 64 }, { signal: controller.signal });
    for await (const c of s) {
      const d = c.choices[0]?.delta.content;
      if (!d) continue;
      text += d;
      if (++deltas === stopAfter) controller.abort();
    }
    return { text, error: null };
  } catch (error) {
    return { text, error };
  }
}

/** The attempt's settlement charged exactly the delivered prefix. */
async function expectChargedPrefix(requestId: string, buyerBefore: number): Promise<void> {
  const row = await settledRow(gw, requestId);
  const charge = expectedCharge(INPUT_TOKENS, DELIVERED_TOKENS, 1_000_000, 1_000_000);
  expect(row).toMatchObject({
    label: "verified",
    billed_prompt_tokens: INPUT_TOKENS,
    billed_completion_tokens: DELIVERED_TOKENS,
    debit_credits: charge.debit,
    provider_credits: charge.provider,
  });
  expect(row.delivered).toMatchObject({ start_byte: 0, end_byte: utf8(DELIVERED_TEXT), tokens: DELIVERED_TOKENS });
  expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(buyerBefore - charge.debit);
  expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "finalised", used_credits: charge.debit });
  await expectLedgerBalanced(gw);
}

const buyerBalance = async () => await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);

describe("buyer cancel mid-stream", () => {
  test("charged exactly the delivered prefix: the receipt binds `cancel.delivered_output_bytes`", async () => {
    script = async (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      const cancel = await a.cancelled();
      // A chunk produced while the cancel was on its way: not relayed, not charged.
      for (const [c, t] of UNDELIVERED) a.chunk(c, t);
      a.end({ terminal_state: "buyer_cancel", receipt: { terminal_state: "buyer_cancel", finish_reason: null, boundBytes: cancel.delivered_output_bytes } });
    };
    const before = await buyerBalance();
    // The SDK ends an aborted stream's iteration quietly.
    const { text, error } = await stream(DELIVERED.length);
    expect(error).toBeNull();
    expect(text).toBe(DELIVERED_TEXT);
    const requestId = provider.lastJob().request_id;
    const cancel = await provider.attempt(requestId).cancelled();
    expect(cancel).toMatchObject({ reason: "buyer_cancel", delivered_output_bytes: utf8(DELIVERED_TEXT) });
    await expectChargedPrefix(requestId, before);
    expect((await settledRow(gw, requestId)).delivered?.terminal_state).toBe("buyer_cancel");
  });

  test("a receipt that also binds the undelivered chunk → quarantined, nothing charged", async () => {
    script = async (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      await a.cancelled();
      for (const [c, t] of UNDELIVERED) a.chunk(c, t);
      // Binds all three chunks, not the cancel's byte count.
      a.end({ terminal_state: "buyer_cancel", receipt: { terminal_state: "buyer_cancel", finish_reason: null } });
    };
    const before = await buyerBalance();
    const { text } = await stream(DELIVERED.length);
    expect(text).toBe(DELIVERED_TEXT);
    const requestId = provider.lastJob().request_id;
    expect(await settledRow(gw, requestId)).toMatchObject({ label: "quarantined", reason: "byte_range", debit_credits: 0 });
    expect(await buyerBalance()).toBe(before);
    expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "released" });
  });

  test("non-streaming request abandoned before its body was written: nothing delivered → zero_settled", async () => {
    script = async (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      const cancel = await a.cancelled();
      a.end({ terminal_state: "buyer_cancel", receipt: { terminal_state: "buyer_cancel", finish_reason: null, boundBytes: cancel.delivered_output_bytes } });
    };
    const before = await buyerBalance();
    const controller = new AbortController();
    const jobsBefore = provider.jobs.length;
    const pending = buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 64 }, { signal: controller.signal }).catch((e) => e);
    const job = await provider.waitForJobs(jobsBefore + 1);
    // Abort once the gateway holds both chunks in the unwritten body.
    await waitFor(() => {
      const att = gw.gateway.registry.attempts.get(`${job.request_id}#0`);
      return (att?.meter.deliveredTokens ?? 0) === DELIVERED_TOKENS;
    });
    controller.abort();
    expect(await pending).toBeInstanceOf(APIUserAbortError);
    // The cancel says what the buyer got: nothing.
    expect(await provider.attempt(job.request_id).cancelled()).toMatchObject({ reason: "buyer_cancel", delivered_output_bytes: 0 });
    expect(await settledRow(gw, job.request_id)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered", debit_credits: 0 });
    expect(await buyerBalance()).toBe(before);
    // The reservation resolves when the request has ended too: on an async store that write may land
    // just after the settlement's (measured ~0.1 s on PostgreSQL).
    await waitFor(async () => (await gw.gateway.store.getReservation(job.request_id))?.state !== "held", 2000, "the reservation resolved");
    expect(await gw.gateway.store.getReservation(job.request_id)).toMatchObject({ state: "released", used_credits: 0 });
  });
});

describe("failures after the first byte charge the delivered prefix", () => {
  test.each(["provider_error", "upstream_transport_disconnect"] as const)("`end` %s mid-stream", async (terminal) => {
    script = (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      a.end({ terminal_state: terminal, receipt: { terminal_state: terminal, finish_reason: null } });
    };
    const before = await buyerBalance();
    const { text, error } = await stream();
    expect(text).toBe(DELIVERED_TEXT);
    // The in-band error frame after the first byte.
    expect(String((error as Error)?.message ?? error)).toContain("provider");
    const requestId = provider.lastJob().request_id;
    await expectChargedPrefix(requestId, before);
  });

  test("gateway timeout (stream stalls): cancel gateway_timeout, charged the delivered prefix", async () => {
    script = async (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      const cancel = await a.cancelled(STALL_MS + 5000);
      a.end({ terminal_state: "gateway_timeout", receipt: { terminal_state: "gateway_timeout", finish_reason: null, boundBytes: cancel.delivered_output_bytes } });
    };
    const before = await buyerBalance();
    const { text } = await stream();
    expect(text).toBe(DELIVERED_TEXT);
    const requestId = provider.lastJob().request_id;
    expect(await provider.attempt(requestId).cancelled()).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: utf8(DELIVERED_TEXT) });
    await expectChargedPrefix(requestId, before);
  });

  test("socket lost mid-stream: the receipt re-sent from a new session (`receipt` frame) settles the prefix", async () => {
    const seed = new Uint8Array(32).fill(0x71);
    const lost = await ScriptedProvider.connect({ url: gw.wsUrl, id: "lost-prov", seed, models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => {
      a.accept();
      for (const [c, t] of DELIVERED) a.chunk(c, t);
      // Then the link drops (no `end`).
    } });
    // Only the provider that will lose its link serves this request.
    await provider.close();
    await waitFor(() => !gw.gateway.registry.admittedByProvider.has("partial-prov"));
    const before = await buyerBalance();
    const streaming = stream();
    const job = await lost.waitForJobs(1);
    await waitFor(() => (gw.gateway.registry.attempts.get(`${job.request_id}#0`)?.meter.deliveredTokens ?? 0) === DELIVERED_TOKENS);
    const receipt = lost.attempt(job.request_id).receipt({ terminal_state: "provider_error", finish_reason: null });
    await lost.close();
    const { text } = await streaming;
    expect(text).toBe(DELIVERED_TEXT);
    expect((await gw.gateway.store.getSettlement(job.request_id, 0))?.label).toBe("pending");

    const back = await ScriptedProvider.connect({ url: gw.wsUrl, id: "lost-prov", seed, models: [MODEL], inputTokens: INPUT_TOKENS });
    back.send({ type: "receipt", request_id: job.request_id, attempt_n: 0, receipt });
    await expectChargedPrefix(job.request_id, before);
    expect(await back.waitForSettled(job.request_id)).toMatchObject({ label: "verified" });
    await back.close();
    provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "partial-prov", seed: PROVIDER_SEED, models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => script(a) });
  });
});

describe("the max_tokens cap", () => {
  test.each([true, false])("stream: %p — the chunk past max_tokens is neither relayed nor charged", async (streaming) => {
    const maxTokens = DELIVERED_TOKENS;
    script = async (a) => {
      a.accept();
      for (const [c, t] of [...DELIVERED, ...UNDELIVERED]) a.chunk(c, t);
      const cancel = await a.cancelled();
      a.end({ terminal_state: "gateway_timeout", receipt: { terminal_state: "gateway_timeout", finish_reason: null, boundBytes: cancel.delivered_output_bytes } });
    };
    const before = await buyerBalance();
    let text = "";
    let finish: string | null | undefined;
    if (streaming) {
      const s = await buyer.client.chat.completions.create({ model: MODEL, messages, stream: true, max_tokens: maxTokens });
      for await (const c of s) {
        text += c.choices[0]?.delta.content ?? "";
        finish = c.choices[0]?.finish_reason ?? finish;
      }
    } else {
      const completion = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: maxTokens });
      text = completion.choices[0]?.message.content ?? "";
      finish = completion.choices[0]?.finish_reason;
    }
    expect(text).toBe(DELIVERED_TEXT);
    expect(finish).toBe("length");
    const requestId = provider.lastJob().request_id;
    expect(await provider.attempt(requestId).cancelled()).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: utf8(DELIVERED_TEXT) });
    await expectChargedPrefix(requestId, before);
  });
});

test("the ledger balances and the audit is clean", async () => {
  await expectLedgerBalanced(gw);
  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);
  expect(provider.errors).toEqual([]);
});
