// A stream's delivered record covers only bytes that have left the process (docs/receipts.md,
// "Crashes"). The store's hook before every group COMMIT is the probe: at the COMMIT that records the
// delivery, the kernel must already hold the stream's last delta on its way to the buyer (read by it,
// in its socket's receive queue, or in the gateway socket's send queue), and `[DONE]`, which waits for
// the record, must not have reached the buyer yet.
// - The provider's last chunk and its `end` arrive in one turn: Bun hands the delta to the socket only
//   after the turn's immediates, where the group commit runs.
// - A buyer that does not read: the kernel's buffers fill and the gateway's last bytes wait in the
//   process until the buyer reads again.
// Were the record in a commit before those bytes left, a kill -9 there would charge for a delta the
// buyer never got. Embedded only: it probes the SQLite group commit (a cluster node's record waits on
// the same gate).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { rmSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { TEST_MODE, tempDir, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { socketQueues } from "../support/receiveQueue.ts";
import { ScriptedProvider, type ScriptedAttempt, type Script } from "../support/scriptedProvider.ts";

const probed = TEST_MODE === "embedded" && process.platform === "linux";
let gateway: RunningGateway;
let dataDir: string;
let provider: ScriptedProvider;
let apiKey: string;

const deliveredRecords = () => {
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  try {
    return (db.query("SELECT COUNT(*) AS n FROM settlements WHERE delivered_end_byte IS NOT NULL").get() as { n: number }).n;
  } finally {
    db.close();
  }
};

/** The buyer: a raw socket, so the test knows every byte it was handed. */
class RawBuyer {
  readonly socket: net.Socket;
  received = Buffer.alloc(0);

  constructor(body: string) {
    this.socket = net.connect(gateway.port, "127.0.0.1");
    this.socket.on("data", (d: Buffer) => (this.received = Buffer.concat([this.received, d])));
    this.socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${apiKey}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  }

  /** Bytes on their way to the buyer that have left the gateway's process. */
  leftTheGateway(): number {
    const port = this.socket.localPort!;
    return this.received.length + socketQueues(port).receive + socketQueues(gateway.port, port).send;
  }
}
let buyer: RawBuyer | null = null;

// Before each group COMMIT: the records committed so far, and the bytes that had left for the buyer.
const commits: { delivered: number; left: number }[] = [];
let probing = false;
const commitFails = () => {
  if (probing && buyer) commits.push({ delivered: deliveredRecords(), left: buyer.leftTheGateway() });
  return false;
};

/** Two chunks; the test sends the rest. */
let attempt: ScriptedAttempt | null = null;
const firstTwo: Script = (a) => {
  a.accept();
  a.chunk("First, ", 2);
  a.chunk("second, ", 2);
  attempt = a;
};
const LAST_DELTA = "and the last delta.";

beforeAll(async () => {
  if (!probed) return;
  dataDir = tempDir("gw-record-after-bytes-");
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  // A buyer that stops reading may have the whole test stream, in chunks of 60 KB, waiting in the process.
  const config = { ...loaded.config, port: 0, dataDir, logLevel: "error" as const, settlementMode: "observe" as const, streamBufferBytes: 64 * 1024 * 1024, maxChunkBytesPerToken: 64 * 1024 };
  gateway = await startGateway(config, { log: silentLog, storeHooks: { commitFails } });
  provider = await ScriptedProvider.connect({ url: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, id: "bytes-prov", models: ["test-model"], script: firstTwo });
  await waitForReadyProviders({ gateway } as TestGateway, 1);
  const { account_id } = await gateway.store.createAccount({ name: "bytes", tier: "paid" });
  apiKey = (await gateway.store.createApiKey({ account_id })).api_key;
  expect((await gateway.store.grantCredits(account_id, 100_000_000)).ok).toBe(true);
});

afterAll(async () => {
  if (!probed) return;
  buyer?.socket.destroy();
  await provider.close();
  await gateway.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

/** Runs one stream to its end; `rest` sends what follows the first two chunks. Returns the delivering COMMIT's figures. */
async function delivery(rest: (a: ScriptedAttempt) => void, whileEnding?: () => Promise<void>) {
  const recordsBefore = deliveredRecords();
  commits.length = 0;
  attempt = null;
  const body = JSON.stringify({ model: "test-model", max_tokens: 4096, stream: true, messages: [{ role: "user", content: "count my bytes" }] });
  const b = (buyer = new RawBuyer(body));
  await waitFor(() => b.received.includes("second, ") && attempt !== null, 10_000, "the first chunks");
  probing = true;
  await whileEnding?.call(null);
  rest(attempt!);
  // The gateway has relayed everything and released the attempt.
  await waitFor(() => gateway.registry.attempts.size === 0, 10_000, "the attempt released");
  b.socket.resume();
  await waitFor(() => b.received.includes("data: [DONE]"), 20_000, "[DONE]");
  gateway.store.flushCommits();
  probing = false;
  expect(deliveredRecords()).toBe(recordsBefore + 1);

  const text = b.received.toString("latin1");
  const lastDeltaEnd = text.indexOf("\n\n", text.indexOf(LAST_DELTA)) + 2;
  expect(lastDeltaEnd).toBeGreaterThan(1);
  // The COMMIT that recorded the delivery: the last one before which it was not recorded yet.
  const delivering = commits.findLast((c) => c.delivered === recordsBefore);
  expect(delivering).toBeDefined();
  b.socket.destroy();
  return { left: delivering!.left, lastDeltaEnd, doneAt: text.indexOf("data: [DONE]") };
}

test.skipIf(!probed)("the last chunk and `end` in one turn: at the delivering COMMIT the last delta has left, [DONE] has not", async () => {
  const seen = await delivery((a) => {
    a.chunk(LAST_DELTA, 4);
    a.end();
  });
  expect(seen.left).toBeGreaterThanOrEqual(seen.lastDeltaEnd);
  expect(seen.left).toBeLessThanOrEqual(seen.doneAt);
});

test.skipIf(!probed)("a buyer that stopped reading: the record waits until the bytes held in the process have left", async () => {
  const bulk = "x".repeat(60_000);
  const seen = await delivery(
    (a) => {
      // ~6 MB: more than the kernel's buffers hold for a socket nobody reads (~4 MB here).
      for (let i = 0; i < 100; i++) a.chunk(bulk, 1);
      a.chunk(LAST_DELTA, 4);
      a.end();
    },
    async () => void buyer!.socket.pause(),
  );
  // (Bytes in flight count in both kernel queues here, so `[DONE]`'s order is the first test's to check.)
  expect(seen.left).toBeGreaterThanOrEqual(seen.lastDeltaEnd);
});
