// Gateway memory: idle RSS and RSS per live stream of `gateway serve`, in isolation (issue 7 targets:
// ≤ 150 MB idle, ≤ 50 KB per live stream). `bun run bench` samples RSS as a side effect of its stream
// ladder, after its load phases; this script isolates the two figures and attributes them.
//
//   bun test/bench/memory.ts
//
// For each stream level N (MEM_LEVELS, default 0,100,256,512) a fresh stack is started — the gateway
// (`bun src/main.ts serve`, enforce mode, the same configuration as stack.ts) with MEM_PROVIDERS
// provider runtimes (`gateway provider --engine openai`, default 4) in front of the benchmark's mock —
// so freed memory of an earlier level cannot hide a later level's cost. Per level:
//   1. warm-up: 50 non-streaming requests (MEM_WARMUP) and 20 short streams, one at a time (JIT,
//      pools, caches); with MEM_WARMUP=1500 the heaps, allocator and SQLite cache have grown to their
//      working size first, so the per-stream figure is what one more live stream costs a gateway that
//      has served traffic (the default's includes that growth: 512 streams start in the same instant);
//   2. idle: the gateway's VmRSS (/proc/PID/status), median of 10 samples over 1 s;
//   3. live: N streams held by a holder process of its own (each a slow mock stream of 16-byte deltas,
//      one every 100 ms up to 1,024 streams and slower beyond, ~10,240 a second in all: see deltaMs;
//      long enough to outlive the measurement), opened at most 256 waiting at a time, a reset connect
//      tried again and counted; once every stream has its first content frame, 2 s pass, then the
//      median of 20 samples over 2 s; per stream = (live − idle) / N. The holder reports how late each
//      stream's latest delta is: a level whose streams fall behind counts queued output, not streams.
// Then one more fresh stack measures idle after load — the retry replay cache and the heap's high-water
// mark after the kind of traffic `bun run bench` sends before it reads its idle figure.
//
// MEM_HEAP=1 runs the gateway in a host process (this file, `host` mode) that imports src/main.ts with
// `serve` argv — the same module graph — and answers heap questions over IPC: after Bun.gc(true), the
// JSC heap size and object counts by type from bun:jsc (importing bun:jsc costs the host ~1 MB, so RSS
// figures are reported from plain runs). MEM_SNAPSHOT=DIR writes the gateway's /proc smaps at idle and
// live (idle-N.smaps, live-N.smaps) and, with MEM_HEAP=1, V8-format heap snapshots
// (idle-N.heapsnapshot, live-N.heapsnapshot; test/bench/heapDiff.ts attributes them).
// MEM_JSON=FILE writes the result as JSON; MEM_BUN_FLAGS (e.g.
// `--smol`) is passed to the gateway's bun; MEM_AFTER_LOAD=0 skips the after-load stack; MEM_PROMPT_BYTES
// sets the user message's length (default 256).
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { LoadResult, LoadSpec } from "./driver.ts";
import { FETCH_ENV, GATEWAY_ENV, MAIN, PROVIDER_ENV, Processes, rssMb, startMock } from "./stack.ts";
import { settingSpecs } from "../../src/config/index.ts";
import { createHash } from "node:crypto";

const env = process.env;
const LEVELS = (env.MEM_LEVELS ?? "0,100,256,512").split(",").map(Number);
const PROVIDERS = Number(env.MEM_PROVIDERS ?? 4);
const HEAP = env.MEM_HEAP === "1";
const AFTER_LOAD = env.MEM_AFTER_LOAD !== "0";
const SNAPSHOT_DIR = env.MEM_SNAPSHOT ?? "";
/** Extra flags for the gateway's bun (e.g. `--smol`), to compare runtime settings. */
const BUN_FLAGS = (env.MEM_BUN_FLAGS ?? "").split(" ").filter(Boolean);

/**
 * Milliseconds between a held stream's deltas: by default 100 up to 1,024 streams and slower beyond,
 * so that the gateway relays the same ~10,240 chunks a second at every level (4,096 streams: 400 ms).
 * At 100 ms, 4,096 streams are 41,000 chunks a second, more than this two-core machine carries
 * through the whole stack: the streams fall seconds behind and RSS counts queued output, not what a
 * live stream holds (docs/benchmarks.md, "Held RSS pass"). MEM_DELTA_MS fixes it for every level.
 */
