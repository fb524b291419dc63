// The load-balancer config shipped in deploy/nginx-cluster.conf, actually run: nginx in front of two
// cluster nodes, a provider machine and buyers both connecting through it. The provider's WebSocket
// upgrades through nginx, and an SSE stream reaches the buyer delta by delta (no buffering: the first
// delta arrives long before the last). Skipped visibly when nginx is not installed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, startCluster, type ClusterNodeProcess, type TestCluster } from "../support/cluster.ts";
import { freePort } from "../support/ports.ts";

const NGINX = Bun.which("nginx") ?? (Bun.file("/usr/sbin/nginx").size > 0 ? "/usr/sbin/nginx" : null);
const missing = clusterMissing ?? (NGINX ? null : "nginx is not installed (apt-get install nginx-light)");
if (missing) console.warn(`[skipped] load balancer test: ${missing}`);
const MODEL = "lb-model";
const CONFIG = join(import.meta.dir, "../../deploy/nginx-cluster.conf");

/** The shipped config with this test's nodes and port: only the lines marked @nodes / @listen change. */
function configFor(nodes: ClusterNodeProcess[], port: number): string {
  const lines = readFileSync(CONFIG, "utf8").split("\n");
  const out: string[] = [];
  let nodesWritten = false;
  for (const line of lines) {
    if (line.includes("# @nodes")) {
      if (!nodesWritten) for (const n of nodes) out.push(`    server 127.0.0.1:${n.port} max_fails=1 fail_timeout=5s;`);
      nodesWritten = true;
    } else if (line.includes("# @listen")) out.push(`    listen 127.0.0.1:${port};`);
    else out.push(line);
  }
  return out.join("\n");
}

describe.skipIf(missing !== null)("nginx in front of two nodes (deploy/nginx-cluster.conf)", () => {
  let cluster: TestCluster;
  let nginx: ReturnType<typeof Bun.spawn>;
  let lb: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 2, models: [MODEL] });
    const port = await freePort();
    const prefix = join(cluster.dataDir, "nginx");
    mkdirSync(join(prefix, "logs"), { recursive: true });
    writeFileSync(join(prefix, "nginx.conf"), configFor(cluster.nodes, port));
    nginx = Bun.spawn([NGINX!, "-p", prefix, "-c", join(prefix, "nginx.conf"), "-g", `daemon off; pid ${join(prefix, "nginx.pid")}; error_log ${join(prefix, "logs/error.log")};`], {
      stdout: "ignore",
      stderr: "pipe",
    });
    lb = `127.0.0.1:${port}`;
    await waitFor(() => nginx.exitCode !== null || Bun.file(join(prefix, "nginx.pid")).size > 0, 10_000, "nginx started");
    if (nginx.exitCode !== null) throw new Error(`nginx: ${await new Response(nginx.stderr as ReadableStream).text()}`);
  }, 180_000);
  afterAll(async () => {
    // SIGTERM: the master stops its workers; a SIGKILL would orphan them.
    nginx?.kill("SIGTERM");
    await nginx?.exited;
    await cluster?.close();
  });

  test("a provider connects through it (WebSocket upgrade) and a buyer's SSE stream arrives unbuffered", async () => {
    const created = cluster.paidBuyer("lb-buyer", 100_000);
    const provider = cluster.provider({ id: "lb-prov", gateways: [{ wsUrl: `ws://${lb}/v1/provider/connect` } as ClusterNodeProcess], tokensPerSecond: 20 });
    await provider.waitForEvent("welcome", () => true, 30_000);
    const client = new OpenAI({ apiKey: created.api_key, baseURL: `http://${lb}/v1`, maxRetries: 0 });
    // Through either node: the cluster routes to the provider wherever its socket landed.
    for (let i = 0; i < 4; i++) {
      const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 24, messages: [{ role: "user", content: `through nginx ${i}` }] });
      const arrivals: number[] = [];
      for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) arrivals.push(performance.now());
      expect(arrivals.length).toBeGreaterThan(5);
      // 20 tokens a second: unbuffered, the deltas are spread over most of a second.
      expect(arrivals.at(-1)! - arrivals[0]!).toBeGreaterThan(200);
    }
    const plain = await client.chat.completions.create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "plain through nginx" }] });
    expect(plain.choices[0]!.message.content!.length).toBeGreaterThan(0);
  }, 120_000);
});
