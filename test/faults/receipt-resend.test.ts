// Defect 3 end to end: the reference provider runtime against a real gateway. A receipt the runtime
// still holds for an attempt the gateway has settled (its `settled` frame was lost) is re-sent on the
// next session; the gateway answers it with the attempt's final `settled` frame and stores nothing,
// and the runtime drops it — so it is not re-sent on every reconnect forever.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import OpenAI from "openai";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { ReceiptOutbox } from "../../src/provider/outbox.ts";
import { receiptLog } from "../support/receiptLog.ts";
import { startProviderRuntime, type ProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import { modelHash, startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";

const MODEL = "resend-model";
const PROVIDER = "resend-prov";
let gw: TestGateway;
let runtime: ProviderRuntime;
const outbox = new ReceiptOutbox();
const settledFrames: { request_id: string; label: string }[] = [];

beforeAll(async () => {
  gw = await startTestGateway();
  runtime = startProviderRuntime({
    gatewayUrl: gw.wsUrl,
    providerId: PROVIDER,
    key: await loadOrCreateProviderKey(join(gw.dataDir, "resend.key")),
    engine: createSyntheticEngine({ ttftMs: 0, tokensPerSecond: 0 }),
    models: [{ model_id: MODEL, model_hash: modelHash(MODEL), max_context_tokens: 8192 }],
    backoff: { minMs: 5, maxMs: 20 },
    outbox,
  });
  runtime.on("settled", (frame: { request_id: string; label: string }) => settledFrames.push(frame));
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await runtime.stop();
  await gw.close();
});

const receiptRows = async (requestId: string) => (await receiptLog(gw.dataDir, requestId)).length;

test("a receipt for a settled attempt, re-sent after a reconnect, is answered and dropped", async () => {
  const client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
  const completion = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 3 });
  const requestId = completion.id.replace(/^chatcmpl-/, "");
  await waitFor(() => settledFrames.some((f) => f.request_id === requestId), 5000, "the first settled frame");
  const row = (await gw.gateway.store.getSettlement(requestId, 0))!;
  expect(row.label).not.toBe("pending");
  expect(outbox.size).toBe(0);
  const rows = await receiptRows(requestId);

  // As if the `settled` frame had been lost: the runtime holds the receipt again, sent on no session.
  outbox.keep({ request_id: requestId, attempt_n: 0 }, row.receipt!, Date.now(), null);
  const sessionsBefore = settledFrames.length;
  gw.gateway.registry.admittedByProvider.get(PROVIDER)!.close(1001, "test_reconnect");
  await waitFor(() => outbox.size === 0, 5000, "the outbox to drop the settled receipt");
  expect(settledFrames.length).toBe(sessionsBefore + 1);
  expect(settledFrames.at(-1)).toMatchObject({ request_id: requestId, label: row.label });
  expect(await receiptRows(requestId)).toBe(rows);
  expect(gw.gateway.registry.ignoredReceipts.after_final).toBe(1);
});