const deltaMs = (n: number): number => Number(env.MEM_DELTA_MS ?? Math.max(100, Math.round((n * 100) / 1024)));
/** Slow enough that a stream outlives the measurement (200 s of deltas); fast enough to keep the stream idle timer quiet. */
const slowModel = (n: number): string => `bench-sse-n${Math.ceil(200_000 / deltaMs(n))}-i${deltaMs(n)}`;
const MODELS = ["bench-json", "bench-json-d20", "bench-sse-n4-i0", "bench-sse-n256-i0", ...new Set(LEVELS.filter((n) => n > 0).map(slowModel))];
const modelHash = (id: string) => createHash("sha256").update(`bench-weights:${id}`).digest("hex");
/** MEM_PROMPT_BYTES (default 256): real buyers send up to 512 KiB, and a stream must not keep its prompt. */
const USER_MESSAGE = "x".repeat(Number(env.MEM_PROMPT_BYTES ?? 256));
/** `distinct` makes the body unique, as real buyers' are (identical bodies share one replay-cache slot). */
const body = (model: string, stream: boolean, maxTokens: number, distinct?: number) =>
  JSON.stringify({ model, stream, max_tokens: maxTokens, messages: [{ role: "user", content: distinct === undefined ? USER_MESSAGE : `${distinct} ${USER_MESSAGE}` }] });

type Proc = ReturnType<typeof Bun.spawn>;
/** capacity_mb: what the JSC heap has reserved (≥ heap_mb); mimalloc_mb: memory committed by Bun's native allocator. */
type HeapReport = { rss_mb: number; heap_mb: number; extra_mb: number; capacity_mb: number; mimalloc_mb: number; objects: Record<string, number> };

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
};
const round1 = (x: number) => Math.round(x * 10) / 10;

async function sampleRss(pid: number, n: number, everyMs: number): Promise<number> {
  const xs: number[] = [];
  for (let i = 0; i < n; i++) {
    xs.push(rssMb(pid));
    await Bun.sleep(everyMs);
  }
  return median(xs);
}

interface Stack {
  url: string;
  apiKey: string;
  gateway: Proc;
  /** Host mode only: heap figures after a full GC. */
  heap?: (snapshotFile?: string) => Promise<HeapReport>;
}

