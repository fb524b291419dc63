// `bun run bench`: the gateway benchmark (issues 7 and 27), everything on loopback, bounded in time
// (~5 minutes; `--quick`: a smoke run of a few seconds whose figures mean nothing, run by
// test/bench/run.test.ts so the script cannot rot). Four paths in one run — direct (driver → mock), bare
// relay (driver → minimal Bun WebSocket→SSE relay → mock), the required-work floor (floor.ts: the
// relay plus auth, a durable reservation, msgpack frames, a signed and verified receipt and a
// double-entry settlement, nothing else) and full stack (driver → gateway → WebSocket → provider
// runtime, openai engine → mock, with auth, quota reservation, routing, durable settlement, receipt
// signing and verification on) — measured by a load driver in its own process (driver.ts). Issue 27
// sets the targets against the bare relay of the same run (report.ts). Each server samples its
// event-loop delay (loop-delay-preload.ts). Writes a JSON result and the Markdown table in
// docs/benchmarks.md (between its bench markers).
//
// Flags and environment (all optional):
//   --quick / BENCH_QUICK=1  a smoke run: one provider runtime, tiny durations and ladders
//   BENCH_SCALE=F            every duration × F (default 1)
//   BENCH_PATHS=a,b          subset of direct,relay,floor,full
//   BENCH_LOAD_LEVELS=…      the relay's closed-loop concurrency ladder (default 64,…,1024); the other
//                            paths run at the concurrency where the relay peaked
//   BENCH_STREAM_LEVELS=…    concurrent streams ladder (default 1,32,256,1024,2048,4096)
//   BENCH_PROVIDERS=N        provider runtimes / relay and floor clients (default 4: 4 × 1024 slots)
//   BENCH_LOG_LEVEL=L        gateway log level (default info, the shipped default)
//   BENCH_WARMUP_MS=N        discarded warm-up of every path before the first phase (default 20000; 0: none)
//   BENCH_JSON=FILE          where the JSON goes (default docs/benchmarks.json)
//   BENCH_MD=FILE            Markdown file to update (default docs/benchmarks.md); BENCH_WRITE=0: print only
//   BENCH_PURGE_DELAY=MS     MIMALLOC_PURGE_DELAY of the gateway, provider runtimes, relay and floor (default
//                            1000, as the service files and the runtime's documented units set it; stack.ts)
//   BENCH_CLUSTER=0          skip the cluster figures (issue 22: test/bench/cluster-hop.ts as a child, run
//                            after the embedded paths when PostgreSQL and Redis are installed; not in --quick)
//   BENCH_PHASES=a,b         only these of latency,load,stream_c1,throughput,streams (default all; after the
//                            warm-up): prints each path's figures as JSON, writes no docs, no held or
//                            cluster figures. `BENCH_PHASES=stream_c1,throughput BENCH_PATHS=relay,full`
//                            is the deltas/s figure with the streaming phase the full run has before it
//                            (~3 minutes)
//   BENCH_HELD=0             skip the RSS budget's held-stream figures (test/bench/memory.ts as a child at
//                            1,024 and 4,096 streams, all live at once; not in --quick)
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import type { LoadResult, LoadSpec, StreamResult, StreamSpec } from "./driver.ts";
import { loopDelay } from "./loopDelay.ts";
import { diffBuckets, histogramQuantile, observations, scrapeOverhead } from "./metrics.ts";
import { FETCH_ENV, Processes, rssMb, startFloor, startGatewayStack, startMock, startRelay } from "./stack.ts";
import { derive, renderMarkdown, writeMarkdown, type BenchResult, type ClusterFigures, type HeldStreamFigures, type PathName, type PathResult } from "./report.ts";
import { postgresMissing } from "../support/postgres.ts";
import { redisMissing } from "../support/redis.ts";

