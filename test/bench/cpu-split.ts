// `bun test/bench/cpu-split.ts [load|instant|streams|frames] [concurrency] [seconds] [--json]`: runs one full-stack load level
// (instant: the c=1 latency figure's instant mock instead of 20 ms; frames: the unthrottled 256-delta streams of the frames/s figure) and prints CPU seconds per process (gateway, each provider runtime, mock, driver) and per thread of the gateway and of the first provider runtime (the one routing loads) — where the time goes.
// --json: one JSON object instead (what test/bench/ab.ts reads). BENCH_PATH=relay|floor measures that
// path instead of the full stack (its server in the gateway's rows, its first client in provider-0's).
// BENCH_WARMUP_MS=N: before the window, N ms of discarded load (instant mock, c=32, as `bun run bench`
// warms every path) and, for stream modes, one discarded pass of the measured streams (5 a worker),
// so the window measures warm processes as the bench's own streaming phases do (default 0: none).
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { FETCH_ENV, Processes, startFloor, startGatewayStack, startMock, startRelay, type GatewayStack } from "./stack.ts";

const json = process.argv.includes("--json");
const [mode = "load", cArg = "128", sArg = "8"] = process.argv.slice(2).filter((a) => a !== "--json");
const concurrency = Number(cArg);
const seconds = Number(sArg);
const ticks = 100;
const times = (pid: number, path = `/proc/${pid}/stat`): { user: number; sys: number; faults: number } => {
  const f = readFileSync(path, "utf8").split(") ")[1]!.split(" ");
  return { user: Number(f[11]) / ticks, sys: Number(f[12]) / ticks, faults: Number(f[7]) };
};
const cpu = (pid: number, path?: string): number => {
  const t = times(pid, path);
  return t.user + t.sys;
};

