// A dead node's late opening where no owned set names its writer (docs/scale-out.md, "Fencing"): the
// node dies while Redis loses its data (the survivors never see it die; a lease later one sweeps what
// no live node owns), or the whole cluster stops and a node starts cold (it resumes every pending row).
// Before migration 13 neither marked the dead writer: the opening, still on its way into PostgreSQL,
// committed after its request was resolved — an attempt pending for good. Here the opening waits inside
// PostgreSQL behind a table lock the test holds until the sweep (or the cold start) has resolved the
// request, or is waiting for the opening: it marks every registered writer not alive first, and that
// mark waits for the writes in flight. The held-in-the-network half is test/store/postgres-reaped-writer.test.ts.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";
import { holdShareLock } from "../support/tableLock.ts";

const MODEL = "unmarked-model";
type Node = TestCluster["nodes"][0];

describe.skipIf(clusterMissing !== null)("a dead node's opening in flight that no owned set names", () => {
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
  const waiting = (what: string) =>
    count(side`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = ${what} AND query LIKE '%gateway%'`);
  /** Sends a request to `node`; resolves once its attempt's opening waits inside PostgreSQL behind the lock. */
  const held = async (node: Node, apiKey: string) => {
    const lock = await holdShareLock(cluster.databaseUrl, "route_snapshots");
    const answer = fetch(`${node.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "open me late" }] }),
    }).catch(() => null);
    await waitFor(async () => (await waiting("relation")) === 1, 15_000, "the opening in flight");
    return { lock, answer };
  };
  /** Nothing pending, nothing held: each late opening was resolved (`attempts` in all), the audit clean. */
  const resolved = async (attempts: number) => {
    const unresolved = async () =>
      (await count(side`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)) +
      (await count(side`SELECT count(*)::int AS n FROM reservations WHERE state = 'held'`));
    await waitFor(async () => (await unresolved()) === 0, 15_000, "the request resolved").catch(() => {});
    expect(await side`SELECT label, reason FROM settlements`).toEqual(Array(attempts).fill({ label: "quarantined", reason: "interrupted" }));
    expect(await side`SELECT state FROM reservations`).toEqual(Array(attempts).fill({ state: "released" }));
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  };

  test("a node dies as Redis loses its data: the sweep a lease later marks its writer first, and resolves the opening", async () => {
    const [n1, n2] = cluster.nodes as [Node, Node];
    cluster.provider({ id: "unmarked-prov", gateways: [n2] });
    await cluster.waitRoutable(n1, 1);
    const { lock, answer } = await held(n1, cluster.paidBuyer("unmarked-buyer").api_key);
    // n1 dies and Redis restarts empty before n2 could see it die: no owned set names n1's writer.
    await n1.kill();
    await answer;
    await cluster.redis.restart();

    // A lease later n2 sweeps: it resolved the request already (it saw no attempt), or its mark of n1's
    // writer waits for the opening.
    const swept = () => n2.events.some((e) => e.event === "cluster_node_reaped");
    await waitFor(async () => swept() || (await waiting("advisory")) === 1, 15_000, "n2's sweep");
    await lock.release();
    await waitFor(async () => swept(), 15_000, "n2's sweep done").catch(() => {});
    await resolved(1);
  }, 120_000);

  test("the whole cluster stops: the new first node marks every other writer before it resumes, and resolves the opening", async () => {
    const n2 = cluster.nodes[1]!;
    const { lock, answer } = await held(n2, cluster.paidBuyer("cold-buyer").api_key);
    await n2.kill();
    await answer;

    // n2 starts again, the only node (n1 died above): a cold start, which resumes every pending row. It
    // joined already (it saw no attempt), or its mark of the previous process's writer waits for the opening.
    let joined = false;
    const restarted = cluster.startNode("n2").then(() => {
      joined = true;
    });
    await waitFor(async () => joined || (await waiting("advisory")) === 1, 30_000, "the cold start");
    await lock.release();
    await restarted;
    await resolved(2);
  }, 120_000);
});
