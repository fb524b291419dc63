// A cluster node records a request as its own (`r:<id>` in `gw:owned:<node>`, which a survivor reads to
// resolve a dead node's reservations) before it writes the request's reservation. Found by the cluster
// crash chaos (`bun run chaos --cluster`, seeds 22009 and 23008): the record was made when the request
// started running, after the reservation's commit; a node killed in between left the reservation held
// with nothing pointing at it. The record now rides the concurrency-slot script, which runs first.
//
// The probe, with no timing in it: the node's Redis client is wrapped so that, when Redis has answered
// a command that puts the request in the owned set and before the node hears that answer, the test
// records "owned" in PostgreSQL; a trigger on `reservations` logs how many such rows it saw.
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

describe.skipIf(clusterMissing !== null)("a cluster node owns a request before it reserves for it", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("the reservation's INSERT sees the request already in the owned set", async () => {
    const redis: TestRedis = await startRedis();
    cleanup.push(() => redis.stop());
    const dataDir = tempDir("gw-cluster-own-request-");
    cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const databaseUrl = await (await sharedPostgres()).freshDatabase();
    const probe = new SQL(databaseUrl);
    cleanup.push(() => probe.close());
    await probe.unsafe(`
      CREATE TABLE probe_owned (request_id TEXT NOT NULL);
      CREATE TABLE probe_reserved (request_id TEXT NOT NULL, owned_before BIGINT NOT NULL);
      CREATE FUNCTION probe_reserved() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO probe_reserved SELECT NEW.request_id, count(*) FROM probe_owned WHERE request_id = NEW.request_id;
        RETURN NEW;
      END $$;
      CREATE TRIGGER probe_reserved BEFORE INSERT ON reservations FOR EACH ROW EXECUTE FUNCTION probe_reserved();`);

    const client = await connectRedis({ url: redis.url, log: silentLog });
    /** The request a command puts in an owned set, if it does (a plain SADD, or the slot script given the set). */
    const ownedRequest = (command: string, args: (string | number)[]): string | null => {
      const texts = args.map(String);
      if (command === "SADD" && texts[0]!.startsWith("gw:owned:") && texts[1]!.startsWith("r:")) return texts[1]!.slice(2);
      if (command === "EVAL" && texts[1] === "2" && texts[3]!.startsWith("gw:owned:") && texts[0]!.includes("ZADD")) return texts[4]!;
      return null;
    };
    const wrapped: ClusterRedis = Object.assign(Object.create(client) as ClusterRedis, {
      async call<T>(command: string, args: (string | number)[]) {
        const answer = await client.call<T>(command, args);
        const request = ownedRequest(command, args);
        if (request !== null) await probe`INSERT INTO probe_owned VALUES (${request})`;
        return answer;
      },
      fire(command: string, args: (string | number)[]) {
        void wrapped.call(command, args);
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
    const { account_id } = await gateway.store.createAccount({ name: "own-request", tier: "paid" });
    expect((await gateway.store.grantCredits(account_id, 100_000)).ok).toBe(true);
    const { api_key } = await gateway.store.createApiKey({ account_id });
    const provider = spawnProvider({ wsUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, dataDir } as TestGateway, { id: "own-request-prov" });
    cleanup.push(() => provider.kill());
    await provider.waitForEvent("welcome", () => true, 30_000);

    const answer = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${api_key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "test-model", max_tokens: 4, messages: [{ role: "user", content: "reserve me" }] }),
    });
    expect(answer.status).toBe(200);
    await answer.text();
    const reserved = await probe`SELECT request_id, owned_before::int AS owned_before FROM probe_reserved`;
    expect(reserved.length).toBe(1);
    expect(reserved[0].owned_before).toBe(1);
  }, 120_000);
});