const env = process.env;
const QUICK = env.BENCH_QUICK === "1" || process.argv.includes("--quick");
const SCALE = Number(env.BENCH_SCALE ?? 1);
const list = (v: string | undefined, def: number[]) => (v ? v.split(",").map(Number) : def);
const PATHS = (env.BENCH_PATHS ?? "direct,relay,floor,full").split(",") as PathName[];
const LOAD_LEVELS = list(env.BENCH_LOAD_LEVELS, QUICK ? [16] : [64, 128, 256, 512, 1024]);
const STREAM_LEVELS = list(env.BENCH_STREAM_LEVELS, QUICK ? [8] : [1, 32, 256, 1024, 2048, 4096]);
const PROVIDERS = Number(env.BENCH_PROVIDERS ?? (QUICK ? 1 : 4));
const LOG_LEVEL = env.BENCH_LOG_LEVEL ?? "info";
// 20 s: the full stack's JIT compilation took ~500 µs of CPU a request in its first 5 s under load and
// settled at 60–90 µs only after ~25 s (test/bench/thread-timeline.ts; docs/benchmarks.md, "Method").
const WARMUP_MS = Number(env.BENCH_WARMUP_MS ?? (QUICK ? 300 : 20_000));
const ROOT = join(import.meta.dir, "../..");
/** A duration (full run, quick run) in ms, times BENCH_SCALE. */
const ms = (full: number, quick: number) => Math.max(100, Math.round((QUICK ? quick : full) * SCALE));
const count = (full: number, quick: number) => Math.max(1, Math.round((QUICK ? quick : full) * SCALE));
const THROUGHPUT_RUNS = QUICK ? 1 : 3;
const PHASES = env.BENCH_PHASES?.split(",");
const phase = (name: string) => PHASES === undefined || PHASES.includes(name);
/** The stream of the gap and concurrent-streams phases: 64 deltas every 20 ms (quick: 16 every 5 ms). */
const PACED = QUICK ? { model: "bench-sse-n16-i5", deltas: 16, intervalMs: 5 } : { model: "bench-sse", deltas: 64, intervalMs: 20 };
/** A stream stalls when a gap between its content frames, or its server's event loop, stops for 10 intervals. */
const STALL_MS = 10 * PACED.intervalMs;
const USER_MESSAGE = "x".repeat(256);

interface Target {
  url: string;
  headers: Record<string, string>;
  server: { pid: number } | null;
}

const body = (model: string, stream: boolean, maxTokens: number) =>
  JSON.stringify({ model, stream, max_tokens: maxTokens, messages: [{ role: "user", content: USER_MESSAGE }] });

async function drive<R>(spec: LoadSpec | StreamSpec, sample?: () => void): Promise<R> {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], {
    env: { ...process.env, ...FETCH_ENV },
    stdout: "pipe",
    stderr: "inherit",
  });
  const timer = sample ? setInterval(sample, 50) : null;
  const out = await new Response(proc.stdout).text();
  if (timer) clearInterval(timer);
  if ((await proc.exited) !== 0) throw new Error(`driver failed: ${out}`);
  return JSON.parse(out) as R;
}

const startedAt = performance.now();
const log = (msg: string, extra: unknown = "") =>
  console.error(`[bench +${((performance.now() - startedAt) / 1000).toFixed(1)} s] ${msg}`, typeof extra === "string" ? extra : JSON.stringify(extra));

