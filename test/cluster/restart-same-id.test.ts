// A node killed with -9 and restarted at once under its own id (systemd's Restart=always with
// GATEWAY_NODE_ID=%i, docs/scale-out.md) takes its membership lease again before it lapses, so no
// survivor sees it die. Found by the cluster crash chaos (`bun run chaos --cluster`, seed 22002):
// survivors' buyers streaming from its providers hung, and its pending settlements and reservations
// stayed unresolved. With the default lease (10 s), both must still resolve well inside it:
// - buyers on another node get the in-band `provider_disconnected` (the survivors notice the new
//   incarnation in its first registry broadcast);
// - the new process resolves what its predecessor owned (an attempt cut mid-relay) and the request's
//   reservation, within the pending deadline.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { clusterMissing, startCluster, type ClusterNodeProcess, type TestCluster } from "../support/cluster.ts";

const MODEL = "restart-model";
const LEASE_MS = 10_000; // the default: its membership outlives a quick restart by far
const PENDING_DEADLINE_MS = 3000;

describe.skipIf(clusterMissing !== null)("kill -9 and an immediate restart under the same node id", () => {
  let cluster: TestCluster;
  let apiKey: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 3, models: [MODEL], leaseMs: LEASE_MS, extraArgs: ["--pending-deadline-ms", String(PENDING_DEADLINE_MS)] });
    apiKey = cluster.paidBuyer("restart-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    await cluster?.close();
  });

  /** Streams from `node` until some text arrived, then kills `victim` and starts it again under its id. */
  async function streamAcrossRestart(node: ClusterNodeProcess, victim: ClusterNodeProcess, endWithinMs: number) {
    const abort = new AbortController();
    const client = new OpenAI({ apiKey, baseURL: node.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "a long one" }] }, { signal: abort.signal });
    let text = "";
    let killedAt = 0;
    let restarted: Promise<ClusterNodeProcess> | null = null;
    let error: unknown = null;
    try {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        if (text.length > 10 && killedAt === 0) {
          killedAt = performance.now();
          await victim.kill();
          restarted = cluster.startNode(victim.name);
          // Without the fix nothing ends this stream: give up after the bound, well inside the lease.
          setTimeout(() => abort.abort(), endWithinMs).unref?.();
        }
      }
    } catch (e) {
      error = e;
    }
    return { text, error, endedAfterMs: performance.now() - killedAt, restarted: await restarted! };
  }

  test("buyers on another node streaming from its provider get the in-band error inside the lease", async () => {
    const [n1, n2] = cluster.nodes as [ClusterNodeProcess, ClusterNodeProcess];
    const provider = cluster.provider({ id: "prov-on-restarted", gateways: [n1, n2], maxConcurrency: 1, tokensPerSecond: 20 });
    await provider.waitForEvent("welcome", () => true, 15_000);
    await cluster.waitRoutable(n2, 1);
    const { text, error, endedAfterMs, restarted } = await streamAcrossRestart(n2, n1, 8000);
    cluster.nodes[0] = restarted;
    expect(text.length).toBeGreaterThan(10);
    expect(String((error as { error?: { code?: string } })?.error?.code ?? error)).toContain("provider_disconnected");
    expect(endedAfterMs).toBeLessThan(8000);
    expect(restarted.events.some((e) => e.event === "cluster_joined")).toBe(true);
    await provider.kill();
  }, 90_000);

  test("the restarted process resolves what its predecessor owned: the cut attempt and its reservation", async () => {
    const [, , n3] = cluster.nodes as [ClusterNodeProcess, ClusterNodeProcess, ClusterNodeProcess];
    const n2 = cluster.nodes[1]!;
    const provider = cluster.provider({ id: "prov-on-survivor", gateways: [n2], maxConcurrency: 1, tokensPerSecond: 20 });
    await provider.waitForEvent("welcome", () => true, 15_000);
    await cluster.waitRoutable(n3, 1);
    const { restarted } = await streamAcrossRestart(n3, n3, 1);
    cluster.nodes[2] = restarted;
    const sql = new Bun.SQL(cluster.databaseUrl, { max: 1 });
    try {
      // The attempt was owned by the killed process; nothing but its successor can resolve it now.
      const deadline = performance.now() + PENDING_DEADLINE_MS + 3000;
      let pending = -1;
      let held = -1;
      while (performance.now() < deadline) {
        pending = Number((await sql`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)[0].n);
        held = Number((await sql`SELECT count(*)::int AS n FROM reservations WHERE state = 'held'`)[0].n);
        if (pending === 0 && held === 0) break;
        await Bun.sleep(100);
      }
      expect({ pending, held }).toEqual({ pending: 0, held: 0 });
      const cut = await sql`SELECT label FROM settlements WHERE provider_id = 'prov-on-survivor'`;
      expect(cut.length).toBe(1);
    } finally {
      await sql.close();
    }
    expect(JSON.parse(cluster.cli(["ledger", "audit"]).stdout).clean).toBe(true);
    await provider.kill();
  }, 90_000);
});
