// Redis unreachable under a cluster node: buyers get the 503 envelope with `retryable: true`, nothing
// is written (no reservation, no settlement), /healthz and /metrics say redis is down, and service
// comes back by itself once Redis does — no restart.
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { loadConfig } from "../../src/config/index.ts";
import { connectRedis } from "../../src/cluster/redis.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { spawnProvider, tempDir, waitFor, type TestGateway } from "../support/harness.ts";
import { startRedis, type TestRedis } from "../support/redis.ts";
import { clusterMissing } from "../support/cluster.ts";
import { sharedPostgres } from "../support/postgres.ts";

describe.skipIf(clusterMissing !== null)("Redis down under a cluster node", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("503 retryable, nothing written, healthz and metrics show it, recovery without restart", async () => {
    const redis: TestRedis = await startRedis();
    cleanup.push(() => redis.stop());
    const dataDir = tempDir("gw-redis-down-");
    cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
    const loaded = loadConfig([], {});
    if (!loaded.ok) throw new Error(loaded.message);
    const client = await connectRedis({ url: redis.url, log: silentLog, commandTimeoutMs: 300, probeMs: 100 });
    const databaseUrl = await (await sharedPostgres()).freshDatabase();
    const gateway: RunningGateway = await startGateway(
      { ...loaded.config, port: 0, dataDir, logLevel: "error", settlementMode: "observe", databaseUrl, redisUrl: redis.url, clusterLeaseMs: 2000 },
      { log: silentLog, redis: client },
    );
    cleanup.push(() => gateway.stop());
    await gateway.cluster!.ready;
    const { account_id } = await gateway.store.createAccount({ name: "down", tier: "paid" });
    expect((await gateway.store.grantCredits(account_id, 100_000)).ok).toBe(true);
    const { api_key } = await gateway.store.createApiKey({ account_id });
    const provider = spawnProvider({ wsUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, dataDir } as TestGateway, { id: "down-prov" });
    cleanup.push(() => provider.kill());
    await provider.waitForEvent("welcome", () => true, 30_000);

    const ask = () =>
      fetch(`${gateway.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${api_key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "test-model", max_tokens: 4, messages: [{ role: "user", content: "hi" }] }),
      });
    expect((await ask()).status).toBe(200);
    // Its receipt is judged after the response: the baseline is taken once it has settled and posted.
    await waitFor(async () => (await gateway.store.listSettlements({})).every((s) => s.label !== "pending"), 10_000, "the first request settled");
    gateway.store.flushCommits();
    const settledBefore = (await gateway.store.listSettlements({})).length;
    const balanceBefore = (await gateway.store.ledgerBalances()).map((b) => `${b.account_id}:${b.balance}`).join();

    await redis.kill();
    const refused = await ask();
    expect(refused.status).toBe(503);
    const envelope = (await refused.json()) as { error: { code: string; retryable: boolean; message: string } };
    expect(envelope.error.retryable).toBe(true);
    expect(envelope.error.message).toContain("Redis");
    const health = await fetch(`${gateway.url}/healthz`);
    expect(health.status).toBe(503);
    expect(((await health.json()) as { engines: Record<string, string> }).engines.redis).toBe("down");
    expect(await (await fetch(`${gateway.url}/metrics`)).text()).toContain('gateway_engine_up{engine="redis"} 0');
    gateway.store.flushCommits();
    expect((await gateway.store.listSettlements({})).length).toBe(settledBefore);
    expect((await gateway.store.ledgerBalances()).map((b) => `${b.account_id}:${b.balance}`).join()).toBe(balanceBefore);

    await redis.restart();
    const backAt = performance.now();
    let status = 0;
    while (performance.now() - backAt < 10_000) {
      status = (await ask()).status;
      if (status === 200) break;
      await Bun.sleep(100);
    }
    expect(status).toBe(200);
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    expect(await (await fetch(`${gateway.url}/metrics`)).text()).toContain('gateway_engine_up{engine="redis"} 1');
  }, 120_000);
});
