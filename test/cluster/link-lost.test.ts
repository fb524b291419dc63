// A node link that breaks between two live nodes (docs/scale-out.md, "Node links"): the frames still
// in it are lost, and the sender goes on over Redis pub/sub. Found by the cluster crash chaos (links
// mode, seed 33001): a buyer on one node, served by a provider on the other, waited until it gave up,
// its attempt's last frames gone with the link. A stream must not go on with a gap either. Both nodes
// let go of the work they share, as for a death: the buyer's stream ends in-band with
// `provider_disconnected`, never a `[DONE]` after missing text, and the provider's node lets go of the job;
// a request that sent nothing yet fails over — to another session on the same node too, whose frames
// come over pub/sub meanwhile (seed 33001 again: the failover's link was dropped with the broken one's).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { clusterMissing, type TestCluster } from "../support/cluster.ts";
import { waitFor } from "../support/harness.ts";
import { askOnce, longPrompt, startLinkSplit, twoProviders } from "../support/linkSplit.ts";
import type { TcpProxy } from "../support/tcpProxy.ts";

const MODEL = "link-model";
const FAILOVER = "link-failover";

describe.skipIf(clusterMissing !== null)("a node link broken between two live nodes", () => {
  let cluster: TestCluster;
  let proxy: TcpProxy;
  let buyerNode: TestCluster["nodes"][0];
  let apiKey: string;
  beforeAll(async () => {
    ({ cluster, proxy, buyerNode, apiKey } = await startLinkSplit([MODEL, FAILOVER], "link-buyer"));
  }, 180_000);
  afterAll(async () => {
    await proxy?.stop();
    await cluster?.close();
  });

  test("frames lost in it: the stream ends in-band, with no gap and no [DONE]", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    const provider = cluster.provider({ id: "link-prov", gateways: [n1], tokensPerSecond: 20 });
    await cluster.waitRoutable(buyerNode, 1);
    await n1.waitForEvent("cluster_link_open", (e) => e.peer === "n2", 10_000);
    const { content, answer } = longPrompt("link");

    const client = new OpenAI({ apiKey, baseURL: buyerNode.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 1000, messages: [{ role: "user", content }] });
    let text = "";
    let chunks = 0;
    let error: unknown = null;
    let done = false;
    let brokenAt = 0;
    const reading = (async () => {
      try {
        for await (const chunk of stream) {
          text += chunk.choices[0]?.delta?.content ?? "";
          if (++chunks === 3) {
            // The rest of the answer, its end included, piles up in the silent link; then the link
            // breaks, and what it held is lost: nothing more comes for this attempt.
            await proxy.cut("blackhole");
            await provider.waitForEvent("job_ended", () => true, 10_000);
            await proxy.cut("reset");
            brokenAt = performance.now();
          }
        }
        done = true;
      } catch (e) {
        error = e;
      }
    })();
    await reading;
    expect(done).toBe(false);
    expect(String((error as { error?: { code?: string } })?.error?.code ?? error)).toContain("provider_disconnected");
    // At once, not after the stream's idle timeout (a minute).
    expect(performance.now() - brokenAt).toBeLessThan(3000);
    // What the buyer got is the answer's beginning, with nothing missing in between.
    expect(answer.startsWith(text)).toBe(true);
    await proxy.restore();
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 60_000);

  test("a request with nothing sent yet fails over to another provider on the same node, and is served", async () => {
    const [n1] = cluster.nodes as [TestCluster["nodes"][0]];
    const providers = await twoProviders(cluster, n1, buyerNode, "link-failover", FAILOVER);
    // n1's link to n2 is open (the one the test before broke is made again every second).
    const linkOpen = () => n1.events.filter((e) => e.peer === "n2" && String(e.event).startsWith("cluster_link_") && e.event !== "cluster_link_lost").at(-1)?.event === "cluster_link_open";
    await waitFor(linkOpen, 10_000, "n1's link to n2 open");
    const { content, answer } = longPrompt("link");

    const response = askOnce(buyerNode, apiKey, FAILOVER, content);
    // The first attempt's whole answer is held in the silent link, then lost with it.
    const first = await Promise.race(providers.map((p, i) => p.waitForEvent("job_received", () => true, 10_000).then(() => i)));
    await proxy.cut("blackhole");
    await providers[first]!.waitForEvent("job_ended", () => true, 10_000);
    await proxy.cut("reset");
    const brokenAt = performance.now();
    const answered = await response;
    expect(answered.status).toBe(200);
    // The failover's own answer (40+ tokens at 20 a second), not a first-byte timeout (30 s) later.
    expect(performance.now() - brokenAt).toBeLessThan(10_000);
    const body = (await answered.json()) as { choices: { message: { content: string } }[] };
    expect(body.choices[0]!.message.content).toBe(answer);
    await providers[1 - first]!.waitForEvent("job_ended", () => true, 1000);
    await proxy.restore();
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 60_000);
});
