// What the node-link tests (test/cluster/link-lost.test.ts, link-silent.test.ts) share: two nodes with
// a proxy on the links into one, a long answer to stream across them, two providers on the far node,
// and a non-streaming request.
import { syntheticPlan } from "../../src/provider/synthetic.ts";
import { startCluster, type TestCluster } from "./cluster.ts";
import { waitFor } from "./harness.ts";
import { freePort } from "./ports.ts";
import { startTcpProxy, type TcpProxy } from "./tcpProxy.ts";

type Node = TestCluster["nodes"][0];

/** A prompt whose synthetic answer has at least 40 tokens (at 20 tokens/s it streams for 2 s at least), with that answer. */
export function longPrompt(tag: string): { content: string; answer: string } {
  for (let i = 0; ; i++) {
    const content = `${tag} ${i}`;
    const tokens = syntheticPlan([{ role: "user", content }], 1000).tokens;
    if (tokens.length >= 40) return { content, answer: tokens.join("") };
  }
}

/** Two providers of `model` (20 tokens/s) connected to `holder`, once both are routable from `buyerNode`. */
export async function twoProviders(cluster: TestCluster, holder: Node, buyerNode: Node, idPrefix: string, model: string) {
  const admitted = async () => ((await (await fetch(`${buyerNode.url}/healthz`)).json()) as { providers_admitted: number }).providers_admitted;
  const before = await admitted();
  const providers = [0, 1].map((i) => cluster.provider({ id: `${idPrefix}-${i}`, gateways: [holder], models: [model], tokensPerSecond: 20 }));
  await waitFor(async () => (await admitted()) >= before + 2, 30_000, `both providers routable from ${buyerNode.name}`);
  return providers;
}

/** A non-streaming chat completion of `content` (up to 1000 tokens) asked of `node`. */
export function askOnce(node: Node, apiKey: string, model: string, content: string): Promise<Response> {
  return fetch(`${node.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model, max_tokens: 1000, messages: [{ role: "user", content }] }),
  });
}

/**
 * A one-node cluster (n1) and a second node, n2, whose link server sits behind a TCP proxy it
 * announces: every link into n2 (n1's messages to it) goes through the proxy.
 */
export async function startLinkSplit(models: string[], buyer: string): Promise<{ cluster: TestCluster; proxy: TcpProxy; buyerNode: Node; apiKey: string }> {
  const cluster = await startCluster({ nodes: 1, models });
  const linkPort = await freePort();
  const proxy = await startTcpProxy(linkPort, { holdCloses: true });
  const buyerNode = await cluster.startNode("n2", ["--cluster-link-port", String(linkPort), "--cluster-link-announce", `127.0.0.1:${proxy.port}`]);
  return { cluster, proxy, buyerNode, apiKey: cluster.paidBuyer(buyer).api_key };
}