/** stack.ts's startGatewayStack, with a slow model added and an optional host-mode gateway. */
async function startStack(p: Processes, mockUrl: string): Promise<Stack> {
  p.cli(["catalog", "init"]);
  for (const m of MODELS) p.cli(["catalog", "add", "--model-id", m, "--model-hash", modelHash(m), "--hash-scope", "gguf-file-v1"]);
  const { account_id, api_key } = JSON.parse(p.cli(["accounts", "create", "--tier", "paid", "--name", "bench"])) as { account_id: string; api_key: string };
  p.cli(["credits", "grant", "--account", account_id, "--credits", String(1e15), "--memo", "benchmark"]);
  const known = new Set<string>(settingSpecs.map((spec) => spec.key));
  const raised = Object.fromEntries(
    Object.entries({ paidConcurrentRequests: 100_000, freeConcurrentRequests: 100_000, paidDailyTokens: 0 }).filter(([k]) => known.has(k)),
  );
  const configFile = join(p.dataDir, "gateway.json");
  writeFileSync(
    configFile,
    JSON.stringify({ port: 0, dataDir: p.dataDir, settlementMode: "enforce", logLevel: "info", provisionalAdmissionsPerHour: 1000, ...raised }),
  );
  let heap: Stack["heap"];
  let gateway: Proc;
  if (HEAP) {
    const waiting: ((r: HeapReport) => void)[] = [];
    gateway = Bun.spawn(["bun", ...BUN_FLAGS, import.meta.path, "host", configFile], {
      stdout: Bun.file(join(p.dataDir, "gateway.log")),
      stderr: "inherit",
      ipc: (message) => waiting.shift()?.(message as HeapReport),
    });
    p.all.push(gateway);
    heap = (snapshotFile) => {
      const r = new Promise<HeapReport>((resolve) => waiting.push(resolve));
      gateway.send({ snapshot: snapshotFile ?? null });
      return r;
    };
  } else {
    gateway = p.spawn(["bun", ...BUN_FLAGS, MAIN, "serve", "--config", configFile], { env: GATEWAY_ENV, log: "gateway.log" });
  }
  const listening = await p.line("gateway.log", (l) => l.event === "gateway_listening");
  const url = `http://127.0.0.1:${listening.port}`;
  for (let i = 0; i < PROVIDERS; i++) {
    p.spawn(
      [
        "bun", MAIN, "provider",
        "--gateway", `ws://127.0.0.1:${listening.port}/v1/provider/connect`,
        "--id", `bench-provider-${i}`,
        "--key-file", join(p.dataDir, `provider-${i}.key`),
        "--engine", "openai",
        "--upstream", mockUrl,
        "--max-concurrency", "1024",
        ...MODELS.flatMap((m) => ["--model", `${m}=${modelHash(m)}`]),
      ],
      { env: { ...FETCH_ENV, ...PROVIDER_ENV }, log: `provider-${i}.log` },
    );
  }
  const deadline = performance.now() + 20_000;
  for (;;) {
    const models = (await (await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${api_key}` } })).json()) as { data?: { id: string }[] };
    const status = (await (await fetch(`${url}/v1/status`)).json()) as { pool: { providers_admitted: number } };
    const ids = new Set((models.data ?? []).map((m) => m.id));
    if (status.pool.providers_admitted === PROVIDERS && MODELS.every((m) => ids.has(m))) break;
    if (performance.now() > deadline) throw new Error(`stack not ready: ${JSON.stringify(status)}`);
    await Bun.sleep(50);
  }
  return { url, apiKey: api_key, gateway, heap };
}

async function warmUp(s: Stack): Promise<void> {
  const init = (b: string) => ({ method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${s.apiKey}` }, body: b });
  for (let i = 0; i < Number(env.MEM_WARMUP ?? 50); i++) await (await fetch(`${s.url}/v1/chat/completions`, init(body("bench-json", false, 16)))).arrayBuffer();
  for (let i = 0; i < 20; i++) await (await fetch(`${s.url}/v1/chat/completions`, init(body("bench-sse-n4-i0", true, 4)))).arrayBuffer();
}

async function liveRequests(url: string): Promise<number> {
  return ((await (await fetch(`${url}/healthz`)).json()) as { live_requests: number }).live_requests;
}

/** The kernel's count of connections dropped because a listen queue was full (machine-wide; TcpExt ListenOverflows). */
function listenOverflows(): number {
  const lines = readFileSync("/proc/net/netstat", "utf8").split("\n").filter((l) => l.startsWith("TcpExt:"));
  const names = lines[0]!.split(/\s+/);
  return Number(lines[1]!.split(/\s+/)[names.indexOf("ListenOverflows")]);
}

/** Opens N slow streams in a holder process; resolves once each has its first content frame. */
async function holdStreams(s: Stack, n: number): Promise<HoldReady & { listen_overflows: number; stats: () => Promise<HoldStats>; stop: () => Promise<void> }> {
  const overflowsBefore = listenOverflows();
  let ready!: (m: HoldReady) => void;
  const readyP = new Promise<HoldReady>((r) => (ready = r));
  const asked: ((m: HoldStats) => void)[] = [];
  let isReady = false;
  const holder = Bun.spawn(["bun", import.meta.path, "hold", s.url, s.apiKey, String(n)], {
    env: { ...env, ...FETCH_ENV },
    stdout: "inherit",
    stderr: "inherit",
    ipc: (m) => {
      if (isReady) asked.shift()?.(m as HoldStats);
      else {
        isReady = true;
        ready(m as HoldReady);
      }
    },
  });
  // The admission gate starts 32 requests a turn (docs/decisions.md, "Live streams first"): 4,096 held
  // streams take ~5–15 s to all have a first frame here, and streams that fall behind far longer. The
  // slow stream lasts 200 s, so every one is still live once the last has started.
  let timer: ReturnType<typeof setTimeout> | undefined;
  const gaveUp = new Promise<HoldReady>((r) => (timer = setTimeout(() => r({ ok: -1, failed: -1, connect_retries: -1, ramp_s: -1 }), 180_000)));
  // The timer is cleared once the holder is ready: a pending one kept the process (and the heavy lock) for up to 180 s after its last level.
  const r = await Promise.race([readyP, gaveUp]).finally(() => clearTimeout(timer));
  if (r.failed !== 0 || r.ok !== n) {
    holder.kill("SIGKILL");
    throw new Error(`holder: ${JSON.stringify(r)}`);
  }
  return {
    ...r,
    listen_overflows: listenOverflows() - overflowsBefore,
    stats() {
      const p = new Promise<HoldStats>((resolve) => asked.push(resolve));
      holder.send("stats");
      return p;
    },
    async stop() {
      holder.kill("SIGKILL");
      await holder.exited;
      // The gateway sees every buyer leave; wait until it has closed them all.
      const deadline = performance.now() + 20_000;
      while ((await liveRequests(s.url)) > 0 && performance.now() < deadline) await Bun.sleep(100);
    },
  };
}

