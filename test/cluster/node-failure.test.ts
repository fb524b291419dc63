// Issue 22's node failures, each a real `kill -9` of a `gateway serve` node mid-stream:
// - the node holding the provider's socket: the buyer (on another node) gets an in-band error, never a
//   fake [DONE]; the provider reconnects to a surviving node; the next request is served within the
//   lease; the slots are freed and the ledger audit is clean;
// - the buyer's node: the provider's job is cancelled within the lease time.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { RedisClient } from "bun";
import { clusterMissing } from "../support/cluster.ts";
import { startCluster, type TestCluster } from "../support/cluster.ts";

const MODEL = "failure-model";
const LEASE_MS = 2000;

describe.skipIf(clusterMissing !== null)("kill -9 of a cluster node mid-stream", () => {
  let cluster: TestCluster;
  let apiKey: string;
  let accountId: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 4, models: [MODEL], leaseMs: LEASE_MS, extraArgs: ["--pending-deadline-ms", "3000"] });
    ({ account_id: accountId, api_key: apiKey } = cluster.paidBuyer("failure-buyer"));
  }, 180_000);
  afterAll(async () => {
    await cluster?.close();
  });

  test("the provider's node dies: in-band error, provider moves, next request served, slots freed, audit clean", async () => {
    const [n1, n2, n3] = cluster.nodes as [typeof cluster.nodes[0], typeof cluster.nodes[0], typeof cluster.nodes[0]];
    const provider = cluster.provider({ id: "prov-moving", gateways: [n1, n2], maxConcurrency: 1, tokensPerSecond: 20 });
    await provider.waitForEvent("welcome", () => true, 15_000);
    await cluster.waitRoutable(n3, 1);
    const client = new OpenAI({ apiKey, baseURL: n3.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "a long one" }] });
    let text = "";
    let error: unknown = null;
    let finished = false;
    try {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        if (text.length > 10 && n1.proc.exitCode === null && n1.proc.signalCode === null) void n1.kill();
      }
      finished = true;
    } catch (e) {
      error = e;
    }
    expect(finished).toBe(false);
    expect(text.length).toBeGreaterThan(10);
    expect(String((error as { error?: { code?: string } })?.error?.code ?? error)).toContain("provider_disconnected");

    // The provider reconnects to node 2, and node 3 routes there: served within the lease.
    const killedAt = performance.now();
    await provider.waitForEvent("welcome", (e) => e !== provider.events.find((x) => x.event === "welcome"), 10_000);
    const next = await (async () => {
      for (;;) {
        try {
          return await client.chat.completions.create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "next" }] });
        } catch (e) {
          if (performance.now() - killedAt > 10_000) throw e;
          await Bun.sleep(100);
        }
      }
    })();
    expect(next.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(performance.now() - killedAt).toBeLessThan(10_000);

    // No slot of the account is held any more, on Redis's count. A node frees a slot with a command it
    // sends as the response ends, without waiting for Redis: allow that command its flight, well inside
    // one lease (the backstop this must not be confused with).
    const redis = new RedisClient(cluster.redis.url);
    await redis.connect();
    const releasedBy = performance.now() + Math.min(1000, LEASE_MS / 4);
    let held = await redis.send("ZCARD", [`gw:slots:${accountId}`]);
    while (held !== 0 && performance.now() < releasedBy) {
      await Bun.sleep(20);
      held = await redis.send("ZCARD", [`gw:slots:${accountId}`]);
    }
    expect(held).toBe(0);
    redis.close();

    // Every attempt resolves (the cut one within the pending deadline), and the audit is clean.
    const deadline = performance.now() + 15_000;
    for (;;) {
      const rows = cluster.cli(["receipts", "list", "--json"]).stdout.trim().split("\n").filter(Boolean).map((l) => JSON.parse(l) as { label: string });
      if (rows.length >= 2 && rows.every((r) => r.label !== "pending")) break;
      if (performance.now() > deadline) throw new Error(`still pending: ${JSON.stringify(rows)}`);
      await Bun.sleep(200);
    }
    const audit = cluster.cli(["ledger", "audit"]);
    expect(JSON.parse(audit.stdout).clean).toBe(true);
    await provider.kill();
  }, 90_000);

  test("the buyer's node dies: the provider's job is cancelled within the lease", async () => {
    const [, n2, , n4] = cluster.nodes as [typeof cluster.nodes[0], typeof cluster.nodes[0], typeof cluster.nodes[0], typeof cluster.nodes[0]];
    const provider = cluster.provider({ id: "prov-staying", gateways: [n2], maxConcurrency: 1, tokensPerSecond: 4 });
    await provider.waitForEvent("welcome", () => true, 15_000);
    await cluster.waitRoutable(n4, 1);
    const client = new OpenAI({ apiKey, baseURL: n4.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "cut me off" }] });
    let killedAt = 0;
    try {
      for await (const chunk of stream) {
        if ((chunk.choices[0]?.delta?.content ?? "").length > 0 && killedAt === 0) {
          killedAt = performance.now();
          await n4.kill();
        }
      }
    } catch {}
    expect(killedAt).toBeGreaterThan(0);
    const cancel = await provider.waitForEvent("cancel_received", () => true, LEASE_MS + 3000);
    expect(cancel).toBeDefined();
    expect(performance.now() - killedAt).toBeLessThan(LEASE_MS + 500);
  }, 120_000);
});
