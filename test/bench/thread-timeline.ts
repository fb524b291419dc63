// `bun test/bench/thread-timeline.ts [concurrency] [seconds] [interval_s]`: one full-stack load level
// (mock at 20 ms) for a long window, printing every interval the gateway's CPU by thread kind (main JS
// thread, JIT compilers, the receipt judge's Worker, GC helpers, mimalloc's scavenger) and req/s — to
// tell a warm-up cost that fades from one that stays (JIT work that never settles is recompilation).
import { join } from "node:path";
import { threadCpuByName } from "./children.ts";
import { FETCH_ENV, Processes, startGatewayStack, startMock } from "./stack.ts";

const [cArg = "256", sArg = "60", iArg = "5"] = process.argv.slice(2);
const kind = (name: string) =>
  name === "bun" ? "main" : /JIT|WarmUp/.test(name) ? "jit" : name === "Worker" ? "judge" : /Heap|GC/.test(name) ? "gc" : /scavenger/.test(name) ? "mimalloc" : "other";
const byKind = (pid: number): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const [name, seconds] of threadCpuByName(pid)) out[kind(name)] = (out[kind(name)] ?? 0) + seconds;
  return out;
};

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: Number(process.env.BENCH_PROVIDERS ?? 4), logLevel: "info" });
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const body = JSON.stringify({ model: "bench-json-d20", stream: false, max_tokens: 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const spec = { mode: "load", url: `${gw.url}/v1/chat/completions`, headers, body, concurrency: Number(cArg), warmupMs: 0, durationMs: Number(sArg) * 1000 };
  const requestsSeen = async () => {
    const text = await (await fetch(`${gw.url}/metrics`)).text();
    let n = 0;
    for (const line of text.split("\n")) if (line.startsWith("gateway_requests_total{")) n += Number(line.split(" ").pop());
    return n;
  };
  const driver = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...process.env, ...FETCH_ENV }, stdout: "pipe" });
  let last = byKind(gw.gateway.pid);
  let lastN = await requestsSeen();
  const interval = Number(iArg) * 1000;
  const timer = setInterval(async () => {
    const now = byKind(gw.gateway.pid);
    const n = await requestsSeen();
    const done = n - lastN;
    const per = (k: string) => Math.round((((now[k] ?? 0) - (last[k] ?? 0)) * 1e6) / Math.max(1, done));
    console.log(`${(done / (interval / 1000)).toFixed(0).padStart(5)} req/s · µs CPU a request: main ${per("main")}, jit ${per("jit")}, judge ${per("judge")}, gc ${per("gc")}, mimalloc ${per("mimalloc")}, other ${per("other")}`);
    last = now;
    lastN = n;
  }, interval);
  await new Response(driver.stdout).text();
  clearInterval(timer);
} finally {
  await procs.stop();
}
