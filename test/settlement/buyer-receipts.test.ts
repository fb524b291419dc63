// GET /v1/receipts/{request_id}, end to end: a buyer sees the settlement labels of their own
// request's attempts — no prompt, no output, no provider identity — and another account's request id
// is indistinguishable from an unknown one (404).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { expectedCharge, paidBuyer, settledRow, type Buyer } from "./support.ts";

const SECRET_PROMPT = "my secret prompt 4711";
const messages = [{ role: "user" as const, content: SECRET_PROMPT }];

let gw: TestGateway;
let decliner: ScriptedProvider;
let server: ScriptedProvider;
let owner: Buyer;
let stranger: Buyer;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: ["view-model"] });
  // "a-…" wins the routing tie and declines, so the request has two attempts.
  decliner = await ScriptedProvider.connect({ url: gw.wsUrl, id: "a-decliner", models: ["view-model"], script: (a) => a.decline("model_not_loaded") });
  server = await ScriptedProvider.connect({
    url: gw.wsUrl,
    id: "b-server",
    models: ["view-model"],
    inputTokens: 9,
    script: (a) => {
      a.accept();
      a.chunk("the secret output", 4);
      a.end();
    },
  });
  await waitForReadyProviders(gw, 2);
  owner = await paidBuyer(gw, 10_000);
  stranger = await paidBuyer(gw, 10_000);
});

afterAll(async () => {
  await decliner.close();
  await server.close();
  await gw.close();
});

const receiptsOf = (id: string, apiKey: string) => fetch(`${gw.url}/v1/receipts/${id}`, { headers: { authorization: `Bearer ${apiKey}` } });

test("the owner sees each attempt's label, reason and charge; nothing else", async () => {
  const { data: completion, response } = await owner.client.chat.completions.create({ model: "view-model", messages, max_tokens: 8 }).withResponse();
  expect(completion.choices[0]?.message.content).toBe("the secret output");
  const requestId = response.headers.get("x-request-id")!;
  expect(requestId).toMatch(/^req_[0-9a-f]+$/);
  expect(server.lastJob()).toMatchObject({ request_id: requestId, attempt_n: 1 });
  await settledRow(gw, requestId, 1);

  const charge = expectedCharge(9, 4, 1_000_000, 1_000_000);
  const expected = {
    object: "request.receipts",
    request_id: requestId,
    settlement_mode: "enforce",
    charged_credits: charge.debit,
    attempts: [
      { attempt_n: 0, label: "zero_settled", reason: "nothing_delivered", billed_prompt_tokens: 0, billed_completion_tokens: 0, debit_credits: 0 },
      { attempt_n: 1, label: "verified", reason: null, billed_prompt_tokens: 9, billed_completion_tokens: 4, debit_credits: charge.debit },
    ],
  };
  const res = await receiptsOf(requestId, owner.apiKey);
  expect(res.status).toBe(200);
  const text = await res.text();
  expect(JSON.parse(text)).toEqual(expected);
  // The buyer-visible completion id names the same request.
  expect(completion.id).toContain(requestId);
  expect(await (await receiptsOf(completion.id, owner.apiKey)).json()).toEqual(expected);
  // No prompt, output, provider identity, receipt or account scope.
  for (const hidden of [SECRET_PROMPT, "the secret output", "a-decliner", "b-server", "provider", server.lastJob().route.account_scope, "eyJ"]) {
    expect(text).not.toContain(hidden);
  }
});

test("another account's request id → 404, like an unknown one; no key → 401", async () => {
  // The first test's decline cooled the decliner (docs/routing.md): forget that, so it is tried first again.
  gw.gateway.routing.reset();
  await owner.client.chat.completions.create({ model: "view-model", messages, max_tokens: 8 });
  const requestId = server.lastJob().request_id;
  await settledRow(gw, requestId, 1);
  expect((await receiptsOf(requestId, owner.apiKey)).status).toBe(200);

  const foreign = await receiptsOf(requestId, stranger.apiKey);
  expect(foreign.status).toBe(404);
  const unknown = await receiptsOf("req_0123456789abcdef01234567", stranger.apiKey);
  expect(unknown.status).toBe(404);
  const foreignBody = (await foreign.json()) as { error: { code: string; message: string } };
  const unknownBody = (await unknown.json()) as { error: { code: string; message: string } };
  expect(foreignBody.error.code).toBe("not_found");
  expect(foreignBody.error).toEqual(unknownBody.error);

  expect((await fetch(`${gw.url}/v1/receipts/${requestId}`)).status).toBe(401);
});
