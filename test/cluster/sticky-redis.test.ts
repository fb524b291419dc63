// Sticky pins in a cluster live in Redis (src/cluster/sticky.ts): a pin written through one node is
// read through another, a read restarts the idle TTL, a purge through any node clears the account's
// pins everywhere, and an unreachable Redis reads as "no pin" (stickiness never fails a request).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { connectRedis, type ClusterRedis } from "../../src/cluster/redis.ts";
import { redisStickyMap } from "../../src/cluster/sticky.ts";
import { silentLog } from "../../src/log.ts";
import { redisMissing, startRedis, type TestRedis } from "../support/redis.ts";

const TTL_MS = 60_000;

describe.skipIf(redisMissing !== null)("sticky pins shared through Redis", () => {
  let redis: TestRedis;
  let nodeA: ClusterRedis;
  let nodeB: ClusterRedis;
  beforeAll(async () => {
    redis = await startRedis();
    nodeA = await connectRedis({ url: redis.url, log: silentLog, commandTimeoutMs: 300, probeMs: 100 });
    nodeB = await connectRedis({ url: redis.url, log: silentLog, commandTimeoutMs: 300, probeMs: 100 });
  });
  afterAll(async () => {
    nodeA?.close();
    nodeB?.close();
    await redis?.stop();
  });

  test("a pin written through one node is read through another, and a read restarts its idle TTL", async () => {
    const a = redisStickyMap(nodeA, { idleTtlMs: TTL_MS });
    const b = redisStickyMap(nodeB, { idleTtlMs: TTL_MS });
    expect(await b.get("conv-1", 0)).toBeNull();
    await a.set("conv-1", "acct-1", "prov-x", 0);
    expect(await b.get("conv-1", 0)).toBe("prov-x");
    // Re-pinning moves the conversation for every node.
    await b.set("conv-1", "acct-1", "prov-y", 0);
    expect(await a.get("conv-1", 0)).toBe("prov-y");

    // Redis's own clock runs the TTL: shorten it by hand, then a read must put it back to the full TTL.
    expect((await nodeA.call("PEXPIRE", ["gw:sticky:conv-1", 1_000])).ok).toBe(true);
    const shortened = await nodeA.call<number>("PTTL", ["gw:sticky:conv-1"]);
    expect(shortened.ok && shortened.value <= 1_000).toBe(true);
    expect(await b.get("conv-1", 0)).toBe("prov-y");
    const refreshed = await nodeA.call<number>("PTTL", ["gw:sticky:conv-1"]);
    expect(refreshed.ok && refreshed.value > TTL_MS - 5_000).toBe(true);
  });

  test("a purge through any node drops the account's live pins everywhere and counts them", async () => {
    const a = redisStickyMap(nodeA, { idleTtlMs: TTL_MS });
    const b = redisStickyMap(nodeB, { idleTtlMs: TTL_MS });
    await a.set("p-1", "acct-purge", "prov-x", 0);
    await b.set("p-2", "acct-purge", "prov-y", 0);
    await a.set("p-other", "acct-keep", "prov-x", 0);
    // An entry that expired on its own is not counted.
    await a.set("p-3", "acct-purge", "prov-z", 0);
    expect((await nodeA.call("DEL", ["gw:sticky:p-3"])).ok).toBe(true);

    expect(await b.purgeAccount("acct-purge", 0)).toBe(2);
    expect(await a.get("p-1", 0)).toBeNull();
    expect(await a.get("p-2", 0)).toBeNull();
    expect(await b.get("p-other", 0)).toBe("prov-x");
    expect(await a.purgeAccount("acct-purge", 0)).toBe(0);
  });

  test("with Redis unreachable a lookup reads as no pin, and a write fails (the caller logs it)", async () => {
    const a = redisStickyMap(nodeA, { idleTtlMs: TTL_MS });
    await a.set("down-1", "acct-down", "prov-x", 0);
    await redis.kill();
    try {
      expect(await a.get("down-1", 0)).toBeNull();
      await expect(a.set("down-2", "acct-down", "prov-x", 0)).rejects.toThrow("sticky pin not written");
    } finally {
      await redis.restart();
    }
  });
});
