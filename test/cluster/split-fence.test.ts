// A live node cut off from Redis (a network split: its process, its provider sockets and its buyers'
// connections all stay up) must not let an account run more requests at once than its limit. Its slots
// live in Redis under a lease it can no longer renew; once they expire, another node admits the
// account's next requests. Found by the cluster crash chaos (split mode): a free-tier account (2 at
// once) had 4 streams open, 2 on the cut-off node and 2 on a survivor. The rule (docs/scale-out.md,
// "Fencing"): a node whose membership went unrenewed for half a lease ends its requests — streams
// in-band — before anyone may take it for dead or stop counting its slots. Its fence is not a stall of
// its process: the heartbeats its providers sent were read, and a silent one is closed on time.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { syntheticPlan } from "../../src/provider/synthetic.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";
import { waitFor } from "../support/harness.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

const LEASE_MS = 2000;
const HELD = "split-held";
const NEXT = "split-next";

/** A prompt whose synthetic answer is long: at 4 tokens/s its stream outlives the test's split. */
function longPrompt(): string {
  for (let i = 0; ; i++) if (syntheticPlan([{ role: "user", content: `hold ${i}` }], 1000).tokens.length >= 40) return `hold ${i}`;
}

interface Held {
  okAt: number;
  endAt: number | null;
  done: boolean;
  error: string | null;
}

describe.skipIf(clusterMissing !== null)("a node split from Redis", () => {
  let cluster: TestCluster;
  let proxy: TcpProxy;
  let apiKey: string;
  let n2: TestCluster["nodes"][0];
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 1, models: [HELD, NEXT], leaseMs: LEASE_MS });
    proxy = await startTcpProxy(cluster.redis.port);
    // n2 reaches Redis only through the proxy (the last --redis-url wins).
    n2 = await cluster.startNode("n2", ["--redis-url", `redis://127.0.0.1:${proxy.port}`]);
    apiKey = (JSON.parse(cluster.cli(["accounts", "create", "--tier", "free", "--name", "split-buyer"]).stdout) as { api_key: string }).api_key;
  }, 180_000);
  afterAll(async () => {
    await proxy?.stop();
    await cluster?.close();
  });

  test("ends its streams before the account's slots stop counting: never more than the limit at once", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    cluster.provider({ id: "split-slow-held", gateways: [n2], models: [HELD], tokensPerSecond: 4 });
    cluster.provider({ id: "split-slow-next", gateways: [n1], models: [NEXT], tokensPerSecond: 4 });
    await cluster.waitRoutable(n2, 2);
    await cluster.waitRoutable(n1, 2);
    const content = longPrompt();

    // The free tier's two slots, both taken by streams on n2.
    const onN2 = new OpenAI({ apiKey, baseURL: n2.baseURL, maxRetries: 0 });
    const held: Held[] = [];
    const reading = [0, 1].map(async () => {
      const stream = await onN2.chat.completions.create({ model: HELD, stream: true, max_tokens: 1000, messages: [{ role: "user", content }] });
      const h: Held = { okAt: performance.now(), endAt: null, done: false, error: null };
      held.push(h);
      try {
        for await (const _ of stream) {
        }
        h.done = true;
      } catch (e) {
        h.error = String((e as { error?: { code?: string } }).error?.code ?? e);
      }
      h.endAt = performance.now();
    });
    while (held.length < 2) await Bun.sleep(20);

    // n2 loses Redis; n1 is asked for the account's next stream until it admits one.
    await proxy.cut("reset");
    const cutAt = performance.now();
    const onN1 = new OpenAI({ apiKey, baseURL: n1.baseURL, maxRetries: 0 });
    let admittedAt: number | null = null;
    let next: AsyncIterable<unknown> | null = null;
    while (admittedAt === null && performance.now() - cutAt < 3 * LEASE_MS) {
      try {
        next = await onN1.chat.completions.create({ model: NEXT, stream: true, max_tokens: 1000, messages: [{ role: "user", content }] });
        admittedAt = performance.now();
      } catch (e) {
        expect((e as { status?: number }).status).toBe(429);
        await Bun.sleep(50);
      }
    }
    // Admitted within a lease or so: the cut-off node's slots expired.
    expect(admittedAt).not.toBeNull();
    // By then both of n2's streams had ended, with the in-band error (never a fake [DONE]).
    await Promise.all(reading);
    for (const h of held) {
      expect(h.endAt!).toBeLessThan(admittedAt!);
      expect(h.done).toBe(false);
      expect(h.error).toContain("provider_disconnected");
    }
    for await (const _ of next!) {
    }

    // Back: n2 serves again without a restart.
    await proxy.restore();
    const back = performance.now();
    for (;;) {
      try {
        await onN2.chat.completions.create({ model: HELD, max_tokens: 3, messages: [{ role: "user", content: "back" }] });
        break;
      } catch (e) {
        if (performance.now() - back > 20_000) throw e;
        await Bun.sleep(100);
      }
    }
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 120_000);

  test("its fence does not restart its providers' heartbeat windows: a silent provider is closed on time", async () => {
    // A node of its own, behind its own Redis proxy, with 2 s heartbeats (a 6 s window): a window
    // restarted at the fence would close the session 6 s after it or later.
    const WINDOW_MS = 3 * 2000;
    const redisProxy = await startTcpProxy(cluster.redis.port);
    try {
      const n3 = await cluster.startNode("n3", ["--redis-url", `redis://127.0.0.1:${redisProxy.port}`, "--heartbeat-interval-ms", "2000"]);
      const provider = cluster.provider({ id: "split-silent", gateways: [n3], models: [HELD] });
      await waitFor(() => n3.events.some((e) => e.event === "provider_admitted" && e.provider_id === "split-silent"), 30_000, "the provider admitted on n3");
      // The provider falls silent; a second later (inside its window) n3 loses Redis and fences itself.
      provider.proc.kill("SIGSTOP");
      await Bun.sleep(1000);
      await redisProxy.cut("reset");
      const fenced = await n3.waitForEvent("cluster_node_fenced", () => true, 10_000);
      const closed = await n3.waitForEvent("provider_session_closed", (e) => e.provider_id === "split-silent", 2 * WINDOW_MS);
      expect(closed.reason).toBe("heartbeat_timeout");
      // Closed a window after the provider's last heartbeat, which came before the fence.
      expect(Date.parse(String(closed.ts)) - Date.parse(String(fenced.ts))).toBeLessThan(WINDOW_MS);
      provider.proc.kill("SIGCONT");
    } finally {
      await redisProxy.stop();
    }
  }, 120_000);
});
