// A reservation whose COMMIT reached PostgreSQL but whose answer never reached the node (the
// connection cut in between) is written all the same: the node answers 503 (the database looked
// unreachable) and must still end the request, or its reservation stays held for good. Found by the
// cluster crash chaos (split mode, 5 nodes, seed 7001: a node's PostgreSQL connections reset).
//
// The probe: the node reaches PostgreSQL through a TCP proxy (test/support/tcpProxy.ts); a trigger
// makes the reservation's insert wait on an advisory lock the test holds; meanwhile the proxy holds
// every byte, the test lets the statement commit (its answer waits), then resets the connections.
// The test cuts once the statement waits on that lock (wait_event 'advisory'), not on a 1.5 s sleep
// and state 'active': a test stalled past the sleep missed it in flight, and PostgreSQL reports a
// Parse message 'active' too, and a cut then can keep its Execute from arriving (land run 03:52: nothing
// committed in 10 s).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

const MODEL = "commit-model";
const RESERVE_GATE = 7001;

describe.skipIf(clusterMissing !== null)("a reservation committed whose answer was lost", () => {
  let cluster: TestCluster;
  let proxy: TcpProxy;
  let sql: SQL;
  let apiKey: string;
  let node: TestCluster["nodes"][0];
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 0, models: [MODEL], leaseMs: 2000 });
    const url = new URL(cluster.databaseUrl);
    proxy = await startTcpProxy(Number(url.port));
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    const proxied = cluster.databaseUrl.replace(`:${url.port}/`, `:${proxy.port}/`);
    node = await cluster.startNode("n1", ["--database-url", proxied]);
    apiKey = cluster.paidBuyer("commit-buyer").api_key;
    cluster.provider({ id: "commit-prov", gateways: [node] });
    await cluster.waitRoutable(node, 1);
    await sql.unsafe(`
      CREATE FUNCTION probe_gated_reserve() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        PERFORM pg_advisory_xact_lock(${RESERVE_GATE});
        RETURN NEW;
      END $$;
      CREATE TRIGGER probe_gated_reserve AFTER INSERT ON reservations FOR EACH ROW EXECUTE FUNCTION probe_gated_reserve();`);
  }, 180_000);
  afterAll(async () => {
    await sql?.close();
    await proxy?.stop();
    await cluster?.close();
  });

  test("the node answers 503 and still ends the request: its reservation resolves", async () => {
    // Held on the one connection of `sql` (max 1) until the answer is held too.
    await sql`SELECT pg_advisory_lock(${RESERVE_GATE})`;
    const answer = fetch(`${node.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "reserve me" }] }),
    });
    // The insert waits in its trigger: hold every byte, let it commit, then cut.
    await waitFor(async () => ((await sql`SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE '%gateway_reserve%' AND state = 'active' AND wait_event = 'advisory' AND pid <> pg_backend_pid()`)[0].n as number) > 0, 10_000, "the reservation in flight");
    await proxy.cut("blackhole");
    await sql`SELECT pg_advisory_unlock(${RESERVE_GATE})`;
    await waitFor(async () => ((await sql`SELECT count(*)::int AS n FROM reservations`)[0].n as number) > 0, 10_000, "the reservation committed");
    await proxy.cut("reset");
    const response = await answer;
    expect(response.status).toBe(503);
    await response.text();
    await proxy.restore();

    const held = async () => (await sql`SELECT count(*)::int AS n FROM reservations WHERE state = 'held'`)[0].n as number;
    await waitFor(async () => (await held()) === 0, 15_000, "the reservation resolved").catch(() => {});
    expect(await held()).toBe(0);
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 120_000);
});
