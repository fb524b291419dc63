// A stream's delivered record covers only bytes that have left the process. The provider's last chunk
// and its `end` arrive in one turn; the chunk's delta is written to the buyer's response, but Bun
// hands it to the socket only after the turn's immediates, where the group commit runs. Were the record
// in that commit, a kill -9 between the COMMIT and the write would charge for a delta the buyer never
// got (docs/receipts.md, "Crashes"). The store's hook before every group COMMIT is the probe: at the
// COMMIT that records the delivery, the kernel must already hold the last delta for the buyer (read
// by it, or in its socket's receive queue), and must not hold `[DONE]` yet, which waits for the record.
// Embedded only: it probes the SQLite group commit (a cluster node's record waits on the same gate).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { rmSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { TEST_MODE, tempDir, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { receiveQueue } from "../support/receiveQueue.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";

const probed = TEST_MODE === "embedded" && process.platform === "linux";
let gateway: RunningGateway;
let dataDir: string;
let provider: ScriptedProvider;

const deliveredRecords = () => {
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  try {
    return (db.query("SELECT COUNT(*) AS n FROM settlements WHERE delivered_end_byte IS NOT NULL").get() as { n: number }).n;
  } finally {
    db.close();
  }
};

/** The buyer: a raw socket, so the test knows every byte it was handed. */
let buyer: net.Socket | null = null;
let received = Buffer.alloc(0);
const buyerHas = () => received.length + (buyer ? receiveQueue(buyer.localPort!) : 0);

// Before each group COMMIT: the records committed so far, and the bytes the kernel had for the buyer.
const commits: { delivered: number; buyerBytes: number }[] = [];
let probing = false;
const commitFails = () => {
  if (probing) commits.push({ delivered: deliveredRecords(), buyerBytes: buyerHas() });
  return false;
};

/** Two chunks; then, once the buyer has them, the last chunk and `end` in one turn. */
let sendRest: (() => void) | null = null;
const lastInOneTurn: Script = (a) => {
  a.accept();
  a.chunk("First, ", 2);
  a.chunk("second, ", 2);
  sendRest = () => {
    a.chunk("and the last delta.", 4);
    a.end();
  };
};

beforeAll(async () => {
  if (!probed) return;
  dataDir = tempDir("gw-record-after-bytes-");
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  gateway = await startGateway({ ...loaded.config, port: 0, dataDir, logLevel: "error", settlementMode: "observe" }, { log: silentLog, storeHooks: { commitFails } });
  provider = await ScriptedProvider.connect({ url: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, id: "bytes-prov", models: ["test-model"], script: lastInOneTurn });
  await waitForReadyProviders({ gateway } as TestGateway, 1);
});

afterAll(async () => {
  if (!probed) return;
  buyer?.destroy();
  await provider.close();
  await gateway.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

test.skipIf(!probed)("at the COMMIT that records a stream's delivery, the buyer's kernel has its last delta and not yet [DONE]", async () => {
  const { account_id } = await gateway.store.createAccount({ name: "bytes", tier: "paid" });
  const { api_key } = await gateway.store.createApiKey({ account_id });
  expect((await gateway.store.grantCredits(account_id, 100_000)).ok).toBe(true);
  const body = JSON.stringify({ model: "test-model", max_tokens: 16, stream: true, messages: [{ role: "user", content: "count my bytes" }] });
  expect(deliveredRecords()).toBe(0);

  buyer = net.connect(gateway.port, "127.0.0.1");
  buyer.on("data", (d: Buffer) => (received = Buffer.concat([received, d])));
  buyer.write(
    `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${api_key}\r\n` +
      `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  await waitFor(() => received.includes("second, ") && sendRest !== null, 10_000);
  probing = true;
  sendRest!();
  await waitFor(() => received.includes("data: [DONE]"), 10_000);
  gateway.store.flushCommits();
  probing = false;
  expect(deliveredRecords()).toBe(1);

  const text = received.toString("latin1");
  const lastDeltaEnd = text.indexOf("\n\n", text.indexOf("and the last delta.")) + 2;
  const doneAt = text.indexOf("data: [DONE]");
  expect(lastDeltaEnd).toBeGreaterThan(1);
  // The COMMIT that recorded the delivery: the last one before which nothing was recorded yet.
  const delivering = commits.findLast((c) => c.delivered === 0);
  expect(delivering).toBeDefined();
  expect(delivering!.buyerBytes).toBeGreaterThanOrEqual(lastDeltaEnd);
  expect(delivering!.buyerBytes).toBeLessThanOrEqual(doneAt);
});
