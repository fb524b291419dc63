// A concurrency slot's ACQUIRE that the node gave up on (Redis silent past the command timeout: the
// buyer got 503) must never leave a slot counted in Redis. Two ways it could (the cluster chaos's
// seed 7002, 5 nodes, Redis held silent 5.2 s): the command waited in the silent connection and ran
// when the bytes flowed again, or it ran at once and only its answer was held. Real Redis behind a
// TCP proxy that holds the bytes, then lets them go.
import { afterAll, describe, expect, test } from "bun:test";
import { RedisClient } from "bun";
import { connectRedis, type ClusterRedis } from "../../src/cluster/redis.ts";
import { sharedSlots, type SharedSlots } from "../../src/cluster/slots.ts";
import { silentLog } from "../../src/log.ts";
import { waitFor } from "../support/harness.ts";
import { redisMissing, startRedis, type TestRedis } from "../support/redis.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

const LEASE_MS = 10_000;
const OWNED = "gw:owned:late-node";

/** How many scripts (EVAL) Redis has run: only the node's slot scripts, in these tests. */
async function scriptsRun(direct: RedisClient): Promise<number> {
  const stats = String(await direct.send("INFO", ["commandstats"]));
  return Number(/cmdstat_eval:calls=(\d+)/.exec(stats)?.[1] ?? 0);
}

describe.skipIf(redisMissing !== null)("an ACQUIRE the node gave up on", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  async function setup(): Promise<{ server: TestRedis; proxy: TcpProxy; redis: ClusterRedis; slots: SharedSlots; direct: RedisClient }> {
    const server = await startRedis();
    cleanup.push(() => server.stop());
    const proxy = await startTcpProxy(server.port);
    cleanup.push(() => proxy.stop());
    const redis = await connectRedis({ url: `redis://127.0.0.1:${proxy.port}`, log: silentLog, commandTimeoutMs: 1000, probeMs: 100 });
    cleanup.push(() => redis.close());
    const slots = sharedSlots(redis, LEASE_MS, { key: OWNED, writerMember: "w:late-node" });
    cleanup.push(() => slots.stop());
    const direct = new RedisClient(server.url);
    await direct.connect();
    cleanup.push(() => direct.close());
    // Connected, and Redis's clock read (on a loaded machine the first connect may take a probe more).
    await waitFor(() => redis.up && redis.commandDeadline() !== null, 10_000, "the node's Redis connected");
    // The pair of slots works before the cut.
    expect(await slots.acquire("acct", "before", 2)).toEqual({ ok: true, in_use: 1 });
    slots.release("before");
    await waitFor(async () => (await direct.send("ZCARD", ["gw:slots:acct"])) === 0, 2000, "the first slot released");
    return { server, proxy, redis, slots, direct };
  }

  test("held in a silent connection and delivered after the 503: never counted", async () => {
    const { proxy, redis, slots, direct } = await setup();
    const ranBefore = await scriptsRun(direct);
    await proxy.cut("blackhole");
    expect(await slots.acquire("acct", "late", 2)).toEqual({ ok: false, code: "engine_unavailable", in_use: 0 });
    expect(await scriptsRun(direct)).toBe(ranBefore);
    await proxy.restore();
    // The silent connection delivers what it held: the ACQUIRE runs now, after the node's 503.
    await waitFor(async () => (await scriptsRun(direct)) > ranBefore, 5000, "the held ACQUIRE run");
    expect(await direct.send("ZSCORE", ["gw:slots:acct", "late"])).toBeNull();
    expect(await direct.send("SISMEMBER", [OWNED, "r:late"])).toBe(0);
    await waitFor(() => redis.up, 10_000, "the node's Redis back");
    expect(await slots.inUse("acct")).toBe(0);
    // The account has both its slots, not one.
    expect((await slots.acquire("acct", "next-1", 2)).ok).toBe(true);
    expect((await slots.acquire("acct", "next-2", 2)).ok).toBe(true);
  }, 20_000);

  test("run at once, its answer lost: removed once Redis answers again", async () => {
    const { proxy, redis, slots, direct } = await setup();
    await proxy.cut("replies");
    expect(await slots.acquire("acct", "unanswered", 2)).toEqual({ ok: false, code: "engine_unavailable", in_use: 0 });
    // It ran: the slot counts, and nobody holds it.
    expect(await direct.send("ZSCORE", ["gw:slots:acct", "unanswered"])).not.toBeNull();
    await proxy.restore();
    await waitFor(() => redis.up, 10_000, "the node's Redis back");
    // Well within the lease (10 s), which is all that would free it otherwise.
    await waitFor(async () => (await direct.send("ZSCORE", ["gw:slots:acct", "unanswered"])) === null, 1500, "the unanswered slot removed");
    expect(await direct.send("SISMEMBER", [OWNED, "r:unanswered"])).toBe(0);
    expect((await slots.acquire("acct", "next-1", 2)).ok).toBe(true);
    expect((await slots.acquire("acct", "next-2", 2)).ok).toBe(true);
  }, 20_000);
});
