// A non-streaming answer is kept for retries before the commit that charges for it. The last write of
// a response waits for its attempt's delivered record to commit (so a provider is paid for what a
// buyer got, even across a crash); a kill -9 after that commit and before the write would charge a
// buyer who never got the body. The retry-replay copy is therefore written first: the buyer's retry
// (the SDK's, or one with the same Idempotency-Key) gets that very answer after a restart and is not
// billed again (docs/receipts.md, "Crashes"). The store's hook asked before every group COMMIT serves
// as a probe: at the COMMIT that records the delivery, the replay file must already hold the answer.
// Embedded only: it probes the SQLite group commit and reads the replay file.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { join } from "node:path";
import { rmSync } from "node:fs";
import { loadConfig } from "../../src/config/index.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { TEST_MODE, tempDir, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";

const embedded = TEST_MODE === "embedded";
let gateway: RunningGateway;
let dataDir: string;
let provider: ScriptedProvider;

/** Rows of a file of the gateway's, as another connection sees them (committed rows only). */
const count = (file: string, sql: string) => {
  const db = new Database(join(dataDir, file), { readonly: true });
  try {
    return (db.query(sql).get() as { n: number }).n;
  } finally {
    db.close();
  }
};
const replayRows = () => count("replays.db", "SELECT COUNT(*) AS n FROM replay_results");
const deliveredRecords = () => count("gateway.db", "SELECT COUNT(*) AS n FROM settlements WHERE delivered_end_byte IS NOT NULL");

// Before each group COMMIT: what was committed so far, and what the replay file held.
const commits: { delivered: number; replays: number }[] = [];
let probing = false;
const commitFails = () => {
  if (probing) commits.push({ delivered: deliveredRecords(), replays: replayRows() });
  return false;
};

beforeAll(async () => {
  if (!embedded) return;
  dataDir = tempDir("gw-replay-before-charge-");
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  gateway = await startGateway({ ...loaded.config, port: 0, dataDir, logLevel: "error", settlementMode: "observe" }, { log: silentLog, storeHooks: { commitFails } });
  provider = await ScriptedProvider.connect({ url: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, id: "probe-prov", models: ["test-model"] });
  await waitForReadyProviders({ gateway } as TestGateway, 1);
});

afterAll(async () => {
  if (!embedded) return;
  await provider.close();
  await gateway.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

test.skipIf(!embedded)("at the COMMIT that records the delivery, the answer is already in the replay file; a retry replays it", async () => {
  const { account_id } = await gateway.store.createAccount({ name: "probe", tier: "paid" });
  const { api_key } = await gateway.store.createApiKey({ account_id });
  expect((await gateway.store.grantCredits(account_id, 100_000)).ok).toBe(true);
  const body = JSON.stringify({ model: "test-model", max_tokens: 8, messages: [{ role: "user", content: "keep me before you charge me" }] });
  const headers = { authorization: `Bearer ${api_key}`, "content-type": "application/json" };
  expect(deliveredRecords()).toBe(0);
  const replaysBefore = replayRows();

  probing = true;
  const response = await fetch(`${gateway.url}/v1/chat/completions`, { method: "POST", headers, body });
  expect(response.status).toBe(200);
  const text = await response.text();
  gateway.store.flushCommits();
  probing = false;
  expect(deliveredRecords()).toBe(1);

  // The COMMIT that recorded the delivery: the last one before which nothing was recorded yet.
  const delivering = commits.findLast((c) => c.delivered === 0);
  expect(delivering).toBeDefined();
  expect(delivering!.replays).toBe(replaysBefore + 1);

  // The SDK's retry of the same body gets that answer, not a new run.
  const jobs = provider.jobs.length;
  const retry = await fetch(`${gateway.url}/v1/chat/completions`, { method: "POST", headers: { ...headers, "x-stainless-retry-count": "1" }, body });
  expect(retry.headers.get("idempotent-replayed")).toBe("true");
  expect(await retry.text()).toBe(text);
  expect(retry.headers.get("x-request-id")).toBe(response.headers.get("x-request-id"));
  expect(provider.jobs.length).toBe(jobs);
});