async function drive(spec: LoadSpec): Promise<LoadResult> {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...env, ...FETCH_ENV }, stdout: "pipe", stderr: "inherit" });
  const out = await new Response(proc.stdout).text();
  if ((await proc.exited) !== 0) throw new Error(`driver failed: ${out}`);
  return JSON.parse(out) as LoadResult;
}

const figures = ({ objects: _, ...rest }: HeapReport): Omit<HeapReport, "objects"> => rest;

/** Object types whose count changed most between two heap reports, per stream. */
function objectDelta(a: HeapReport, b: HeapReport, n: number): Record<string, number> {
  const d: [string, number][] = [];
  for (const k of new Set([...Object.keys(a.objects), ...Object.keys(b.objects)])) {
    const x = (b.objects[k] ?? 0) - (a.objects[k] ?? 0);
    if (Math.abs(x) >= n / 2) d.push([k, Math.round((x / Math.max(1, n)) * 10) / 10]);
  }
  return Object.fromEntries(d.sort((x, y) => Math.abs(y[1]) - Math.abs(x[1])).slice(0, 25));
}

interface LevelResult {
  streams: number;
  idle_mb: number;
  live_mb: number | null;
  per_stream_kb: number | null;
  /**
   * How the streams stood while RSS was sampled: the delta interval, the ramp's length and retried
   * connects, streams still reading, reads a second the holder got (N × 1000 / delta_ms while every
   * stream keeps pace; fewer when deltas merge), and how late each stream's latest delta was (a lag of
   * seconds is output queued somewhere, counted in RSS).
   */
  holder?: {
    delta_ms: number;
    ramp_s: number;
    connect_retries: number;
    listen_overflows: number;
    live_streams: number;
    gateway_live_requests: number;
    chunks_per_s: number;
    lag_ms: { p50: number; p99: number; max: number };
    keeps_pace: boolean;
  };
  heap_idle?: Omit<HeapReport, "objects">;
  heap_live?: Omit<HeapReport, "objects">;
  heap_per_stream_kb?: number;
  capacity_per_stream_kb?: number;
  mimalloc_per_stream_kb?: number;
  objects_per_stream?: Record<string, number>;
}

