// Redis restarted empty (it runs without persistence) just as a node died: the dead node's owned set
// (`gw:owned:<id>`, which tells a survivor what to resolve) went with Redis's data, and so did its
// membership, so no survivor ever saw it die. Found by the cluster crash chaos (redis mode, seeds 301
// and 302): its attempts stayed pending and its reservations held for good. The rule (docs/scale-out.md,
// "When Redis loses its data"): the live nodes notice the loss, write their owned sets again, and a
// lease later one of them resolves what the store holds unresolved and no live node owns.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import OpenAI from "openai";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, servingAgain, startCluster, type TestCluster } from "../support/cluster.ts";

const MODEL = "lost-model";
const LEASE_MS = 2000;

describe.skipIf(clusterMissing !== null)("Redis loses its data as a node dies", () => {
  let cluster: TestCluster;
  let sql: SQL;
  let apiKey: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 2, models: [MODEL], leaseMs: LEASE_MS });
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    apiKey = cluster.paidBuyer("lost-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    await sql?.close();
    await cluster?.close();
  });

  test("a survivor resolves the dead node's attempt and reservation", async () => {
    const [n1, n2] = cluster.nodes as [TestCluster["nodes"][0], TestCluster["nodes"][0]];
    cluster.provider({ id: "lost-prov", gateways: [n1], tokensPerSecond: 5 });
    await cluster.waitRoutable(n2, 1);

    // A stream on n2 (its request, its attempt) from the provider on n1; n2 dies mid-stream and Redis
    // restarts empty right after, before anyone could take n2's owned set.
    const client = new OpenAI({ apiKey, baseURL: n2.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "a long one" }] });
    const reading = (async () => {
      try {
        for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) await n2.kill();
      } catch {}
    })();
    await reading;
    await cluster.redis.restart();

    const unresolved = async () =>
      (await sql`SELECT (SELECT count(*)::int FROM settlements WHERE label = 'pending') AS pending, (SELECT count(*)::int FROM reservations WHERE state = 'held') AS held`)[0] as {
        pending: number;
        held: number;
      };
    expect((await unresolved()).held).toBe(1);
    await waitFor(async () => {
      const left = await unresolved();
      return left.pending === 0 && left.held === 0;
    }, 20_000, "the dead node's attempt and reservation resolved").catch(() => {});
    expect(await unresolved()).toEqual({ pending: 0, held: 0 });
    // Nothing charged for an attempt cut mid-relay, and the ledger balances.
    const [row] = await sql`SELECT label, reason FROM settlements`;
    expect(row).toEqual({ label: "quarantined", reason: "interrupted" });
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
    // n1 serves on.
    const onN1 = new OpenAI({ apiKey, baseURL: n1.baseURL, maxRetries: 0 });
    await servingAgain(onN1, MODEL, "n1 serving");
  }, 120_000);
});
