// A node that restarts into an empty Redis (it runs without persistence, and restarted too) before the
// live nodes re-announced themselves sees no other member. Taking that for a cold start of the whole
// cluster, it resumed every pending settlement of the store, which quarantined the live nodes'
// attempts still relaying as `interrupted`: never a double charge, but their answers went unbilled.
// The rule (docs/scale-out.md, "When Redis loses its data"): a node that finds Redis's data fresh does
// not trust an empty member set; it resolves what nobody owns a lease later, as after a data loss.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import OpenAI from "openai";
import { syntheticPlan } from "../../src/provider/synthetic.ts";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, servingAgain, startCluster, type TestCluster } from "../support/cluster.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

const MODEL = "empty-redis-model";
// n2 is cut from Redis while n1 restarts: well under the half lease at which it would fence itself.
const LEASE_MS = 10_000;

/** A prompt whose synthetic answer is long: at 6 tokens/s its stream outlives n1's restart by seconds. */
function longPrompt(): string {
  for (let i = 0; ; i++) if (syntheticPlan([{ role: "user", content: `long ${i}` }], 1000).tokens.length >= 44) return `long ${i}`;
}

describe.skipIf(clusterMissing !== null)("a node restarting into an empty Redis while another lives", () => {
  let cluster: TestCluster;
  let proxy: TcpProxy;
  let sql: SQL;
  let apiKey: string;
  let n2: TestCluster["nodes"][0];
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 1, models: [MODEL], leaseMs: LEASE_MS, extraArgs: ["--pending-deadline-ms", "3000"] });
    proxy = await startTcpProxy(cluster.redis.port);
    // n2 reaches Redis only through the proxy (the last --redis-url wins).
    n2 = await cluster.startNode("n2", ["--redis-url", `redis://127.0.0.1:${proxy.port}`]);
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    apiKey = cluster.paidBuyer("empty-redis-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    await sql?.close();
    await proxy?.stop();
    await cluster?.close();
  });

  test("leaves the live node's attempt to it: the answer is billed, the audit clean", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    cluster.provider({ id: "empty-redis-prov", gateways: [n2], tokensPerSecond: 6 });
    await cluster.waitRoutable(n2, 1);
    const client = new OpenAI({ apiKey, baseURL: n2.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 1000, messages: [{ role: "user", content: longPrompt() }] });
    let text = "";
    let finished = false;
    const { promise: started, resolve: underway } = Promise.withResolvers<void>();
    const reading = (async () => {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        if (text.length > 0) underway();
      }
      finished = true;
    })();
    await started;

    // n2 loses Redis for a moment; meanwhile n1 dies, Redis restarts empty and n1 starts again into it.
    await proxy.cut("reset");
    await cluster.nodes[0]!.kill();
    await cluster.redis.restart();
    const restarted = await cluster.startNode("n1");
    await proxy.restore();

    await reading;
    expect(finished).toBe(true);
    // The live node's attempt was billed by it (a receipt-verified answer), not quarantined by n1.
    await waitFor(async () => ((await sql`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)[0] as { n: number }).n === 0, 15_000, "settled");
    const rows = (await sql`SELECT label, reason, billed_completion_tokens::int AS billed FROM settlements`) as { label: string; reason: string | null; billed: number }[];
    expect(rows).toHaveLength(1);
    expect(rows[0]!.label).not.toBe("quarantined");
    expect(rows[0]!.billed).toBeGreaterThan(0);
    expect(((await sql`SELECT count(*)::int AS n FROM reservations WHERE state = 'held'`)[0] as { n: number }).n).toBe(0);
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
    // Both nodes serve on.
    for (const node of [restarted, n2]) {
      const c = new OpenAI({ apiKey, baseURL: node.baseURL, maxRetries: 0 });
      await servingAgain(c, MODEL, `${node.name} serving`);
    }
    void n1;
  }, 120_000);
});
