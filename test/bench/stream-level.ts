// `bun test/bench/stream-level.ts [streams] [rounds] [warmup_s]`: the stream ladder's one level, on its
// own and repeated — N paced streams (64 deltas every 20 ms) started at once against the full stack
// (BENCH_PATH=relay|floor: that path), `rounds` times on one warm stack. Per round: delivered, stalled
// streams, max gap, TTFT p99, peak live, server RSS peak, the server's event-loop delay p99 / max, its
// main thread's CPU and wait for a core, and the loop-delay samples above 100 ms with when they came
// (ms after the level started) — to tell a stall of the admission burst from one of the steady state.
// Used for issue 27's fairness pass (docs/benchmarks.md, "Stream fairness pass"); alternate two trees
// by running this script from each (it measures the tree it lives in).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { LoadResult, StreamResult } from "./driver.ts";
import { loopDelaySamples } from "./loopDelay.ts";
import { FETCH_ENV, Processes, rssMb, startFloor, startGatewayStack, startMock, startRelay } from "./stack.ts";

const [nArg = "1024", rArg = "3", wArg = "20"] = process.argv.slice(2);
const N = Number(nArg);
const ROUNDS = Number(rArg);
const WARMUP_S = Number(wArg);
const PATH = process.env.BENCH_PATH ?? "full";
/** BENCH_SETTINGS='{"admissionsPerTurn":0}': gateway settings for this run (A/B of a knob on one tree). */
const SETTINGS = JSON.parse(process.env.BENCH_SETTINGS ?? "{}") as Record<string, unknown>;
const body = (model: string, stream: boolean, maxTokens: number) =>
  JSON.stringify({ model, stream, max_tokens: maxTokens, messages: [{ role: "user", content: "x".repeat(256) }] });

const drive = async <R>(spec: object, sample?: () => void): Promise<R> => {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...process.env, ...FETCH_ENV }, stdout: "pipe", stderr: "inherit" });
  const timer = sample ? setInterval(sample, 50) : null;
  const out = await new Response(proc.stdout).text();
  if (timer) clearInterval(timer);
  if ((await proc.exited) !== 0) throw new Error(`driver failed: ${out}`);
  return JSON.parse(out) as R;
};
const mainThread = (pid: number) => {
  const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  const wait = Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[1]) / 1e9;
  return { cpu: (Number(stat[11]) + Number(stat[12])) / 100, wait };
};

const procs = new Processes();
process.env.BENCH_LOOP_DIR = procs.dataDir;
try {
  const mock = await startMock(procs);
  const clients = Number(process.env.BENCH_PROVIDERS ?? 4);
  const t =
    PATH === "full"
      ? await startGatewayStack(procs, { mockUrl: mock.url, providers: clients, logLevel: "info", settings: SETTINGS }).then((g) => ({ url: g.url, apiKey: g.apiKey, server: g.gateway }))
      : PATH === "floor"
        ? await startFloor(procs, { mockUrl: mock.url, clients })
        : { ...(await startRelay(procs, { mockUrl: mock.url, clients })), apiKey: "" };
  const url = `${t.url}/v1/chat/completions`;
  const headers: Record<string, string> = { "content-type": "application/json", ...(t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {}) };
  if (WARMUP_S > 0) {
    const w = await drive<LoadResult>({ mode: "load", url, headers, body: body("bench-json", false, 16), concurrency: 32, warmupMs: 0, durationMs: WARMUP_S * 1000 });
    await drive<StreamResult>({ mode: "streams", url, headers, body: body("bench-sse", true, 64), concurrency: 256, perWorker: 1, warmup: 0, expectedFrames: 64, stallMs: 200 });
    console.error(`warm-up: ${w.rps} req/s, one level of 256 streams`);
  }
  const pid = t.server.pid;
  // BENCH_LOAD=C: a closed-loop load level (mock at 20 ms) of `rounds` × 8 s at concurrency C instead.
  const loadC = Number(process.env.BENCH_LOAD ?? 0);
  for (let round = 1; loadC > 0 && round <= ROUNDS; round++) {
    const m0 = mainThread(pid);
    const from = Date.now();
    const r = await drive<LoadResult>({ mode: "load", url, headers, body: body("bench-json-d20", false, 16), concurrency: loadC, warmupMs: 0, durationMs: 8000 });
    const m1 = mainThread(pid);
    await Bun.sleep(300);
    const delays = loopDelaySamples(procs.dataDir, pid, from, Date.now()).map((s) => s.delay).sort((a, b) => a - b);
    const cpuUs = Math.round(((m1.cpu - m0.cpu) * 1e6) / (r.rps * 8));
    console.log(JSON.stringify({ path: PATH, settings: SETTINGS, load: loadC, round, rps: r.rps, p99: r.latency_ms.p99, errors: r.errors, main_cpu_us_a_request: cpuUs, loop_p99: delays[Math.floor(delays.length * 0.99)] ?? null, loop_max: delays.at(-1) ?? null }));
  }
  for (let round = 1; loadC === 0 && round <= ROUNDS; round++) {
    await Bun.sleep(500);
    const idle = rssMb(pid);
    let peak = 0;
    const m0 = mainThread(pid);
    const from = Date.now();
    const r = await drive<StreamResult>(
      { mode: "streams", url, headers, body: body("bench-sse", true, 64), concurrency: N, perWorker: 1, warmup: 0, expectedFrames: 64, stallMs: 200 },
      () => (peak = Math.max(peak, rssMb(pid))),
    );
    const to = Date.now();
    const m1 = mainThread(pid);
    await Bun.sleep(300);
    const samples = loopDelaySamples(procs.dataDir, pid, from, to);
    const delays = samples.map((s) => s.delay).sort((a, b) => a - b);
    const late = samples.filter((s) => s.delay > 100).map((s) => `${Math.round(s.at - from)}:${Math.round(s.delay)}`);
    console.log(
      JSON.stringify({
        path: PATH,
        settings: SETTINGS,
        n: N,
        round,
        delivered: r.delivered_ratio,
        stalled: r.stalled_streams,
        errors: r.errors,
        max_gap: r.max_gap_ms,
        ttft_p50: r.ttft_ms.p50,
        ttft_p99: r.ttft_ms.p99,
        gap_p99: r.gap_ms.p99,
        events_a_stream: Math.round((r.events / r.streams) * 10) / 10,
        peak_live: r.peak_live,
        wall_s: r.wall_s,
        rss_idle: Math.round(idle),
        rss_peak: Math.round(peak),
        loop_p99: delays[Math.floor(delays.length * 0.99)] ?? null,
        loop_max: delays.at(-1) ?? null,
        main_cpu_s: +(m1.cpu - m0.cpu).toFixed(2),
        main_wait_s: +(m1.wait - m0.wait).toFixed(2),
        late_at_ms: late.join(" "),
      }),
    );
  }
} finally {
  await procs.stop();
}
