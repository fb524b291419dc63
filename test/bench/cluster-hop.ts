// The cluster's node hop measured (docs/scale-out.md, "Measured"): two `gateway serve` nodes on one
// store and one Redis, one provider machine on node 1. The same streams are asked of node 1 (the
// provider is local) and of node 2 (job, frames and settled cross Redis pub/sub), one at a time, and
// TTFT and the per-chunk gap are compared. Run: bun test/bench/cluster-hop.ts [requests]
import { startCluster } from "../support/cluster.ts";

const N = Number(process.argv[2] ?? 200);
const MODEL = "hop-model";
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

const cluster = await startCluster({ nodes: 2, models: [MODEL], extraArgs: ["--log-level", "warn"] });
try {
  const created = JSON.parse(cluster.cli(["accounts", "create", "--tier", "paid", "--name", "hop"]).stdout) as { account_id: string; api_key: string };
  cluster.cli(["credits", "grant", "--account", created.account_id, "--credits", "100000000"]);
  const [n1, n2] = cluster.nodes as [(typeof cluster.nodes)[0], (typeof cluster.nodes)[0]];
  const provider = cluster.provider({ id: "hop-prov", gateways: [n1], maxConcurrency: 4, tokensPerSecond: 100_000 });
  await provider.waitForEvent("welcome", () => true, 60_000);
  await cluster.waitRoutable(n2, 1);
  const body = (i: number) => JSON.stringify({ model: MODEL, stream: true, max_tokens: 32, messages: [{ role: "user", content: `hop ${i}` }] });
  async function run(base: string, i: number): Promise<{ ttft: number; gaps: number[] }> {
    const t0 = performance.now();
    const res = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${created.api_key}`, "content-type": "application/json" }, body: body(i) });
    const reader = res.body!.getReader();
    let ttft = -1;
    let last = 0;
    const gaps: number[] = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const now = performance.now();
      if (new TextDecoder().decode(value).includes('"content"')) {
        if (ttft < 0) ttft = now - t0;
        else gaps.push(now - last);
        last = now;
      }
    }
    return { ttft, gaps };
  }
  const result: Record<string, { ttft_p50_ms: number; ttft_p99_ms: number; gap_p50_ms: number; gap_p99_ms: number }> = {};
  for (let round = 0; round < 2; round++) {
    for (const [name, node] of [["same_node", n1], ["cross_node", n2]] as const) {
      const ttfts: number[] = [];
      const gaps: number[] = [];
      for (let i = 0; i < N; i++) {
        const r = await run(node.url, i);
        ttfts.push(r.ttft);
        gaps.push(...r.gaps);
      }
      // The first round warms both paths up; the second is reported.
      if (round === 1) result[name] = { ttft_p50_ms: pct(ttfts, 50), ttft_p99_ms: pct(ttfts, 99), gap_p50_ms: pct(gaps, 50), gap_p99_ms: pct(gaps, 99) };
    }
  }
  const s = result.same_node!;
  const c = result.cross_node!;
  console.log(JSON.stringify({ requests: N, ...result, added_ttft_p99_ms: c.ttft_p99_ms - s.ttft_p99_ms, added_chunk_gap_p99_ms: c.gap_p99_ms - s.gap_p99_ms }, null, 2));
} finally {
  await cluster.close();
}
