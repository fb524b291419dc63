// A cluster node keeps a non-streaming answer for retries in Redis before it records the delivery that
// charges for it, as the embedded gateway does with its replay file (docs/receipts.md, "Crashes"): a
// node killed between that record and the write leaves the buyer's retry, on any node, an answer to
// replay instead of a second charge. Redis answers later than the write is made, so the request's
// writes wait for its answer.
//
// The probe, with no timing in it: the node's Redis client is wrapped so that, when Redis has answered
// the SET that keeps the answer and before the node hears that answer, the test records "kept" in
// PostgreSQL. A trigger on `settlements` logs, for the UPDATE that writes the delivered record, how
// many "kept" rows it saw: 0 means the charge's record came before the copy.
import { afterAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { rmSync } from "node:fs";
import { loadConfig } from "../../src/config/index.ts";
import { connectRedis, type ClusterRedis } from "../../src/cluster/redis.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { spawnProvider, tempDir, waitFor, type TestGateway } from "../support/harness.ts";
import { startRedis, type TestRedis } from "../support/redis.ts";
import { clusterMissing } from "../support/cluster.ts";
import { sharedPostgres } from "../support/postgres.ts";

describe.skipIf(clusterMissing !== null)("a cluster node keeps the answer before it records the delivery", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("the delivered record's UPDATE sees the answer already kept in Redis; the retry replays it", async () => {
    const redis: TestRedis = await startRedis();
    cleanup.push(() => redis.stop());
    const dataDir = tempDir("gw-cluster-replay-order-");
    cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const databaseUrl = await (await sharedPostgres()).freshDatabase();
    const probe = new SQL(databaseUrl);
    cleanup.push(() => probe.close());
    await probe.unsafe(`
      CREATE TABLE probe_kept (at TIMESTAMPTZ NOT NULL DEFAULT now());
      CREATE TABLE probe_delivered (kept_before BIGINT NOT NULL);
      CREATE FUNCTION probe_delivered() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.delivered_end_byte IS NOT NULL AND OLD.delivered_end_byte IS NULL THEN
          INSERT INTO probe_delivered (kept_before) SELECT count(*) FROM probe_kept;
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER probe_delivered BEFORE UPDATE ON settlements FOR EACH ROW EXECUTE FUNCTION probe_delivered();`);

    const client = await connectRedis({ url: redis.url, log: silentLog });
    // The answer's copy is a SET of the body's entry holding a succeeded result.
    const keepsAnswer = (command: string, args: (string | number)[]) =>
      command === "SET" && String(args[0]).startsWith("gw:replay:b:") && String(args[1]).includes('"succeeded"');
    const wrapped: ClusterRedis = Object.assign(Object.create(client) as ClusterRedis, {
      async call<T>(command: string, args: (string | number)[]) {
        const answer = await client.call<T>(command, args);
        if (keepsAnswer(command, args)) await probe`INSERT INTO probe_kept DEFAULT VALUES`;
        return answer;
      },
    });
    const loaded = loadConfig([], {});
    if (!loaded.ok) throw new Error(loaded.message);
    const gateway: RunningGateway = await startGateway(
      { ...loaded.config, port: 0, dataDir, logLevel: "error", settlementMode: "observe", databaseUrl, redisUrl: redis.url },
      { log: silentLog, redis: wrapped },
    );
    cleanup.push(() => gateway.stop());
    await gateway.cluster!.ready;
    const { account_id } = await gateway.store.createAccount({ name: "order", tier: "paid" });
    expect((await gateway.store.grantCredits(account_id, 100_000)).ok).toBe(true);
    const { api_key } = await gateway.store.createApiKey({ account_id });
    const provider = spawnProvider({ wsUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, dataDir } as TestGateway, { id: "order-prov" });
    cleanup.push(() => provider.kill());
    await provider.waitForEvent("welcome", () => true, 30_000);

    const ask = (headers: Record<string, string> = {}) =>
      fetch(`${gateway.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${api_key}`, "content-type": "application/json", "idempotency-key": "order-1", ...headers },
        body: JSON.stringify({ model: "test-model", max_tokens: 4, messages: [{ role: "user", content: "keep me before you charge me" }] }),
      });
    const first = await ask();
    expect(first.status).toBe(200);
    const body = await first.text();
    await waitFor(async () => (await probe`SELECT count(*)::int AS n FROM probe_delivered`)[0].n === 1, 10_000, "the delivered record");
    const [delivered] = await probe`SELECT kept_before::int AS kept_before FROM probe_delivered`;
    expect(delivered.kept_before).toBe(1);

    // The same key again: that very answer, under its first request id, not billed again.
    await waitFor(async () => (await gateway.store.listSettlements({})).every((s) => s.label !== "pending"), 10_000, "the attempt settled");
    const replay = await ask();
    expect(replay.status).toBe(200);
    expect(await replay.text()).toBe(body);
    expect(replay.headers.get("x-request-id")).toBe(first.headers.get("x-request-id"));
    expect((await gateway.store.listSettlements({})).length).toBe(1);
  }, 120_000);
});