/** Seconds a process's main thread has spent runnable but waiting for a core (schedstat's second field). */
const mainThreadWait = (pid: number): number => {
  try {
    return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[1]) / 1e9;
  } catch {
    return 0;
  }
};

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startPath(procs, mock.url, process.env.BENCH_PATH ?? "full", Number(process.env.BENCH_PROVIDERS ?? 4));
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const stream = mode === "streams" || mode === "frames";
  const deltas = mode === "frames" ? 256 : 64;
  const model = mode === "frames" ? "bench-sse-n256-i0" : stream ? "bench-sse" : mode === "instant" ? "bench-json" : "bench-json-d20";
  const body = JSON.stringify({ model, stream, max_tokens: stream ? deltas : 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const spec = stream
    ? { mode: "streams", url: `${gw.url}/v1/chat/completions`, headers, body, concurrency, perWorker: mode === "frames" ? seconds : Math.max(1, Math.round(seconds / 1.4)), warmup: 0, expectedFrames: deltas, stallMs: mode === "frames" ? 1e9 : 200 }
    : { mode: "load", url: `${gw.url}/v1/chat/completions`, headers, body, concurrency, warmupMs: 1000, durationMs: seconds * 1000 };
  const warmupMs = Number(process.env.BENCH_WARMUP_MS ?? 0);
  if (warmupMs > 0) {
    const instant = JSON.stringify({ model: "bench-json", stream: false, max_tokens: 16, messages: [{ role: "user", content: "x".repeat(256) }] });
    await drive({ mode: "load", url: `${gw.url}/v1/chat/completions`, headers, body: instant, concurrency: 32, warmupMs: 0, durationMs: warmupMs });
    if (stream) await drive({ ...spec, perWorker: 5 });
  }
  const pids: Record<string, number> = { gateway: gw.gateway.pid, mock: mock.proc.pid };
  gw.providers.forEach((p, i) => (pids[`provider-${i}`] = p.pid));
  const before = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, times(pid)]));
  const threadCpu = (pid: number): Map<string, { name: string; cpu: number }> =>
    new Map(
      readdirSync(`/proc/${pid}/task`).map((t) => [
        t,
        { name: readFileSync(`/proc/${pid}/task/${t}/comm`, "utf8").trim(), cpu: cpu(Number(t), `/proc/${pid}/task/${t}/stat`) },
      ]),
    );
  const threadsBefore = threadCpu(gw.gateway.pid);
  const waitsBefore = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, mainThreadWait(pid)]));
  // Routing packs work onto the busiest provider (routing.ts), so under one load the first runtime takes it all.
  const providerThreadsBefore = threadCpu(gw.providers[0]!.pid);
  const t0 = performance.now();
  const driver = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...process.env, ...FETCH_ENV }, stdout: "pipe" });
  let driverCpu = 0;
  const timer = setInterval(() => {
    try {
      driverCpu = cpu(driver.pid);
    } catch {}
  }, 100);
  const out = await new Response(driver.stdout).text();
  clearInterval(timer);
  const wall = (performance.now() - t0) / 1000;
  const after = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, times(pid)]));
  const r = JSON.parse(out);
  const summary = { mode, concurrency, wall: +wall.toFixed(2), rps: r.rps, p50: r.latency_ms?.p50, p99: r.latency_ms?.p99, errors: r.errors, stalled: r.stalled_streams, delivered: r.delivered_ratio, max_gap: r.max_gap_ms, ttft_p99: r.ttft_ms?.p99, frames_per_s: r.frames_per_s, events: r.events, gap_p99: r.gap_ms?.p99, transit_p99: r.transit_ms?.p99, transit_last_p50: r.transit_last_ms?.p50, transit_last_p99: r.transit_last_ms?.p99 };
  const used = (k: string) => after[k]!.user - before[k]!.user + after[k]!.sys - before[k]!.sys;
  const threadsOver = (pid: number, before: typeof threadsBefore) =>
    [...threadCpu(pid)].map(([t, { name, cpu: s }]) => ({ name, cpu: s - (before.get(t)?.cpu ?? 0) }));
  const threads = threadsOver(gw.gateway.pid, threadsBefore);
  const waits = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, mainThreadWait(pid) - waitsBefore[k]!]));
  const providerThreads = threadsOver(gw.providers[0]!.pid, providerThreadsBefore);
  if (json) {
    const providers = Object.keys(pids).filter((k) => k.startsWith("provider-")).reduce((sum, k) => sum + used(k), 0);
    // The main (JS) thread is the one named after the executable.
    const main = threads.find((t) => t.name === "bun")?.cpu ?? null;
    console.log(JSON.stringify({ ...summary, cpu_s: { gateway: used("gateway"), gateway_main: main, providers, mock: used("mock"), driver: driverCpu } }));
  } else {
    console.log(JSON.stringify(summary));
    for (const k of Object.keys(pids)) {
      const user = after[k]!.user - before[k]!.user;
      const sys = after[k]!.sys - before[k]!.sys;
      console.log(`${k.padEnd(12)} ${(user + sys).toFixed(2)} s CPU (user ${user.toFixed(2)}, sys ${sys.toFixed(2)})`);
    }
    // The gateway's threads during the run: the main (JS) thread is the one that saturates.
    for (const { name, cpu: s } of threads) if (s >= 0.05) console.log(`  gateway thread ${name.padEnd(12)} ${s.toFixed(2)} s CPU`);
    for (const { name, cpu: s } of providerThreads) if (s >= 0.05) console.log(`  provider-0 thread ${name.padEnd(12)} ${s.toFixed(2)} s CPU`);
    console.log(`${"driver".padEnd(12)} ${driverCpu.toFixed(2)} s CPU (approx)`);
    // Runnable but not running: a main thread that waits for a core delays its event loop as much as work does.
    console.log(`main thread waiting for a core (s): ${Object.entries(waits).map(([k, w]) => `${k} ${w.toFixed(2)}`).join(", ")}`);
    // Per request (per stream when streaming): load levels run a 1 s warm-up at about the same rate.
    const n = stream ? concurrency * (spec as { perWorker: number }).perWorker : r.rps * (seconds + 1);
    const per = Object.keys(pids).map((k) => `${k} ${Math.round((used(k) * 1e6) / n)}`);
    console.log(`µs CPU per ${stream ? "stream" : "request"}: ${[...per, `driver ${Math.round((driverCpu * 1e6) / n)}`].join(", ")}`);
    // Minor page faults: memory the allocator gave back to the system and touched again (docs/provider-machines.md, "The allocator").
    console.log(`page faults per ${stream ? "stream" : "request"}: ${Object.keys(pids).map((k) => `${k} ${((after[k]!.faults - before[k]!.faults) / n).toFixed(1)}`).join(", ")}`);
  }
} finally {
  await procs.stop();
}

/** One discarded driver run (warm-up). */
async function drive(spec: object): Promise<void> {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...process.env, ...FETCH_ENV }, stdout: "ignore" });
  if ((await proc.exited) !== 0) throw new Error("warm-up driver failed");
}

/** The path measured, in the full stack's shape: a server (gateway) and its clients (providers). */
async function startPath(p: Processes, mockUrl: string, path: string, clients: number): Promise<Pick<GatewayStack, "url" | "apiKey" | "gateway" | "providers">> {
  if (path === "full") return startGatewayStack(p, { mockUrl, providers: clients, logLevel: "info" });
  const before = p.all.length;
  const started = path === "floor" ? await startFloor(p, { mockUrl, clients }) : path === "relay" ? { ...(await startRelay(p, { mockUrl, clients })), apiKey: "" } : null;
  if (started === null) throw new Error(`BENCH_PATH must be full, floor or relay, not ${path}`);
  return { url: started.url, apiKey: started.apiKey, gateway: started.server, providers: p.all.slice(before + 1) };
}
