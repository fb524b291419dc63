// Failover and settlement, end to end (enforce mode, openai SDK): an attempt that delivered nothing is
// `zero_settled` and never charged, whatever its receipt claims; the attempt that served is charged
// once. An `accepted.model_hash` other than the catalog's ends the attempt before any byte, fails over,
// is quarantined, and that provider is not routed for the model again on that session until a later
// heartbeat advertises it (docs/protocol.md).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, receiptsList, settledRow, type Buyer } from "./support.ts";

const messages = [{ role: "user" as const, content: "Who answers?" }];
const HONEST_TEXT = "B answers.";
const INPUT_TOKENS = 5;

let gw: TestGateway;
// Same tier, same load: routing breaks the tie by provider id, so "a-…" is always tried first.
let first: ScriptedProvider;
let second: ScriptedProvider;
let buyer: Buyer;
const firstScripts = new Map<string, Script>();

const honest: Script = (a) => {
  a.accept();
  a.chunk("B ", 1);
  a.chunk("answers.", 2);
  a.end();
};

beforeAll(async () => {
  const models = ["m-measure", "m-decline", "m-error-end", "m-discard"];
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: models });
  first = await ScriptedProvider.connect({
    url: gw.wsUrl,
    id: "a-first",
    models,
    inputTokens: INPUT_TOKENS,
    script: (a) => firstScripts.get(a.job.model_id)!(a),
  });
  second = await ScriptedProvider.connect({ url: gw.wsUrl, id: "b-second", models, inputTokens: INPUT_TOKENS, script: honest });
  await waitForReadyProviders(gw, 2);
  buyer = await paidBuyer(gw, 1_000_000);
});

afterAll(async () => {
  await first.close();
  await second.close();
  await gw.close();
});

/** After a failover from `first` to `second`: attempt 1 verified and the only charge. */
async function expectServedOnceBySecond(requestId: string): Promise<void> {
  const served = await settledRow(gw, requestId, 1);
  const charge = expectedCharge(INPUT_TOKENS, 3, 1_000_000, 1_000_000);
  expect(served).toMatchObject({ provider_id: "b-second", label: "verified", debit_credits: charge.debit, provider_credits: charge.provider });
  const all = await gw.gateway.store.listSettlements({ request_id: requestId });
  expect(all.map((s) => s.attempt_n)).toEqual([0, 1]);
  expect(all.reduce((n, s) => n + s.debit_credits, 0)).toBe(charge.debit);
  expect(await gw.gateway.store.getReservation(requestId)).toMatchObject({ state: "finalised", used_credits: charge.debit });
  await expectLedgerBalanced(gw);
}

