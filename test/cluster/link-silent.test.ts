// A node link held silent between two live nodes (docs/scale-out.md, "Node links"): a blackholed path
// keeps TCP open and moves no byte, no reset either, so nothing closes. Before link heartbeats a stream
// across it stalled until its buyer gave up (the cluster chaos's `links` mode, held silent for 3–6 s).
// Now each end drops the link once nothing arrived on it for a lease (pings every fifth of one) and
// tells the other over Redis, and the outcomes are those of a link that closed
// (test/cluster/link-lost.test.ts): the stream ends in-band with `provider_disconnected`, a request
// with nothing sent yet fails over, and the link is made again once the path flows.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { clusterMissing, type TestCluster } from "../support/cluster.ts";
import { waitFor } from "../support/harness.ts";
import { askOnce, longPrompt, startLinkSplit, twoProviders } from "../support/linkSplit.ts";
import type { TcpProxy } from "../support/tcpProxy.ts";

const MODEL = "silent-model";
const FAILOVER = "silent-failover";
/** The cluster's lease (support/cluster.ts's default): a link silent this long is dropped. */
const LEASE_MS = 2000;

describe.skipIf(clusterMissing !== null)("a node link held silent between two live nodes", () => {
  let cluster: TestCluster;
  let proxy: TcpProxy;
  let buyerNode: TestCluster["nodes"][0];
  let apiKey: string;
  beforeAll(async () => {
    ({ cluster, proxy, buyerNode, apiKey } = await startLinkSplit([MODEL, FAILOVER], "silent-buyer"));
  }, 180_000);
  afterAll(async () => {
    await proxy?.stop();
    await cluster?.close();
  });
  /** n1's link to n2 is open (the last of its link events about n2 is an open). */
  const linkOpen = () =>
    cluster.nodes[0]!.events.filter((e) => e.peer === "n2" && ["cluster_link_open", "cluster_link_closed", "cluster_link_silent", "cluster_link_unreachable"].includes(String(e.event))).at(-1)?.event === "cluster_link_open";

  test("a stream across it ends in-band within about a lease, and the link is made again once it flows", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    const provider = cluster.provider({ id: "silent-prov", gateways: [n1], models: [MODEL], tokensPerSecond: 20 });
    await cluster.waitRoutable(buyerNode, 1);
    await waitFor(linkOpen, 10_000, "n1's link to n2 open");
    const { content, answer } = longPrompt("silent");
    const silentOnN2 = () => buyerNode.events.filter((e) => e.event === "cluster_link_silent").length;
    const silentBefore = silentOnN2();

    const client = new OpenAI({ apiKey, baseURL: buyerNode.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 1000, messages: [{ role: "user", content }] });
    let text = "";
    let chunks = 0;
    let error: unknown = null;
    let done = false;
    let cutAt = 0;
    try {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        // The rest of the answer, its end included, goes into the silent link: no close, no reset.
        if (++chunks === 3) {
          await proxy.cut("blackhole");
          cutAt = performance.now();
        }
      }
      done = true;
    } catch (e) {
      error = e;
    }
    const endedAfter = performance.now() - cutAt;
    expect(done).toBe(false);
    expect(String((error as { error?: { code?: string } })?.error?.code ?? error)).toContain("provider_disconnected");
    // Dropped once a lease passed without a byte (checked every fifth of one): not before a lease less
    // one ping interval, and long before the stream's idle timeout (a minute). Generous above: a loaded machine.
    expect(endedAfter).toBeGreaterThanOrEqual(LEASE_MS * 0.8 - 100);
    expect(endedAfter).toBeLessThan(LEASE_MS * 6);
    expect(answer.startsWith(text)).toBe(true);
    // n2 dropped it (its own check, or n1's marker over Redis); the job at the provider ends too.
    await waitFor(() => silentOnN2() > silentBefore, 10_000, "n2's log line (it comes over a pipe)");
    await provider.waitForEvent("job_ended", () => true, 10_000);
    // Flowing again: what the link held reaches sockets already terminated; a new link opens.
    await proxy.restore();
    await waitFor(linkOpen, 15_000, "n1's link to n2 made again");
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 60_000);

  test("a request with nothing sent yet fails over to another provider on the same node, and is served", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    const providers = await twoProviders(cluster, n1, buyerNode, "silent-failover", FAILOVER);
    await waitFor(linkOpen, 15_000, "n1's link to n2 open");
    const { content, answer } = longPrompt("silent");

    const response = askOnce(buyerNode, apiKey, FAILOVER, content);
    // The first attempt's whole answer goes into the silent link (a non-streaming buyer has nothing yet).
    const first = await Promise.race(providers.map((p, i) => p.waitForEvent("job_received", () => true, 10_000).then(() => i)));
    await proxy.cut("blackhole");
    const cutAt = performance.now();
    const answered = await response;
    expect(answered.status).toBe(200);
    // A lease of silence, then the failover's own answer (40+ tokens at 20 a second): well before the
    // first-byte timeout (30 s). Its frames come over pub/sub while the path stays silent.
    expect(performance.now() - cutAt).toBeLessThan(LEASE_MS * 6 + 10_000);
    const body = (await answered.json()) as { choices: { message: { content: string } }[] };
    expect(body.choices[0]!.message.content).toBe(answer);
    await providers[1 - first]!.waitForEvent("job_ended", () => true, 1000);
    await proxy.restore();
    await waitFor(linkOpen, 15_000, "n1's link to n2 made again");
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 60_000);
});
