// A retired model, end to end: after `gateway catalog remove` (another process, same data dir) the
// running gateway refuses new requests for it with 404 model_not_available before any dispatch, and
// a receipt issued while it was listed still verifies offline with `gateway verify-receipt` against
// the catalog history.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { NotFoundError } from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { keyFromSeed, rawPublic } from "../receipts/independent-signer.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { cli, ledgerAudit, paidBuyer, settledRow, type Buyer } from "./support.ts";

const messages = [{ role: "user" as const, content: "Last words?" }];

let gw: TestGateway;
let provider: ScriptedProvider;
let buyer: Buyer;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: ["retiring-model", "staying-model"] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "retire-prov", models: ["retiring-model", "staying-model"] });
  await waitForReadyProviders(gw, 1);
  buyer = await paidBuyer(gw, 100_000);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

test("after `catalog remove`: 404 model_not_available; the earlier receipt still verifies against the history", async () => {
  // Served and verified while listed.
  const before = await buyer.client.chat.completions.create({ model: "retiring-model", messages, max_tokens: 8 });
  expect(before.choices[0]?.message.content).toBe("Hello, world!");
  const requestId = provider.lastJob().request_id;
  const row = await settledRow(gw, requestId);
  expect(row.label).toBe("verified");
  const issuedUnder = provider.lastJob().route.catalog_id;

  // Retire it from another process; the running gateway picks the change up by itself.
  const removed = cli(["catalog", "remove", "--model-id", "retiring-model", "--data-dir", gw.dataDir]);
  expect(removed.exitCode).toBe(0);
  expect(JSON.parse(removed.stdout).action).toBe("removed");
  await waitFor(() => {
    const current = gw.gateway.catalog.current();
    return current !== null && !current.body.models.some((m) => m.model_id === "retiring-model");
  }, 8000, "the gateway to load the catalog without the retired model");
  expect(gw.gateway.catalog.current()!.catalog_id).not.toBe(issuedUnder);

  // New requests are refused before dispatch, though the provider still advertises the model.
  const jobsBefore = provider.jobs.length;
  const refused = await buyer.client.chat.completions.create({ model: "retiring-model", messages, max_tokens: 8 }).catch((e) => e);
  expect(refused).toBeInstanceOf(NotFoundError);
  expect(refused.status).toBe(404);
  expect(refused.code).toBe("model_not_available");
  expect(provider.jobs.length).toBe(jobsBefore);
  const feed = (await (await fetch(`${gw.url}/v1/catalog`)).json()) as { models: { model_id: string }[] };
  expect(feed.models.map((m) => m.model_id)).toEqual(["staying-model"]);
  // Other models still serve.
  const other = await buyer.client.chat.completions.create({ model: "staying-model", messages, max_tokens: 8 });
  expect(other.choices[0]?.message.content).toBe("Hello, world!");

  // Offline verification of the receipt issued before the retirement.
  const exported = cli(["receipts", "export", "--request-id", requestId, "--attempt", "0", "--data-dir", gw.dataDir]);
  expect(exported.exitCode).toBe(0);
  const history = cli(["catalog", "history", "--json", "--data-dir", gw.dataDir]);
  expect(history.exitCode).toBe(0);
  const historyLines = history.stdout.trim().split("\n");
  expect(historyLines.length).toBeGreaterThanOrEqual(2);
  const receiptFile = join(gw.dataDir, "receipt.env");
  const historyFile = join(gw.dataDir, "history.jsonl");
  writeFileSync(receiptFile, exported.stdout);
  writeFileSync(historyFile, history.stdout);

  const valid = cli(["verify-receipt", receiptFile, "--catalog-history", historyFile, "--provider-key", provider.publicKeyBase64]);
  expect(JSON.parse(valid.stdout)).toMatchObject({ result: "valid" });
  expect(valid.exitCode).toBe(0);

  // The verifier can say no: another provider's key, or a history without the receipt's catalog.
  const otherKey = Buffer.from(rawPublic(keyFromSeed(new Uint8Array(32).fill(9)))).toString("base64");
  const wrongKey = cli(["verify-receipt", receiptFile, "--catalog-history", historyFile, "--provider-key", otherKey]);
  expect(JSON.parse(wrongKey.stdout).result).toBe("invalid");
  expect(wrongKey.exitCode).toBe(1);
  const latestOnly = join(gw.dataDir, "latest.jsonl");
  writeFileSync(latestOnly, `${historyLines.at(-1)}\n`);
  const inconclusive = cli(["verify-receipt", receiptFile, "--catalog-history", latestOnly, "--provider-key", provider.publicKeyBase64]);
  expect(JSON.parse(inconclusive.stdout).result).toBe("inconclusive");
  expect(inconclusive.exitCode).toBe(2);

  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);
}, 60_000); // four CLI processes and a gateway round trip: seconds each on a loaded CI machine
