// A node killed while its attempt's opening is still on its way into PostgreSQL (the cluster chaos's
// splitkill, seed 41115: n4 cut from PostgreSQL, its opening held in the silent connection, n4 killed;
// the survivor that reaped it found no row and resolved the request; the held insert committed after,
// an attempt pending for good with no owner alive). Here the opening waits inside PostgreSQL behind a
// table lock the test holds until the survivor has reaped n1 — or is waiting for n1's opening: the
// survivor marks n1's writer reaped before it reads anything, and that mark waits for the writes of n1
// in flight (docs/scale-out.md, "Fencing"). The late network half is test/store/postgres-reaped-writer.test.ts.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";
import { holdShareLock } from "../support/tableLock.ts";

const MODEL = "late-write-model";

describe.skipIf(clusterMissing !== null)("a dead node's attempt opening that commits late", () => {
  let cluster: TestCluster;
  let side: SQL;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 2, models: [MODEL], leaseMs: 2000 });
    side = new SQL(cluster.databaseUrl, { max: 1 });
  }, 180_000);
  afterAll(async () => {
    await side?.close();
    await cluster?.close();
  });

  const count = async (query: Promise<unknown>) => ((await query) as { n: number }[])[0]!.n;

  test("the survivor waits for it and resolves the attempt: nothing pending, nothing held, the audit clean", async () => {
    const [n1, n2] = cluster.nodes as [TestCluster["nodes"][0], TestCluster["nodes"][0]];
    const apiKey = cluster.paidBuyer("late-write-buyer").api_key;
    cluster.provider({ id: "late-write-prov", gateways: [n2] });
    await cluster.waitRoutable(n1, 1);

    const lock = await holdShareLock(cluster.databaseUrl, "route_snapshots");
    const answer = fetch(`${n1.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "open me late" }] }),
    }).catch(() => null);
    const waiting = (what: string) =>
      count(side`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = ${what} AND query LIKE '%gateway%'`);
    await waitFor(async () => (await waiting("relation")) === 1, 15_000, "n1's opening in flight");
    await n1.kill();
    await answer;

    // n2 reaps n1. Either it resolved the request already (it found no attempt) or its mark waits for
    // n1's opening; then the opening commits.
    await waitFor(
      async () => n2.events.some((e) => e.event === "cluster_node_reaped") || (await waiting("advisory")) === 1,
      15_000,
      "n1 reaped",
    );
    await lock.release();

    const unresolved = async () =>
      (await count(side`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)) +
      (await count(side`SELECT count(*)::int AS n FROM reservations WHERE state = 'held'`));
    await waitFor(async () => (await unresolved()) === 0 && n2.events.some((e) => e.event === "cluster_node_reaped"), 15_000, "n1's request resolved").catch(() => {});
    expect(await side`SELECT label, reason FROM settlements`).toEqual([{ label: "quarantined", reason: "interrupted" }]);
    expect(await side`SELECT state FROM reservations`).toEqual([{ state: "released" }]);
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 120_000);
});
