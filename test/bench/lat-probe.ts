// `bun test/bench/lat-probe.ts`: one request at a time through the full stack (one provider runtime):
// 300 warm-up requests, then N (default 500) measured — p50/p90/p99 ms. MODEL=… picks the mock behaviour;
// PAUSE=ms waits after printing the process ids (attach strace/perf to the gateway meanwhile).
import { Processes, startGatewayStack, startMock } from "./stack.ts";

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 1, logLevel: "info" });
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const body = JSON.stringify({ model: process.env.MODEL ?? "bench-json", stream: false, max_tokens: 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const one = async () => {
    const t = performance.now();
    await (await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body })).text();
    return performance.now() - t;
  };
  for (let i = 0; i < 300; i++) await one();
  console.log(JSON.stringify({ gateway: gw.gateway.pid, provider: gw.providers[0]!.pid, mock: mock.proc.pid }));
  await Bun.sleep(Number(process.env.PAUSE ?? 0));
  const n = Number(process.env.N ?? 500);
  const samples: number[] = [];
  for (let i = 0; i < n; i++) samples.push(await one());
  samples.sort((a, b) => a - b);
  const at = (q: number) => samples[Math.floor(q * n)]!.toFixed(3);
  console.log(`p50 ${at(0.5)} p90 ${at(0.9)} p99 ${at(0.99)}`);
} finally {
  await procs.stop();
}
