// The facades are covered paid entrypoints on the same billed pipeline (docs/receipts.md): their requests
// reserve, settle and post to the same ledger tables as chat completions, at the same prices.
import { afterAll, beforeAll, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { startRecordingProvider, type RecordingProvider } from "./support.ts";

let gw: TestGateway;
let provider: RecordingProvider;
let paidKey: string;
let paidAccount: string;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", messagesFacade: true, responsesFacade: true }, { catalog: ["test-model"] });
  provider = await startRecordingProvider(gw, "p-facade-billing");
  await waitForReadyProviders(gw, 1);
  const { account_id } = await gw.gateway.store.createAccount({ tier: "paid", name: "facade-buyer" });
  paidAccount = account_id;
  paidKey = (await gw.gateway.store.createApiKey({ account_id })).api_key;
  await gw.gateway.store.grantCredits(account_id, 1_000_000);
});

afterAll(async () => {
  await provider?.stop();
  await gw?.close();
});

/** chatcmpl-req_<hex>, msg_<hex>, resp_<hex> → req_<hex>. */
const requestIdOf = (id: string) => `req_${/([0-9a-f]{24})$/.exec(id)![1]!}`;

async function settled(requestId: string) {
  await waitFor(async () => (await gw.gateway.store.listSettlements({ request_id: requestId })).every((s) => s.label !== "pending"), 5000, `settlement of ${requestId}`);
  return await gw.gateway.store.listSettlements({ request_id: requestId });
}

test("chat, messages and responses requests each settle verified, debiting the same account at the same rate", async () => {
  const before = await gw.gateway.store.ledgerBalance(`buyer:${paidAccount}`);
  const openai = new OpenAI({ baseURL: gw.baseURL, apiKey: paidKey, maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: gw.url, apiKey: paidKey, maxRetries: 0 });

  const chat = await openai.chat.completions.create({ model: "test-model", max_tokens: 8, messages: [{ role: "user", content: "hello" }] });
  const message = await anthropic.messages.create({ model: "test-model", max_tokens: 8, messages: [{ role: "user", content: "hello" }] });
  const response = await openai.responses.create({ model: "test-model", max_output_tokens: 8, input: "hello" });

  const ids = [requestIdOf(chat.id), requestIdOf(message.id), requestIdOf(response.id)];
  let total = 0;
  for (const id of ids) {
    const rows = await settled(id);
    expect(rows).toHaveLength(1);
    const row = rows[0]!;
    expect(row).toMatchObject({ label: "verified", account_id: paidAccount, payer: "buyer" });
    // Default row: 1 credit per prompt or completion token; the provider gets 90 % (floor).
    expect(row.debit_credits).toBe(row.billed_prompt_tokens + row.billed_completion_tokens);
    expect(row.provider_credits).toBe(Math.floor((row.debit_credits * 9000) / 10000));
    expect(row.billed_completion_tokens).toBeGreaterThan(0);
    total += row.debit_credits;
    expect((await gw.gateway.store.getReservation(id))?.state).toBe("finalised");
  }
  // The chat answer's usage is what was billed.
  const chatRow = (await gw.gateway.store.listSettlements({ request_id: ids[0]! }))[0]!;
  expect(chat.usage?.completion_tokens).toBe(chatRow.billed_completion_tokens);
  expect(message.usage.output_tokens).toBe((await gw.gateway.store.listSettlements({ request_id: ids[1]! }))[0]!.billed_completion_tokens);
  expect(await gw.gateway.store.ledgerBalance(`buyer:${paidAccount}`)).toBe(before - total);
  // The buyer can look each one up by the id its SDK returned.
  for (const id of [chat.id, message.id, response.id]) {
    const res = await fetch(`${gw.baseURL}/receipts/${id}`, { headers: { authorization: `Bearer ${paidKey}` } });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { attempts: { label: string }[] }).attempts.map((a) => a.label)).toEqual(["verified"]);
  }
  expect((await gw.gateway.store.ledgerBalances()).reduce((n, b) => n + b.balance, 0)).toBe(0);
});