describe("an attempt that delivered nothing is zero_settled; the serving attempt is charged once", () => {
  test("declined → zero_settled (nothing_delivered); the next provider serves", async () => {
    firstScripts.set("m-decline", (a) => a.decline("queue_full"));
    const before = await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);
    const stream = await buyer.client.chat.completions.create({ model: "m-decline", messages, stream: true, max_tokens: 16 });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    expect(text).toBe(HONEST_TEXT);
    const requestId = first.lastJob().request_id;
    expect(second.lastJob()).toMatchObject({ request_id: requestId, attempt_n: 1 });

    expect(await settledRow(gw, requestId, 0)).toMatchObject({ provider_id: "a-first", label: "zero_settled", reason: "nothing_delivered", debit_credits: 0 });
    expect(await first.waitForSettled(requestId, 0)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered", provider_credits: 0 });
    await expectServedOnceBySecond(requestId);
    expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(before - expectedCharge(INPUT_TOKENS, 3, 1e6, 1e6).debit);
  });

  test("accepted, then `end` provider_error before any chunk, with a receipt claiming work → zero_settled", async () => {
    firstScripts.set("m-error-end", (a) => {
      a.accept();
      // A receipt for tokens the buyer never saw: the gateway delivered nothing, so nothing is billed.
      a.end({ terminal_state: "provider_error", receipt: { terminal_state: "provider_error", finish_reason: null, values: { billable_output_tokens: 0 } } });
    });
    const completion = await buyer.client.chat.completions.create({ model: "m-error-end", messages, max_tokens: 16 });
    expect(completion.choices[0]?.message.content).toBe(HONEST_TEXT);
    const requestId = first.lastJob().request_id;
    expect(await settledRow(gw, requestId, 0)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered", debit_credits: 0 });
    await expectServedOnceBySecond(requestId);
  });

  test("non-streaming: output buffered from the first provider, then its failure → discarded, zero_settled; the receipt for it is not billed", async () => {
    firstScripts.set("m-discard", (a) => {
      a.accept();
      a.chunk("A's partial ", 3);
      a.chunk("answer", 2);
      // Its receipt binds the two chunks the gateway buffered and then dropped for failover.
      a.end({ terminal_state: "provider_error", receipt: { terminal_state: "provider_error", finish_reason: null } });
    });
    const completion = await buyer.client.chat.completions.create({ model: "m-discard", messages, max_tokens: 16 });
    expect(completion.choices[0]?.message.content).toBe(HONEST_TEXT);
    const requestId = first.lastJob().request_id;
    expect(await settledRow(gw, requestId, 0)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered", debit_credits: 0, provider_credits: 0 });
    await expectServedOnceBySecond(requestId);
  });
});

describe("accepted.model_hash ≠ the catalog hash", () => {
  test("fails over before any byte, is quarantined, and that session is not routed for the model again", async () => {
    firstScripts.set("m-measure", (a) => {
      a.accept("f".repeat(64));
      // Output after a refused measurement must never reach the buyer.
      a.chunk("LIES", 4);
      a.end({ receipt: null });
    });
    const before = await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);
    const stream = await buyer.client.chat.completions.create({ model: "m-measure", messages, stream: true, max_tokens: 16 });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    expect(text).toBe(HONEST_TEXT);
    const requestId = first.lastJob().request_id;

    const refused = await settledRow(gw, requestId, 0);
    expect(refused).toMatchObject({ provider_id: "a-first", label: "quarantined", reason: "model_hash_not_in_catalog", accepted_model_hash: "f".repeat(64), debit_credits: 0, provider_credits: 0 });
    expect(await first.waitForSettled(requestId, 0)).toMatchObject({ label: "quarantined", reason: "model_hash_not_in_catalog", provider_credits: 0 });
    // The gateway ended the attempt with a cancel.
    expect((await first.attempt(requestId).cancelled()).reason).toBe("gateway_timeout");
    await expectServedOnceBySecond(requestId);
    expect(await gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`)).toBe(before - expectedCharge(INPUT_TOKENS, 3, 1e6, 1e6).debit);
    expect(receiptsList(gw.dataDir, requestId).map((l) => [l.provider_id, l.label, l.reason])).toEqual([
      ["a-first", "quarantined", "model_hash_not_in_catalog"],
      ["b-second", "verified", null],
    ]);

    // The next request for that model goes straight to the other provider, though "a-first" is still
    // ready and would win the tie; other models still route to it.
    const jobsBefore = first.jobs.length;
    const again = await buyer.client.chat.completions.create({ model: "m-measure", messages, max_tokens: 16 });
    expect(again.choices[0]?.message.content).toBe(HONEST_TEXT);
    expect(second.lastJob()).toMatchObject({ model_id: "m-measure", attempt_n: 0 });
    expect(first.jobs.length).toBe(jobsBefore);
    expect([...gw.gateway.registry.providerViews()].find((v) => v.providerId === "a-first")?.state).toBe("ready");
    firstScripts.set("m-decline", honest);
    // Earlier tests cooled "a-first" for m-decline (docs/routing.md); forget that, to see the refusal is per model.
    gw.gateway.routing.reset();
    await buyer.client.chat.completions.create({ model: "m-decline", messages, max_tokens: 16 });
    expect(first.lastJob()).toMatchObject({ model_id: "m-decline", attempt_n: 0 });
  });

  test("a later heartbeat that advertises the model makes that session routable for it again", async () => {
    const session = gw.gateway.registry.admittedByProvider.get("a-first")!;
    expect(session.refusedModels.has("m-measure")).toBe(true);
    first.sendHeartbeat();
    await waitFor(() => !session.refusedModels.has("m-measure"), 2000, "the refusal lifted");
    firstScripts.set("m-measure", honest);
    // The refused measurement also cooled the pair (docs/routing.md): forget that, to see the refusal lifted.
    gw.gateway.routing.reset();
    const completion = await buyer.client.chat.completions.create({ model: "m-measure", messages, max_tokens: 16 });
    expect(completion.choices[0]?.message.content).toBe(HONEST_TEXT);
    const job = first.lastJob();
    expect(job).toMatchObject({ model_id: "m-measure", attempt_n: 0 });
    expect(await settledRow(gw, job.request_id, 0)).toMatchObject({ provider_id: "a-first", label: "verified" });
  });
});

test("the ledger balances and the audit is clean after the failovers", async () => {
  await expectLedgerBalanced(gw);
  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);
  expect(first.errors).toEqual([]);
  expect(second.errors).toEqual([]);
});
