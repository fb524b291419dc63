// `bun test/bench/census.ts [json|sse|ladder] [N]`: what the gateway and the provider runtime allocate per
// request (sse: a stream of 256 unthrottled deltas; ladder: the stream ladder's 64 deltas every 20 ms,
// after 20 warm-up streams, the N measured ones all at once as the ladder opens them), by object type —
// the garbage included. Both run
// with the JSC collector off (BUN_JSC_disableGC=1, BUN_GC_TIMER_DISABLE=1) and census-preload.ts; after 300 warm-up requests a
// census is taken, N (default 1,000) requests run one at a time (instant mock), and a second census
// is taken: the difference per request is printed (heap capacity in KB, then object counts by type).
// A type whose count grows by several per request is worth a look: e.g. `Structure` (new hidden
// classes), `Set` (XState's machine interpreter allocates several per step).
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Processes, startGatewayStack, startMock } from "./stack.ts";

const [kind = "json", nArg = "1000"] = process.argv.slice(2);
const N = Number(nArg);
const dir = mkdtempSync(join(tmpdir(), "gw-census-"));
process.env.BENCH_CENSUS_DIR = dir; // read by stack.ts: the preload, the env, and the collector off

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 1, logLevel: "info" });
  const stream = kind === "sse" || kind === "ladder";
  const ladder = kind === "ladder";
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const model = ladder ? "bench-sse" : stream ? "bench-sse-n256-i0" : "bench-json";
  const body = JSON.stringify({ model, stream, max_tokens: ladder ? 64 : stream ? 256 : 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const one = async () => void (await (await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body })).text());
  const pids = { gateway: gw.gateway.pid, provider: gw.providers[0]!.pid };
  const census = async (n: number) => {
    for (const pid of Object.values(pids)) process.kill(pid, "SIGUSR2");
    const deadline = performance.now() + 5_000;
    while (!Object.values(pids).every((pid) => existsSync(join(dir, `census-${pid}-${n}.json`)))) {
      if (performance.now() > deadline) throw new Error("no census written");
      await Bun.sleep(20);
    }
    await Bun.sleep(50); // written whole
  };
  for (let i = 0; i < (ladder ? 20 : 300); i++) await one();
  await census(0);
  if (ladder) await Promise.all(Array.from({ length: N }, one));
  else for (let i = 0; i < N; i++) await one();
  await census(1);
  for (const [name, pid] of Object.entries(pids)) {
    const [a, b] = [0, 1].map((n) => JSON.parse(readFileSync(join(dir, `census-${pid}-${n}.json`), "utf8")) as { capacity: number; types: Record<string, number> });
    const rows = Object.keys(b!.types)
      .map((type) => [type, ((b!.types[type] ?? 0) - (a!.types[type] ?? 0)) / N] as const)
      .filter(([, d]) => d >= 0.5)
      .sort((x, y) => y[1] - x[1]);
    console.log(`${name}: +${((b!.capacity - a!.capacity) / N / 1024).toFixed(1)} KB of heap a request (${kind}${ladder ? `, ${N} at once` : ", one at a time"})`);
    console.log(`  ${rows.map(([type, d]) => `${type} ${d.toFixed(1)}`).join(" · ")}`);
  }
} finally {
  await procs.stop();
}
