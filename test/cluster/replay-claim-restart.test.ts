// A retry whose first run was in flight on a node that was then killed and restarted under its own id
// (systemd's Restart=always) must not wait for that run: it can never finish. The node's membership
// lease is held again at once, by the new process, so "is the node alive" is not the question; the
// claim names the process (its incarnation), and the lease names the process holding it. Found by the
// cluster crash chaos (seeds 24006, 24009, 25006, 26003: a retry on a survivor waited 30 s, then ran).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ClusterNode } from "../../src/cluster/node.ts";
import { connectRedis, type ClusterRedis } from "../../src/cluster/redis.ts";
import { redisReplays } from "../../src/cluster/replays.ts";
import { silentLog } from "../../src/log.ts";
import { redisMissing, startRedis, type TestRedis } from "../support/redis.ts";

describe.skipIf(redisMissing !== null)("a replay claim of a node's earlier process", () => {
  let server: TestRedis;
  let redis: ClusterRedis;
  const nodes: ClusterNode[] = [];
  beforeAll(async () => {
    server = await startRedis();
    redis = await connectRedis({ url: server.url, log: silentLog });
  });
  afterAll(async () => {
    for (const n of nodes) await n.stop();
    redis?.close();
    await server?.stop();
  });

  const node = async (nodeId: string) => {
    const n = new ClusterNode({ nodeId, redis, leaseMs: 10_000, log: silentLog, link: null });
    await n.start({ message() {}, nodeDied() {}, linkLost() {}, changed() {}, localViews: () => [], fenced: () => 0, sweepOrphans: async () => {} });
    nodes.push(n);
    return n;
  };
  const backendOf = (nodeId: string, incarnation: string, alive: ClusterNode["alive"]) =>
    redisReplays(redis, { nodeId, incarnation, windowMs: 60_000, inFlightMs: 60_000, nodeAlive: (id, inc) => alive(id, inc) });

  test("counts as nothing on another node and on the restarted node itself; a claim of the live process still holds", async () => {
    // n2's first process claimed a key and a body, then was killed; n2 came back at once as a new process.
    const before = backendOf("n2", "n2-killed-process", async () => true);
    expect(await before.claim("acct\u0000key-1", "fp-1")).toBeNull();
    expect(await before.claim("acct\u0000key-2", "fp-2")).toBeNull();
    before.started("fp-1");
    const n2 = await node("n2");
    const n3 = await node("n3");
    expect(await n3.alive("n2")).toBe(true);
    expect(await n3.alive("n2", n2.incarnation)).toBe(true);
    expect(await n3.alive("n2", "n2-killed-process")).toBe(false);

    // A survivor: the retry runs fresh instead of waiting for the dead run.
    const onN3 = backendOf("n3", n3.incarnation, n3.alive.bind(n3));
    expect(await onN3.latest("fp-1")).toBeNull();
    expect(await onN3.claim("acct\u0000key-1", "fp-1")).toBeNull();
    // The restarted node itself: its predecessor's claim is not its own run.
    const onN2 = backendOf("n2", n2.incarnation, n2.alive.bind(n2));
    expect(await onN2.claim("acct\u0000key-2", "fp-2")).toBeNull();

    // Control: a claim of n2's live process is in flight for everyone else.
    expect(await onN2.claim("acct\u0000key-3", "fp-3")).toBeNull();
    expect(await onN3.claim("acct\u0000key-3", "fp-3")).toEqual({ state: "in_flight", fingerprint: "fp-3" });
    expect(await onN2.claim("acct\u0000key-3", "fp-3")).toEqual({ state: "in_flight", fingerprint: "fp-3" });
  });
});
