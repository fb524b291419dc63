// Two clusters on one Redis server, each in a database of its own (`redis://HOST:PORT/N`): keys are
// scoped by the database, and so must pub/sub be (it is not, in Redis): a node of one cluster never
// sees the other cluster's providers, registry or changes. A node of the same database does (control).
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { clusterChannel, connectRedis } from "../../src/cluster/redis.ts";
import { loadConfig } from "../../src/config/index.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { spawnProvider, tempDir, waitFor, type TestGateway } from "../support/harness.ts";
import { startRedis } from "../support/redis.ts";
import { clusterMissing } from "../support/cluster.ts";
import { sharedPostgres } from "../support/postgres.ts";

test("channel names carry the URL's database number (none for database 0)", () => {
  expect(clusterChannel("redis://127.0.0.1:6379", "changes")).toBe("gw:changes");
  expect(clusterChannel("redis://127.0.0.1:6379/0", "registry")).toBe("gw:registry");
  expect(clusterChannel("redis://:secret@10.0.0.5:6379/7", "node:n1:inbox")).toBe("gw:db7:node:n1:inbox");
});

describe.skipIf(clusterMissing !== null)("two clusters sharing one Redis server", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  /** A cluster's shared settings: its database and its data dir (the catalog operator key). */
  async function cluster(pgUrl: Promise<string>) {
    const dataDir = tempDir("gw-shared-redis-");
    cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
    return { databaseUrl: await pgUrl, dataDir };
  }

  async function node(redisUrl: string, { databaseUrl, dataDir }: { databaseUrl: string; dataDir: string }, nodeId: string): Promise<RunningGateway> {
    const loaded = loadConfig([], {});
    if (!loaded.ok) throw new Error(loaded.message);
    const redis = await connectRedis({ url: redisUrl, log: silentLog });
    const config = { ...loaded.config, port: 0, dataDir, logLevel: "error" as const, settlementMode: "observe" as const, databaseUrl, redisUrl, nodeId, clusterLeaseMs: 1000 };
    const gateway = await startGateway(config, { log: silentLog, redis });
    cleanup.push(() => gateway.stop());
    await gateway.cluster!.ready;
    return gateway;
  }

  test("a node sees its own cluster's providers, never the other cluster's", async () => {
    const server = await startRedis();
    cleanup.push(() => server.stop());
    const pg = await sharedPostgres();
    const clusterA = await cluster(pg.freshDatabase());
    const a1 = await node(`${server.url}/1`, clusterA, "a1");
    const a2 = await node(`${server.url}/1`, clusterA, "a2");
    const b1 = await node(`${server.url}/2`, await cluster(pg.freshDatabase()), "b1");

    const dataDir = tempDir("gw-shared-redis-prov-");
    cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const provider = spawnProvider({ wsUrl: `ws://127.0.0.1:${a1.port}${PROVIDER_CONNECT_PATH}`, dataDir } as TestGateway, { id: "a-prov" });
    cleanup.push(() => provider.kill());
    await provider.waitForEvent("welcome", () => true, 30_000);

    // The control: a2 (same database) routes to a1's provider once a1's registry reaches it.
    await waitFor(() => [...a2.cluster!.node.remoteViews()].some((v) => v.providerId === "a-prov"), 5000, "a2 sees a1's provider");
    // Several registry broadcasts later (one every fifth of the 1 s lease), b1 still knows of nothing.
    await Bun.sleep(600);
    expect([...b1.cluster!.node.remoteViews()]).toEqual([]);
    expect(b1.cluster!.node.alive("a1")).resolves.toBe(false);
  }, 60_000);
});