async function main(): Promise<BenchResult> {
  const procs = new Processes();
  // Every server under test writes its event-loop delay samples here (stack.ts passes the preload).
  env.BENCH_LOOP_DIR = procs.dataDir;
  const started = performance.now();
  const loadBefore = loadavg();
  try {
    const mock = await startMock(procs);
    const targets: Partial<Record<PathName, Target>> = {};
    let gatewayUrl = "";
    let providerPids: number[] = [];
    if (PATHS.includes("direct")) targets.direct = { url: `${mock.url}/v1/chat/completions`, headers: { "content-type": "application/json" }, server: null };
    // The servers start side by side (the gateway's CLI set-up takes seconds); measurement starts once all are up.
    await Promise.all([
      PATHS.includes("relay") &&
        startRelay(procs, { mockUrl: mock.url, clients: PROVIDERS }).then((relay) => {
          targets.relay = { url: `${relay.url}/v1/chat/completions`, headers: { "content-type": "application/json" }, server: relay.server };
        }),
      PATHS.includes("floor") &&
        startFloor(procs, { mockUrl: mock.url, clients: PROVIDERS }).then((floor) => {
          targets.floor = { url: `${floor.url}/v1/chat/completions`, headers: { "content-type": "application/json", authorization: `Bearer ${floor.apiKey}` }, server: floor.server };
        }),
      PATHS.includes("full") &&
        startGatewayStack(procs, { mockUrl: mock.url, providers: PROVIDERS, logLevel: LOG_LEVEL }).then((gw) => {
          gatewayUrl = gw.url;
          providerPids = gw.providers.map((p) => p.pid);
          targets.full = { url: `${gw.url}/v1/chat/completions`, headers: { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` }, server: gw.gateway };
        }),
    ]);
    const paths = PATHS.filter((p) => targets[p]);
    log("every path up", paths.join(","));
    const results: Partial<Record<PathName, PathResult>> = Object.fromEntries(paths.map((p) => [p, { load: [], streams: [] } as unknown as PathResult]));
    /** The server's event-loop delay over a window that just closed (its last samples are flushed within 250 ms). */
    const delayOf = async (t: Target, from: number, to: number) => {
      if (!t.server) return null;
      await Bun.sleep(300);
      return loopDelay(procs.dataDir, t.server.pid, from, to);
    };

    // 0. Warm-up, discarded: each path serves the instant mock at concurrency 32 first, so the
    // concurrency-1 phase measures warm processes. Without it that phase ran while the gateway's JIT
    // threads were still compiling (for ~18,000 requests at one request at a time), on the same two
    // cores as the request path (ninth pass, docs/benchmarks-archive.md).
    if (WARMUP_MS > 0) {
      for (const p of paths) {
        const t = targets[p]!;
        const r = await drive<LoadResult>({ mode: "load", url: t.url, headers: t.headers, body: body("bench-json", false, 16), concurrency: 32, warmupMs: 0, durationMs: Math.round(WARMUP_MS * SCALE) });
        log(`${p} warm-up (discarded)`, { rps: r.rps, errors: r.errors });
      }
    }

    // 1. Added latency at concurrency 1, instant mock, non-streaming. The gateway's own overhead
    // histogram is read around this phase (full stack only).
    let overheadBefore = gatewayUrl ? await scrapeOverhead(gatewayUrl) : {};
    for (const p of phase("latency") ? paths : []) {
      const t = targets[p]!;
      const r = await drive<LoadResult>({ mode: "load", url: t.url, headers: t.headers, body: body("bench-json", false, 16), concurrency: 1, warmupMs: QUICK ? 0 : ms(1000, 0), durationMs: ms(7000, 500) });
      results[p]!.latency_c1 = r;
      log(`${p} latency c=1`, { rps: r.rps, ...r.latency_ms, errors: r.errors });
    }
    if (gatewayUrl && phase("latency")) {
      const after = await scrapeOverhead(gatewayUrl);
      const d = diffBuckets(after.no, overheadBefore.no);
      results.full!.overhead_nonstream_ms = { n: observations(d), p50: histogramQuantile(d, 0.5) * 1000, p99: histogramQuantile(d, 0.99) * 1000 };
    }

    // 2. Sustained req/s with the mock answering after 20 ms (issue 27: at the concurrency where the
    // relay peaks). The relay climbs a closed-loop ladder — a level passes with p99 < 1 s and errors
    // ≤ 0.1 %; the ladder stops once a level fails or gains under 5 % — and every other path runs at
    // the relay's best level. Without the relay, each path climbs the ladder itself. The server's
    // event-loop delay is read over each level (settlement under load: docs/decisions.md).
    const level = async (p: PathName, c: number) => {
      const t = targets[p]!;
      const from = Date.now();
      const r = await drive<LoadResult>({ mode: "load", url: t.url, headers: t.headers, body: body("bench-json-d20", false, 16), concurrency: c, warmupMs: QUICK ? 0 : ms(500, 0), durationMs: ms(4000, 300) });
      const to = Date.now();
      const passed = r.latency_ms.p99 < 1000 && r.error_rate <= 0.001;
      const loop_delay_ms = await delayOf(t, from, to);
      results[p]!.load.push({ concurrency: c, passed, loop_delay_ms, ...r });
      log(`${p} load c=${c}`, { rps: r.rps, p50: r.latency_ms.p50, p99: r.latency_ms.p99, errors: r.errors, passed, loop_delay_ms });
      return { rps: r.rps, passed };
    };
    const ladder = async (p: PathName) => {
      let best = 0;
      let bestC = 0;
      for (const c of LOAD_LEVELS) {
        const r = await level(p, c);
        if (!r.passed || r.rps < best * 1.05) break;
        if (r.rps > best) [best, bestC] = [r.rps, c];
      }
      return bestC;
    };
    const relayPeak = paths.includes("relay") && phase("load") ? await ladder("relay") : 0;
    for (const p of phase("load") ? paths : []) {
      if (p === "relay") continue;
      if (relayPeak > 0) await level(p, relayPeak);
      else await ladder(p);
    }

    // 3. Streaming at concurrency 1: time to the first content frame (a short, unthrottled stream),
    // then inter-frame gaps and per-chunk transit on the paced stream.
    overheadBefore = gatewayUrl ? await scrapeOverhead(gatewayUrl) : {};
    for (const p of phase("stream_c1") ? paths : []) {
      const t = targets[p]!;
      const ttft = await drive<StreamResult>({ mode: "streams", url: t.url, headers: t.headers, body: body("bench-sse-n4-i0", true, 4), concurrency: 1, perWorker: count(1500, 10), warmup: QUICK ? 1 : 20, expectedFrames: 4, stallMs: STALL_MS });
      const gaps = await drive<StreamResult>({ mode: "streams", url: t.url, headers: t.headers, body: body(PACED.model, true, PACED.deltas), concurrency: 1, perWorker: count(10, 1), warmup: QUICK ? 0 : 1, expectedFrames: PACED.deltas, stallMs: STALL_MS });
      results[p]!.stream_c1 = { ttft_ms: ttft.ttft_ms, gap_ms: gaps.gap_ms, transit_ms: gaps.transit_ms, ttft_run: ttft, gap_run: gaps };
      log(`${p} stream c=1`, { ttft: ttft.ttft_ms, gap: gaps.gap_ms, transit: gaps.transit_ms });
    }
    if (gatewayUrl && phase("stream_c1")) {
      const after = await scrapeOverhead(gatewayUrl);
      const d = diffBuckets(after.yes, overheadBefore.yes);
      results.full!.overhead_stream_ms = { n: observations(d), p50: histogramQuantile(d, 0.5) * 1000, p99: histogramQuantile(d, 0.99) * 1000 };
    }

    // 4. Unthrottled streaming throughput: 32 concurrent streams of 256 deltas sent back to back; the
    // figure is the median of three runs (one run moved ±25 % between full runs), all three kept.
    for (const p of phase("throughput") ? paths : []) {
      const t = targets[p]!;
      const runs: StreamResult[] = [];
      for (let i = 0; i < THROUGHPUT_RUNS; i++) {
        runs.push(await drive<StreamResult>({ mode: "streams", url: t.url, headers: t.headers, body: body("bench-sse-n256-i0", true, 256), concurrency: QUICK ? 4 : 32, perWorker: count(40, 2), warmup: 1, expectedFrames: 256, stallMs: 1e9 }));
      }
      const r = [...runs].sort((a, b) => a.frames_per_s - b.frames_per_s)[Math.floor(runs.length / 2)]!;
      results[p]!.stream_throughput = r;
      results[p]!.stream_throughput_runs = runs.map((run) => run.frames_per_s);
      log(`${p} stream throughput`, { deltas_per_s: r.frames_per_s, runs: results[p]!.stream_throughput_runs, events: r.events, delivered: r.delivered_ratio });
    }

    // 5. Concurrent streams: every level of the ladder started at once, each run to the end (issue 27
    // wants RSS at 1,024 and 4,096 even past a failed level). A level passes with ≥ 99.9 % of frames
    // delivered, no gap between content frames above STALL_MS, and no server event-loop delay above
    // STALL_MS. Server RSS is sampled while the streams live.
    for (const p of phase("streams") ? paths : []) {
      const t = targets[p]!;
      if (!QUICK) await Bun.sleep(500);
      const idle = t.server ? rssMb(t.server.pid) : null;
      results[p]!.rss_idle_mb = idle;
      for (const n of STREAM_LEVELS) {
        let peak = 0;
        const providerPeak = new Map<number, number>();
        const sample = () => {
          if (t.server) peak = Math.max(peak, rssMb(t.server.pid));
          if (p === "full") for (const pid of providerPids) providerPeak.set(pid, Math.max(providerPeak.get(pid) ?? 0, rssMb(pid)));
        };
        const from = Date.now();
        const r = await drive<StreamResult>({ mode: "streams", url: t.url, headers: t.headers, body: body(PACED.model, true, PACED.deltas), concurrency: n, perWorker: 1, warmup: 0, expectedFrames: PACED.deltas, stallMs: STALL_MS }, sample);
        const loop_delay_ms = await delayOf(t, from, Date.now());
        const passed = r.delivered_ratio >= 0.999 && r.stalled_streams === 0 && (loop_delay_ms === null || loop_delay_ms.max <= STALL_MS);
        results[p]!.streams.push({
          level: n,
          passed,
          rss_peak_mb: t.server ? peak : null,
          per_stream_kb: t.server && idle !== null ? ((peak - idle) * 1024) / n : null,
          provider_rss_peak_mb: p === "full" ? [...providerPeak.values()].reduce((a, b) => a + b, 0) : null,
          loop_delay_ms,
          ...r,
        });
        log(`${p} streams n=${n}`, { passed, delivered: r.delivered_ratio, stalled: r.stalled_streams, max_gap: r.max_gap_ms, ttft_p99: r.ttft_ms.p99, rss_peak: peak, loop_delay_ms });
      }
    }

    return {
      meta: {
        date: new Date().toISOString(),
        bun: Bun.version,
        cores: navigator.hardwareConcurrency,
        cpu: cpus()[0]?.model ?? "unknown",
        quick: QUICK,
        scale: SCALE,
        providers: PROVIDERS,
        gateway_log_level: LOG_LEVEL,
        warmup_ms: WARMUP_MS > 0 ? Math.round(WARMUP_MS * SCALE) : 0,
        stall_ms: STALL_MS,
        load_average_before: loadBefore.map((x) => Math.round(x * 100) / 100),
        load_average_after: loadavg().map((x) => Math.round(x * 100) / 100),
        driver: "separate process (Bun fetch, keep-alive), same machine",
        wall_s: Math.round((performance.now() - started) / 1000),
      },
      paths: results,
      // A partial run (BENCH_PHASES) has no tables to derive.
      derived: PHASES === undefined ? derive(results) : (undefined as unknown as ReturnType<typeof derive>),
    };
  } finally {
    await procs.stop();
  }
}

/**
 * The cluster's figures beside the embedded ones (issue 22): test/bench/cluster-hop.ts in its own
 * process once the embedded paths are done, so their servers are gone; its one JSON object, as printed.
 */
async function clusterFigures(): Promise<ClusterFigures> {
  const missing = postgresMissing ?? redisMissing;
  if (missing) return { skipped: missing };
  const child = Bun.spawn(["bun", join(import.meta.dir, "cluster-hop.ts")], { stdout: "pipe", stderr: "inherit" });
  const out = await new Response(child.stdout).text();
  if ((await child.exited) !== 0) return { skipped: `cluster-hop.ts exited with code ${child.exitCode}` };
  return JSON.parse(out.slice(out.indexOf("{"))) as ClusterFigures;
}

/**
 * Issue 27's RSS budget at 1,024 and 4,096 live streams, judged with all N live at once: the stream
 * ladder's paced streams do not all overlap on two cores, so test/bench/memory.ts holds N slow streams
 * open on a fresh gateway (after its warm-up) and reads VmRSS while every one of them is live.
 */
async function heldStreamFigures(): Promise<HeldStreamFigures> {
  const file = join(tmpdir(), `bench-held-${process.pid}.json`);
  const child = Bun.spawn(["bun", join(import.meta.dir, "memory.ts")], {
    env: { ...env, MEM_LEVELS: "1024,4096", MEM_AFTER_LOAD: "0", MEM_JSON: file },
    stdout: "ignore",
    stderr: "inherit",
  });
  if ((await child.exited) !== 0) return { skipped: `memory.ts exited with code ${child.exitCode}` };
  const measured = JSON.parse(readFileSync(file, "utf8")) as { levels: { streams: number; idle_mb: number; live_mb: number | null; per_stream_kb: number | null }[] };
  rmSync(file, { force: true });
  return { levels: measured.levels };
}

const result = await main();
if (PHASES !== undefined) {
  // A partial run: the report's tables need every phase, so each path's figures as measured.
  console.log(JSON.stringify({ meta: result.meta, paths: result.paths }, null, 2));
  process.exit(0);
}
if (!QUICK && env.BENCH_HELD !== "0") {
  console.error("[bench] RSS with 1,024 and 4,096 streams held live (test/bench/memory.ts) …");
  result.held = await heldStreamFigures();
}
if (!QUICK && env.BENCH_CLUSTER !== "0") {
  console.error("[bench] cluster figures (test/bench/cluster-hop.ts) …");
  result.cluster = await clusterFigures();
}
const json = JSON.stringify(result, null, 2);
if (env.BENCH_JSON) writeFileSync(env.BENCH_JSON, `${json}\n`);
if (env.BENCH_WRITE !== "0" && !QUICK) {
  if (!env.BENCH_JSON) writeFileSync(join(ROOT, "docs/benchmarks.json"), `${json}\n`);
  writeMarkdown(env.BENCH_MD ?? join(ROOT, "docs/benchmarks.md"), renderMarkdown(result));
}
console.log(renderMarkdown(result));
