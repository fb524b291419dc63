// A node whose event loop stalls longer than its membership (SIGSTOP of the process, then SIGCONT):
// its own fence check cannot run while it is stopped, and meanwhile the other nodes take it for dead,
// take over what it owned and resolve it. What it must not do when it wakes: relay or deliver answers
// whose attempts a survivor already resolved, or write anything about them (docs/scale-out.md,
// "Fencing"). Here its buyers' stream and one-piece request run on its own provider session.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import OpenAI from "openai";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, servingAgain, startCluster, type TestCluster } from "../support/cluster.ts";

const MODEL = "stall-model";
const LEASE_MS = 2000;

describe.skipIf(clusterMissing !== null)("a node stalled longer than its membership", () => {
  let cluster: TestCluster;
  let sql: SQL;
  let apiKey: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 3, models: [MODEL], leaseMs: LEASE_MS, extraArgs: ["--pending-deadline-ms", "3000"] });
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    apiKey = cluster.paidBuyer("stall-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    for (const n of cluster?.nodes ?? []) n.proc.kill("SIGCONT");
    await sql?.close();
    await cluster?.close();
  });

  test("wakes fenced: what a survivor resolved is neither relayed nor written, and the audit is clean", async () => {
    const [n1, n2] = cluster.nodes as [TestCluster["nodes"][0], TestCluster["nodes"][0]];
    cluster.provider({ id: "stall-prov", gateways: [n1, n2], maxConcurrency: 4, tokensPerSecond: 8 });
    await cluster.waitRoutable(n1, 1);
    const client = new OpenAI({ apiKey, baseURL: n1.baseURL, maxRetries: 0, timeout: 60_000 });

    // A stream and a one-piece request, both in flight on n1 from its own provider session.
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "a long one" }] });
    let stoppedAt = 0;
    let wokenAt = 0;
    const stalled = { before: "", after: "", finished: false, error: "" };
    const reading = (async () => {
      try {
        for await (const chunk of stream) {
          const delta = chunk.choices[0]?.delta?.content ?? "";
          if (wokenAt === 0) stalled.before += delta;
          else stalled.after += delta;
        }
        stalled.finished = true;
      } catch (e) {
        stalled.error = String((e as { error?: { code?: string } }).error?.code ?? e);
      }
    })();
    const whole = client.chat.completions
      .create({ model: MODEL, max_tokens: 60, messages: [{ role: "user", content: "in one piece" }] })
      .then((r) => ({ status: 200, content: r.choices[0]?.message.content ?? "" }))
      .catch((e) => ({ status: (e as { status?: number }).status ?? 0, content: String((e as { error?: { code?: string } }).error?.code ?? e) }));
    await waitFor(() => stalled.before.length > 10, 10_000, "the stream under way");

    // Both attempts are n1's process's to write (its incarnation, docs/scale-out.md "Fencing").
    await waitFor(async () => ((await sql`SELECT count(*)::int AS n FROM settlements`)[0] as { n: number }).n === 2, 10_000, "both attempts open");
    const owners = ((await sql`SELECT DISTINCT owner FROM settlements`) as { owner: string | null }[]).map((r) => r.owner);
    expect(owners).toHaveLength(1);
    expect(owners[0]).toBeString();

    // n1 stops for two leases: the others see it die and resolve what it owned.
    n1.proc.kill("SIGSTOP");
    stoppedAt = performance.now();
    await waitFor(
      async () => ((await sql`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)[0] as { n: number }).n === 0,
      4 * LEASE_MS,
      "n1's attempts resolved by a survivor",
    );
    const resolved = (await sql`SELECT request_id, attempt_n, label, reason, billed_completion_tokens FROM settlements ORDER BY request_id, attempt_n`) as Record<string, unknown>[];
    // The survivor claimed them before it resolved them: n1's writes of them are refused from then on.
    expect(((await sql`SELECT count(*)::int AS n FROM settlements WHERE owner = ${owners[0]!}`)[0] as { n: number }).n).toBe(0);
    await Bun.sleep(Math.max(0, 2 * LEASE_MS - (performance.now() - stoppedAt)));
    n1.proc.kill("SIGCONT");
    wokenAt = performance.now();

    await reading;
    const answered = await whole;
    // The survivor's resolution stands: nothing written about those attempts since.
    expect((await sql`SELECT request_id, attempt_n, label, reason, billed_completion_tokens FROM settlements ORDER BY request_id, attempt_n`) as Record<string, unknown>[]).toEqual(resolved);
    // The woken node relayed nothing more of a stream whose attempt was resolved, and ended it in-band.
    expect(stalled.finished).toBe(false);
    expect(stalled.error).toContain("provider_disconnected");
    expect(stalled.after).toBe("");
    // The one-piece request was not answered with content nobody is billed for: a retryable refusal.
    expect(answered.status).toBe(503);
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
    // And n1 serves again.
    await servingAgain(client, MODEL, "n1 serving again");
  }, 120_000);

  test("keeps its providers' sessions on waking: its own stall is not their silence", async () => {
    const n3 = cluster.nodes[2]!;
    const provider = cluster.provider({ id: "kept-prov", gateways: [n3], models: [MODEL] });
    await waitFor(() => n3.events.some((e) => e.event === "provider_admitted" && e.provider_id === "kept-prov"), 30_000, "the provider admitted on n3");
    const welcomes = () => provider.events.filter((e) => e.event === "welcome").length;
    await waitFor(() => welcomes() === 1, 10_000, "the provider welcomed");
    // n3 stopped for two leases, past the heartbeat window (3 × 500 ms). The provider is stopped first
    // and woken only once n3 fenced itself: no heartbeat waits in the socket when n3 wakes (one read
    // before the overdue watchdog would hide the stall at random), as none can from a provider whose
    // heartbeats were lost on the way.
    provider.proc.kill("SIGSTOP");
    n3.proc.kill("SIGSTOP");
    await Bun.sleep(2 * LEASE_MS);
    n3.proc.kill("SIGCONT");
    await waitFor(() => n3.events.some((e) => e.event === "cluster_node_fenced"), 10_000, "n3 fenced on waking");
    provider.proc.kill("SIGCONT");
    // Many turns after its overdue timers ran: it renewed its lease and serves again.
    await servingAgain(new OpenAI({ apiKey, baseURL: n3.baseURL, maxRetries: 0, timeout: 10_000 }), MODEL, "n3 serving again");
    const closed = n3.events.filter((e) => e.event === "provider_session_closed" && e.provider_id === "kept-prov");
    expect(closed.map((e) => e.reason)).toEqual([]);
    expect(welcomes()).toBe(1);
  }, 120_000);
});