async function measureLevel(mockUrl: string, n: number): Promise<LevelResult> {
  const p = new Processes();
  try {
    const s = await startStack(p, mockUrl);
    await warmUp(s);
    await Bun.sleep(1000);
    const snapshot = (name: string) => (SNAPSHOT_DIR ? join(SNAPSHOT_DIR, `${name}-${n}.heapsnapshot`) : undefined);
    const idleHeap = s.heap ? await s.heap(snapshot("idle")) : undefined;
    const idle = await sampleRss(s.gateway.pid, 10, 100);
    if (SNAPSHOT_DIR) writeFileSync(join(SNAPSHOT_DIR, `idle-${n}.smaps`), readFileSync(`/proc/${s.gateway.pid}/smaps`));
    const out: LevelResult = { streams: n, idle_mb: round1(idle), live_mb: null, per_stream_kb: null };
    if (idleHeap) out.heap_idle = figures(idleHeap);
    if (n > 0) {
      const hold = await holdStreams(s, n);
      await Bun.sleep(2000);
      const before = await hold.stats();
      const t = performance.now();
      const live = await sampleRss(s.gateway.pid, 20, 100);
      const after = await hold.stats();
      out.holder = {
        delta_ms: deltaMs(n),
        ramp_s: hold.ramp_s,
        connect_retries: hold.connect_retries,
        listen_overflows: hold.listen_overflows,
        live_streams: after.live,
        gateway_live_requests: await liveRequests(s.url),
        chunks_per_s: Math.round(((after.chunks - before.chunks) * 1000) / (performance.now() - t)),
        lag_ms: { p50: after.lag_p50_ms, p99: after.lag_p99_ms, max: after.lag_max_ms },
        // Every stream's latest delta at most an interval and a second old: a second's deltas at most
        // wait anywhere (~1 KB a stream at 100 ms), not a backlog growing with the machine's load.
        keeps_pace: after.live === n && after.lag_p99_ms <= deltaMs(n) + 1000,
      };
      if (SNAPSHOT_DIR) writeFileSync(join(SNAPSHOT_DIR, `live-${n}.smaps`), readFileSync(`/proc/${s.gateway.pid}/smaps`));
      out.live_mb = round1(live);
      out.per_stream_kb = Math.round(((live - idle) * 1024) / n);
      if (s.heap && idleHeap) {
        const h = await s.heap(snapshot("live"));
        out.heap_live = figures(h);
        out.heap_per_stream_kb = Math.round(((h.heap_mb - idleHeap.heap_mb) * 1024) / n);
        out.capacity_per_stream_kb = Math.round(((h.capacity_mb - idleHeap.capacity_mb) * 1024) / n);
        out.mimalloc_per_stream_kb = Math.round(((h.mimalloc_mb - idleHeap.mimalloc_mb) * 1024) / n);
        out.objects_per_stream = objectDelta(idleHeap, h, n);
      }
      await hold.stop();
    }
    console.error(`[memory] ${JSON.stringify(out)}`);
    return out;
  } finally {
    await p.stop();
  }
}

/** Idle RSS after roughly the traffic `bun run bench` sends before it reads its idle figure. */
async function measureAfterLoad(mockUrl: string): Promise<Record<string, unknown>> {
  const p = new Processes();
  try {
    const s = await startStack(p, mockUrl);
    await warmUp(s);
    await Bun.sleep(1000);
    const fresh = await sampleRss(s.gateway.pid, 10, 100);
    const freshHeap = s.heap ? await s.heap() : undefined;
    const headers = { "content-type": "application/json", authorization: `Bearer ${s.apiKey}` };
    const url = `${s.url}/v1/chat/completions`;
    const a = await drive({ mode: "load", url, headers, body: body("bench-json", false, 16), concurrency: 1, warmupMs: 500, durationMs: 5000 });
    const b = await drive({ mode: "load", url, headers, body: body("bench-json-d20", false, 16), concurrency: 128, warmupMs: 500, durationMs: 5000 });
    const c = await drive({ mode: "load", url, headers, body: body("bench-sse-n256-i0", true, 256), concurrency: 32, warmupMs: 0, durationMs: 5000 });
    await Bun.sleep(1000);
    const after = await sampleRss(s.gateway.pid, 10, 100);
    const loadHeap = s.heap ? await s.heap() : undefined;
    // The same again with every body distinct, as real traffic is: the replay cache keeps each result.
    const filled = await fill(s.url, s.apiKey);
    await Bun.sleep(1000);
    const afterDistinct = await sampleRss(s.gateway.pid, 10, 100);
    // Freed memory goes back to the system late (allocator scavenging), if at all: sampled again later.
    await Bun.sleep(15_000);
    const afterDistinctLater = await sampleRss(s.gateway.pid, 10, 100);
    const out: Record<string, unknown> = {
      requests: { json_c1: a.ok, json_c128: b.ok, sse_256_deltas_c32: c.ok },
      idle_fresh_mb: round1(fresh),
      idle_after_load_mb: round1(after),
      distinct_requests: filled,
      idle_after_distinct_mb: round1(afterDistinct),
      idle_after_distinct_16s_mb: round1(afterDistinctLater),
    };
    if (s.heap && freshHeap) {
      const h = await s.heap();
      out.heap_fresh = figures(freshHeap);
      out.heap_after_load = figures(loadHeap!);
      out.heap_after_distinct = figures(h);
      out.objects_retained = objectDelta(freshHeap, h, 1000);
    }
    console.error(`[memory] after load ${JSON.stringify(out)}`);
    return out;
  } finally {
    await p.stop();
  }
}

/** 20,000 non-streaming requests (64 at a time) and 1,000 streams of 256 deltas (32 at a time), every body distinct. */
async function fill(url: string, apiKey: string): Promise<{ json: number; sse: number }> {
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}` };
  let next = 0;
  const run = async (total: number, c: number, make: (i: number) => string): Promise<number> => {
    let ok = 0;
    const end = next + total;
    const worker = async () => {
      while (next < end) {
        const i = next++;
        const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers, body: make(i) });
        await r.arrayBuffer();
        if (r.status === 200) ok++;
      }
    };
    await Promise.all(Array.from({ length: c }, worker));
    return ok;
  };
  const json = await run(20_000, 64, (i) => body("bench-json", false, 16, i));
  const sse = await run(1_000, 32, (i) => body("bench-sse-n256-i0", true, 256, i));
  return { json, sse };
}

async function main(): Promise<void> {
  const procs = new Processes();
  try {
    const mock = await startMock(procs, MODELS);
    const levels: LevelResult[] = [];
    for (const n of LEVELS) levels.push(await measureLevel(mock.url, n));
    const afterLoad = AFTER_LOAD ? await measureAfterLoad(mock.url) : null;
    const result = { date: new Date().toISOString(), bun: Bun.version, providers: PROVIDERS, heap_mode: HEAP, levels, after_load: afterLoad };
    if (env.MEM_JSON) writeFileSync(env.MEM_JSON, `${JSON.stringify(result, null, 2)}\n`);
    console.log("| streams | idle RSS MB | live RSS MB | per stream KB | delta every ms | live while sampled | chunks/s | delta lag p50 / p99 ms | keeps pace | ramp s | connects retried |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (const l of levels) {
      const h = l.holder;
      const held = h ? `${h.delta_ms} | ${h.live_streams} | ${h.chunks_per_s} | ${h.lag_ms.p50} / ${h.lag_ms.p99} | ${h.keeps_pace ? "yes" : "**no**"} | ${h.ramp_s} | ${h.connect_retries}` : "– | – | – | – | – | – | –";
      console.log(`| ${l.streams} | ${l.idle_mb} | ${l.live_mb ?? "–"} | ${l.per_stream_kb ?? "–"} | ${held} |`);
    }
    if (afterLoad) {
      console.log(`\nidle fresh ${afterLoad.idle_fresh_mb} MB → after load, identical bodies ${afterLoad.idle_after_load_mb} MB (${JSON.stringify(afterLoad.requests)})`);
      console.log(`→ after distinct bodies ${afterLoad.idle_after_distinct_mb} MB (${JSON.stringify(afterLoad.distinct_requests)}); 16 s later ${afterLoad.idle_after_distinct_16s_mb} MB`);
    }
  } finally {
    await procs.stop();
  }
}

/** What the holder tells the parent: once every stream is live, and when asked during the sampling. */
type HoldReady = { ok: number; failed: number; connect_retries: number; ramp_s: number };
type HoldStats = { live: number; chunks: number; lag_p50_ms: number; lag_p99_ms: number; lag_max_ms: number };

/**
 * `hold URL KEY N`: N slow streams, at most MEM_HOLD_OPENING (default 256, half of Bun's listen backlog
 * of 512: thousands of connects at once overflow the gateway's accept queue and some come back reset)
 * waiting for their first content frame at a time, the next opened as one gets it; a connect reset
 * before any response is tried again with a new body (MEM_HOLD_RETRIES times, counted). Then it keeps
 * reading, and answers the parent's `stats` with how many streams still read and how late their
 * latest delta is (the mock stamps each delta with the microsecond it wrote it).
 */
async function hold(url: string, apiKey: string, n: number): Promise<void> {
  const opening = Math.max(1, Number(env.MEM_HOLD_OPENING ?? 256));
  const maxRetries = Number(env.MEM_HOLD_RETRIES ?? 5);
  let ok = 0;
  let failed = 0;
  let retries = 0;
  let live = 0;
  let chunks = 0;
  /** Each stream's latest read (its stamp is parsed only when the parent asks, not a chunk). */
  const latest: (Uint8Array | undefined)[] = new Array(n);
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}` };
  const marker = new TextEncoder().encode('"content":"');
  const decoder = new TextDecoder();
  /** Resolves once stream i has its first content frame (or failed); its reading goes on. */
  const one = (i: number): Promise<void> =>
    new Promise<void>((started) => {
      void (async () => {
        for (let attempt = 0; ; attempt++) {
          let res: Response;
          try {
            res = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers, body: body(slowModel(n), true, 4096, i + attempt * n) });
          } catch (error) {
            if (attempt < maxRetries && /ECONNRESET|ECONNREFUSED|closed unexpectedly/i.test(String(error))) {
              retries++;
              await Bun.sleep(50 * (attempt + 1));
              continue;
            }
            failed++;
            console.error(`[memory hold] ${String(error)}`);
            return started();
          }
          let counted = false;
          try {
            if (res.status !== 200 || !res.body) throw new Error(`status ${res.status}: ${await res.text()}`);
            live++;
            const reader = res.body.getReader();
            for (;;) {
              const { value, done } = await reader.read();
              if (done) break;
              chunks++;
              latest[i] = value;
              if (!counted && decoder.decode(value).includes('"content":"')) {
                counted = true;
                ok++;
                started();
              }
            }
          } catch (error) {
            if (!counted) console.error(`[memory hold] ${String(error)}`);
          }
          live--;
          if (!counted) {
            failed++;
            started();
          }
          return;
        }
      })();
    });
  const t0 = performance.now();
  let next = 0;
  const progress = setInterval(() => console.error(`[memory hold] ${round1((performance.now() - t0) / 1000)} s: ${ok} streams live, ${failed} failed, ${retries} connects retried`), 10_000);
  const opener = async () => {
    while (next < n) await one(next++);
  };
  await Promise.all(Array.from({ length: Math.min(opening, n) }, opener));
  clearInterval(progress);
  const lagMs = (chunk: Uint8Array, nowUs: number): number | null => {
    let at = -1;
    for (let j = chunk.length - marker.length - 16; j >= 0; j--) {
      let m = 0;
      while (m < marker.length && chunk[j + m] === marker[m]) m++;
      if (m === marker.length) {
        at = j + m;
        break;
      }
    }
    if (at < 0) return null;
    const stamp = Number(decoder.decode(chunk.subarray(at, at + 16)));
    return Number.isFinite(stamp) ? (nowUs - stamp) / 1000 : null;
  };
  process.on("message", () => {
    const nowUs = (performance.timeOrigin + performance.now()) * 1000;
    const lags = latest.flatMap((c) => (c ? [lagMs(c, nowUs)] : [])).filter((x): x is number => x !== null).sort((a, b) => a - b);
    const at = (q: number) => round1(lags[Math.min(lags.length - 1, Math.floor(q * lags.length))] ?? NaN);
    process.send!({ live, chunks, lag_p50_ms: at(0.5), lag_p99_ms: at(0.99), lag_max_ms: round1(lags.at(-1) ?? NaN) } satisfies HoldStats);
  });
  process.send!({ ok, failed, connect_retries: retries, ramp_s: round1((performance.now() - t0) / 1000) } satisfies HoldReady);
}

/** `host CONFIG`: `gateway serve` (src/main.ts, same module graph) plus heap reports over IPC. */
async function host(configFile: string): Promise<void> {
  const { heapStats, memoryUsage } = await import("bun:jsc");
  process.on("message", (message: { snapshot?: string | null }) => {
    Bun.gc(true);
    const h = heapStats();
    const report = {
      rss_mb: round1(Number(/VmRSS:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))![1]) / 1024),
      heap_mb: round1(h.heapSize / 1048576),
      extra_mb: round1(h.extraMemorySize / 1048576),
      capacity_mb: round1(h.heapCapacity / 1048576),
      mimalloc_mb: round1(memoryUsage().currentCommit / 1048576),
      objects: h.objectTypeCounts,
    } satisfies HeapReport;
    // After the figures: the snapshot's own text would count in them.
    if (message?.snapshot) writeFileSync(message.snapshot, Bun.generateHeapSnapshot("v8"));
    process.send!(report);
  });
  process.argv = [process.argv[0]!, MAIN, "serve", "--config", configFile];
  await import(MAIN);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === "hold") await hold(args[0]!, args[1]!, Number(args[2]));
else if (mode === "host") await host(args[0]!);
else await main();
