// The cluster's own figures (docs/scale-out.md, "Measured"), beside the embedded mode, on loopback:
//   hop         two or three nodes on one PostgreSQL and one Redis, one provider runtime (openai engine → the
//               bench mock, test/bench/mock.ts) on node 1; the same streams asked of node 1 (provider
//               local), of node 2 (job, frames and `settled` cross a node link) and of node 3 (links
//               off: they cross Redis pub/sub), interleaved one at a time. TTFT and each delta's
//               transit (arrival − the mock's write stamp) compared with node 1's.
//   throughput  closed-loop short requests (non-streaming, the mock answers at once) for a fixed time
//               against: the embedded gateway (SQLite), one cluster node, and two cluster nodes (the
//               load split between them, one provider runtime on each); req/s and the CPU seconds of
//               every process (gateway nodes, providers, mock, Redis, PostgreSQL, this driver).
// Prints one JSON object. Runs alone (`bun run bench:cluster`); run it under the heavy lock on a quiet
// machine. Environment: BENCH_HOP_STREAMS (default 2000 per path), BENCH_HOP_PATHS (default
// "same,cross,pubsub"), BENCH_HOP_BLOCKS (default 4), BENCH_HOP_MODEL (default bench-sse-n8-i2), BENCH_LOAD_MS (default 10000),
// BENCH_CONCURRENCY (default 64), BENCH_PARTS (default "hop,throughput"; "throughput" alone for A/B loops, or any of
// "embedded", "one", "two" for those throughput runs only), BENCH_PG_STATEMENTS=N (the cluster runs also
// list PostgreSQL's N costliest statements of the window per request, nested ones included, from
// pg_stat_statements), BENCH_CPU_PROF=DIR (the embedded gateway and the cluster nodes of the throughput runs profiled, as
// `bun run bench` profiles its gateway).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadavg } from "node:os";
import { modelHash, MAIN, collectJsonLines, waitFor } from "../support/harness.ts";
import { startCluster, type ClusterNodeProcess, type TestCluster } from "../support/cluster.ts";
import { sharedPostgres } from "../support/postgres.ts";
import { settingSpecs } from "../../src/config/settings.ts";
import { cpuSeconds, postgresCpuSeconds } from "./children.ts";

const HOP_STREAMS = Number(process.env.BENCH_HOP_STREAMS ?? 2000);
// The paths the hop asks, interleaved one stream at a time (pubsub: a third node with links off).
const HOP_PATHS = new Set((process.env.BENCH_HOP_PATHS ?? "same,cross,pubsub").split(","));
// The interleaved sequence is cut into this many blocks, each summarised on its own: the spread of a
// p99 within one run (with 300 streams a path, a p99 was the 3rd-worst stream of each).
const HOP_BLOCKS = Number(process.env.BENCH_HOP_BLOCKS ?? 4);

const LOAD_MS = Number(process.env.BENCH_LOAD_MS ?? 10_000);
const WARMUP_MS = Math.min(3000, LOAD_MS / 3);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);
// 8 deltas 2 ms apart: TTFT needs only the first, and 2,000 streams a path stay ~2 minutes in all.
const STREAM_MODEL = process.env.BENCH_HOP_MODEL ?? "bench-sse-n8-i2";
const JSON_MODEL = "bench-json";
const MODELS = [STREAM_MODEL, JSON_MODEL];
const PARTS = new Set((process.env.BENCH_PARTS ?? "hop,throughput").split(","));
const runs = (part: "embedded" | "one" | "two") => PARTS.has("throughput") || PARTS.has(part);
const FETCH_ENV = { BUN_CONFIG_MAX_HTTP_REQUESTS: "65535" };
const PG_STATEMENTS = Number(process.env.BENCH_PG_STATEMENTS ?? 0);
// BENCH_CPU_PROF=DIR: the throughput runs' cluster nodes run under `bun --cpu-prof` (Markdown profiles in DIR).
const PROFILE_DIR = process.env.BENCH_CPU_PROF;
// Read by test/support/postgres.ts when it starts the shared server (after this module's imports).
if (PG_STATEMENTS > 0) {
  process.env.GATEWAY_TEST_PG_OPTIONS = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all";
}

type Proc = ReturnType<typeof Bun.spawn>;
let mockPid = 0;
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};
const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;


/** The mock upstream as a process of its own. */
async function startMock(): Promise<{ url: string; proc: Proc }> {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "mock.ts"), "--models", MODELS.join(",")], { stdout: "pipe", stderr: "inherit" });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  await waitFor(() => events.some((e) => e.event === "mock_listening"), 15_000, "mock_listening");
  return { url: events.find((e) => e.event === "mock_listening")!.url as string, proc };
}

/** A provider runtime with the openai engine on the mock, connected to `gatewayWs`. */
function startProvider(id: string, gatewayWs: string, mockUrl: string, keyDir: string): Proc {
  const args = ["bun", MAIN, "provider", "--gateway", gatewayWs, "--id", id, "--key-file", join(keyDir, `${id}.key`), "--engine", "openai"];
  args.push("--upstream", mockUrl, "--max-concurrency", "1024", ...MODELS.flatMap((m) => ["--model", `${m}=${modelHash(m)}`]));
  return Bun.spawn(args, { stdout: "ignore", stderr: "inherit", env: { ...process.env, ...FETCH_ENV } });
}

/** Settings an operator raises for one heavy paid buyer (those this build knows). */
function raisedLimits(): Record<string, unknown> {
  const known = new Set<string>(settingSpecs.map((s) => s.key));
  const limits = { paidConcurrentRequests: 100_000, freeConcurrentRequests: 100_000, paidDailyTokens: 0, provisionalAdmissionsPerHour: 1000 };
  return Object.fromEntries(Object.entries(limits).filter(([k]) => known.has(k)));
}

/** The same settings as `gateway serve` flags, for cluster nodes. */
const raisedLimitFlags = (): string[] =>
  Object.entries(raisedLimits()).flatMap(([key, value]) => [settingSpecs.find((s) => s.key === key)!.flag, String(value)]);

async function routable(url: string, apiKey: string, providers: number): Promise<void> {
  await waitFor(
    async () => {
      const health = (await (await fetch(`${url}/healthz`)).json()) as { providers_admitted: number };
      const models = (await (await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${apiKey}` } })).json()) as { data?: { id: string }[] };
      const ids = new Set((models.data ?? []).map((m) => m.id));
      return health.providers_admitted >= providers && MODELS.every((m) => ids.has(m));
    },
    30_000,
    `${url}: ${providers} providers and the bench models routable`,
  );
}

/** One stream: TTFT (first content delta) and each delta's transit from the mock's stamp. */
async function stream(url: string, apiKey: string, i: number): Promise<{ ttft: number; transits: number[] }> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: STREAM_MODEL, stream: true, max_tokens: 64, messages: [{ role: "user", content: `hop ${i}` }] }),
  });
  if (res.status !== 200) throw new Error(`${url}: ${res.status} ${await res.text()}`);
  const decoder = new TextDecoder();
  let ttft = -1;
  let buffered = "";
  const transits: number[] = [];
  for await (const bytes of res.body!) {
    const arrivedUs = (performance.timeOrigin + performance.now()) * 1000;
    buffered += decoder.decode(bytes, { stream: true });
    // Each delta's content is the mock's 16-digit write time in µs (several may share one read).
    for (const m of buffered.matchAll(/"content":"(\d{16})"/g)) {
      if (ttft < 0) ttft = performance.now() - t0;
      transits.push((arrivedUs - Number(m[1])) / 1000);
    }
    buffered = buffered.slice(buffered.lastIndexOf("\n") + 1);
  }
  return { ttft, transits };
}

type Samples = { ttft: number[]; transit: number[] };
const summary = (s: Samples) => ({
  ttft_p50_ms: round(pct(s.ttft, 50)),
  ttft_p90_ms: round(pct(s.ttft, 90)),
  ttft_p99_ms: round(pct(s.ttft, 99)),
  ttft_max_ms: round(Math.max(...s.ttft)),
  transit_p50_ms: round(pct(s.transit, 50)),
  transit_p99_ms: round(pct(s.transit, 99)),
  deltas: s.transit.length,
});
/**
 * The 95 % interval of p(cross) − p(same) by bootstrap (each path's TTFTs resampled with replacement,
 * 1,000 times): how far the one measured difference of two tails may be from the machine's own.
 */
function bootstrapAdded(cross: number[], same: number[], p: number): [number, number] {
  const draw = (xs: number[]) => Array.from({ length: xs.length }, () => xs[Math.floor(Math.random() * xs.length)]!);
  const diffs = Array.from({ length: 1000 }, () => pct(draw(cross), p) - pct(draw(same), p));
  return [round(pct(diffs, 2.5)), round(pct(diffs, 97.5))];
}

/** A path's figures over the same-node path's, from the summaries of both. */
const added = (path: ReturnType<typeof summary>, same: ReturnType<typeof summary>) => ({
  added_ttft_p50_ms: round(path.ttft_p50_ms - same.ttft_p50_ms),
  added_ttft_p99_ms: round(path.ttft_p99_ms - same.ttft_p99_ms),
  added_transit_p50_ms: round(path.transit_p50_ms - same.transit_p50_ms),
  added_transit_p99_ms: round(path.transit_p99_ms - same.transit_p99_ms),
});

async function hop(apiKey: string, n1: ClusterNodeProcess, n2: ClusterNodeProcess, n3: ClusterNodeProcess | null) {
  const paths = Object.entries({ same_node: n1, cross_node: n2, cross_node_pubsub: n3 }).filter(
    ([name, node]) => node !== null && (name === "same_node" || HOP_PATHS.has(name === "cross_node" ? "cross" : "pubsub")),
  ) as [string, ClusterNodeProcess][];
  const empty = (): Samples => ({ ttft: [], transit: [] });
  // Every path's samples, per block of the interleaved sequence.
  const blocks = Array.from({ length: HOP_BLOCKS }, () => new Map(paths.map(([name]) => [name, empty()])));
  for (let i = 0; i < 40; i++) for (const [, node] of paths) await stream(node.url, apiKey, i); // warm-up
  for (let i = 0; i < HOP_STREAMS; i++) {
    const block = blocks[Math.min(HOP_BLOCKS - 1, Math.floor((i * HOP_BLOCKS) / HOP_STREAMS))]!;
    for (const [name, node] of paths) {
      const r = await stream(node.url, apiKey, i);
      block.get(name)!.ttft.push(r.ttft);
      block.get(name)!.transit.push(...r.transits);
    }
  }
  const whole = (name: string): Samples => ({ ttft: blocks.flatMap((b) => b.get(name)!.ttft), transit: blocks.flatMap((b) => b.get(name)!.transit) });
  const same = summary(whole("same_node"));
  const result: Record<string, unknown> = { streams_per_path: HOP_STREAMS, model: STREAM_MODEL, same_node: same };
  if (paths.some(([name]) => name === "cross_node")) {
    const cross = summary(whole("cross_node"));
    Object.assign(result, {
      cross_node: cross,
      ...added(cross, same),
      added_ttft_p50_ci95_ms: bootstrapAdded(whole("cross_node").ttft, whole("same_node").ttft, 50),
      added_ttft_p99_ci95_ms: bootstrapAdded(whole("cross_node").ttft, whole("same_node").ttft, 99),
    });
    // The same difference within each block: how far one run's p99 moves from block to block.
    result.blocks = blocks.map((b) => {
      const s = summary(b.get("same_node")!);
      const c = summary(b.get("cross_node")!);
      return { streams: b.get("same_node")!.ttft.length, same_ttft_p99_ms: s.ttft_p99_ms, cross_ttft_p99_ms: c.ttft_p99_ms, ...added(c, s) };
    });
  }
  if (paths.some(([name]) => name === "cross_node_pubsub")) {
    // The same hop over Redis pub/sub (a node with links off), for the transport choice (docs/scale-out.md).
    const pubsub = summary(whole("cross_node_pubsub"));
    result.pubsub = { cross_node: pubsub, ...added(pubsub, same) };
  }
  return result as { streams_per_path: number; added_ttft_p99_ms: number; added_transit_p99_ms: number } & Record<string, unknown>;
}

/** Closed-loop load: CONCURRENCY workers, spread over `urls`, each sending the next request when its last answer is read. */
/** Figures a run reads from its engines: taken at the window's start and its end. */
interface WindowProbe {
  start(): Promise<void>;
  end(requests: number): Promise<Record<string, unknown>>;
}

/** A process group's CPU seconds so far: its pids, or a function that lists them afresh (PostgreSQL's). */
type CpuSource = number[] | (() => number);

async function load(urls: string[], apiKey: string, servers: Record<string, CpuSource>, probe?: WindowProbe) {
  const pids: Record<string, CpuSource> = { ...servers, mock: [mockPid], driver: [process.pid] };
  const body = JSON.stringify({ model: JSON_MODEL, max_tokens: 16, messages: [{ role: "user", content: "Hello" }] });
  const headers = { authorization: `Bearer ${apiKey}`, "content-type": "application/json" };
  const start = performance.now();
  const windowStart = start + WARMUP_MS;
  const end = windowStart + LOAD_MS;
  let ok = 0;
  let failed = 0;
  let cpuAtWindow: Record<string, number> = {};
  const cpuOf = () =>
    Object.fromEntries(
      Object.entries(pids).map(([name, source]) => [name, typeof source === "function" ? source() : source.reduce((sum, pid) => sum + cpuSeconds(pid), 0)]),
    );
  let probeStarted: Promise<void> = Promise.resolve();
  const windowTimer = setTimeout(() => {
    cpuAtWindow = cpuOf();
    if (probe) probeStarted = probe.start();
  }, WARMUP_MS);
  const latencies: number[] = [];
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async (_, w) => {
      const url = `${urls[w % urls.length]}/v1/chat/completions`;
      for (;;) {
        const t0 = performance.now();
        if (t0 >= end) return;
        const res = await fetch(url, { method: "POST", headers, body });
        await res.arrayBuffer();
        const t1 = performance.now();
        if (t0 < windowStart || t1 > end) continue;
        if (res.status === 200) {
          ok++;
          latencies.push(t1 - t0);
        } else failed++;
      }
    }),
  );
  clearTimeout(windowTimer);
  const cpuAtEnd = cpuOf();
  await probeStarted;
  const perRequest = probe ? await probe.end(ok) : {};
  const seconds = LOAD_MS / 1000;
  const cpu = Object.fromEntries(Object.keys(pids).map((name) => [name, round((cpuAtEnd[name]! - (cpuAtWindow[name] ?? 0)) / seconds, 2)]));
  const cpuPerRequest = Object.fromEntries(Object.keys(pids).map((name) => [name, Math.round(((cpuAtEnd[name]! - (cpuAtWindow[name] ?? 0)) * 1e6) / Math.max(1, ok))]));
  return {
    req_per_s: Math.round(ok / seconds),
    failed,
    latency_p50_ms: round(pct(latencies, 50)),
    latency_p99_ms: round(pct(latencies, 99)),
    cpu_cores: cpu,
    cpu_us_per_request: cpuPerRequest,
    ...perRequest,
  };
}

/** The embedded gateway (SQLite in a data dir) with one provider, as `gateway serve` runs it. */
async function embeddedThroughput(mockUrl: string) {
  const dataDir = (await import("node:fs")).mkdtempSync(join((await import("node:os")).tmpdir(), "gw-bench-embedded-"));
  const cli = (args: string[]) => {
    const r = Bun.spawnSync(["bun", MAIN, ...args, "--data-dir", dataDir], { stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`gateway ${args.join(" ")}: ${r.stderr.toString()}`);
    return r.stdout.toString();
  };
  cli(["catalog", "init"]);
  for (const m of MODELS) cli(["catalog", "add", "--model-id", m, "--model-hash", modelHash(m)]);
  const { account_id, api_key } = JSON.parse(cli(["accounts", "create", "--tier", "paid", "--name", "bench"])) as { account_id: string; api_key: string };
  cli(["credits", "grant", "--account", account_id, "--credits", String(1e15)]);
  const configFile = join(dataDir, "gateway.json");
  writeFileSync(configFile, JSON.stringify({ port: 0, dataDir, settlementMode: "enforce", logLevel: "info", ...raisedLimits() }));
  const bun = PROFILE_DIR ? ["bun", "--cpu-prof", "--cpu-prof-md", `--cpu-prof-dir=${PROFILE_DIR}`] : ["bun"];
  const gateway = Bun.spawn([...bun, MAIN, "serve", "--config", configFile], { stdout: "pipe", stderr: "inherit" });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(gateway.stdout as ReadableStream<Uint8Array>, events);
  try {
    await waitFor(() => events.some((e) => e.event === "gateway_listening"), 15_000, "gateway_listening");
    const port = events.find((e) => e.event === "gateway_listening")!.port as number;
    const provider = startProvider("bench-embedded", `ws://127.0.0.1:${port}/v1/provider/connect`, mockUrl, dataDir);
    try {
      const url = `http://127.0.0.1:${port}`;
      await routable(url, api_key, 1);
      return await load([url], api_key, { gateway: [gateway.pid], providers: [provider.pid] });
    } finally {
      provider.kill("SIGKILL");
      await provider.exited;
    }
  } finally {
    if (PROFILE_DIR) {
      gateway.kill("SIGTERM"); // the profile is written at a clean exit
      await Promise.race([gateway.exited, Bun.sleep(15_000)]);
    }
    gateway.kill("SIGKILL");
    await gateway.exited;
    (await import("node:fs")).rmSync(dataDir, { recursive: true, force: true });
  }
}

/** A cluster of `nodes` nodes, one provider runtime on each, the load split over the nodes. */
async function clusterThroughput(mockUrl: string, nodes: number) {
  const cluster = await startCluster({ nodes, models: MODELS, extraArgs: raisedLimitFlags(), ...(PROFILE_DIR ? { cpuProfileDir: PROFILE_DIR } : {}) });
  const providers: Proc[] = [];
  try {
    const created = JSON.parse(cluster.cli(["accounts", "create", "--tier", "paid", "--name", "bench"]).stdout) as { account_id: string; api_key: string };
    cluster.cli(["credits", "grant", "--account", created.account_id, "--credits", String(1e15)]);
    cluster.nodes.forEach((node, i) => providers.push(startProvider(`bench-node-${i + 1}`, node.wsUrl, mockUrl, cluster.dataDir)));
    for (const node of cluster.nodes) await routable(node.url, created.api_key, nodes);
    const pg = await sharedPostgres();
    const pids: Record<string, CpuSource> = {};
    cluster.nodes.forEach((node) => (pids[`gateway_${node.name}`] = [node.proc.pid]));
    pids.providers = providers.map((p) => p.pid);
    pids.redis = [redisPid(cluster)];
    pids.postgres = () => postgresCpuSeconds(pg.dataDir);
    // PostgreSQL's own count of transactions (each autocommit statement is one) in the window.
    const stats = new Bun.SQL(cluster.databaseUrl, { max: 1 });
    const transactions = async () => {
      const [row] = await stats`SELECT pg_stat_clear_snapshot(), xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = current_database()`;
      return Number((row as { n: string | number }).n);
    };
    if (PG_STATEMENTS > 0) await stats`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`;
    // Redis commands by name (INFO commandstats), to count a request's round trips to Redis.
    const redis = new Bun.RedisClient(cluster.redis.url);
    const redisCommands = async () => {
      const text = String(await redis.send("INFO", ["commandstats"]));
      return new Map([...text.matchAll(/cmdstat_([a-z|_]+):calls=(\d+)/g)].map((m) => [m[1]!, Number(m[2])]));
    };
    let redisAtStart = new Map<string, number>();
    let atStart = 0;
    const probe: WindowProbe = {
      async start() {
        redisAtStart = await redisCommands();
        atStart = await transactions();
        if (PG_STATEMENTS > 0) await stats`SELECT pg_stat_statements_reset()`;
      },
      async end(requests) {
        const per = Math.max(1, requests);
        const counted = (await transactions()) - atStart;
        const figures: Record<string, unknown> = { pg_transactions_per_request: round(counted / per, 1) };
        const redisAtEnd = await redisCommands();
        const redisPer = [...redisAtEnd]
          .map(([name, calls]) => [name, round((calls - (redisAtStart.get(name) ?? 0)) / per, 2)] as const)
          .filter(([name, n]) => n > 0 && name !== "info");
        figures.redis_commands_per_request = Object.fromEntries(redisPer.sort((a, b) => b[1] - a[1]));
        if (PG_STATEMENTS > 0) {
          const rows = (await stats`SELECT query, calls, total_exec_time, total_plan_time, toplevel FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY total_exec_time DESC LIMIT ${PG_STATEMENTS}`) as { query: string; calls: string | number; total_exec_time: number; toplevel: boolean }[];
          figures.pg_statements = rows.map((r) => ({
            query: r.query.replace(/\s+/g, " ").slice(0, 140),
            toplevel: r.toplevel,
            calls_per_request: round(Number(r.calls) / per, 2),
            exec_us_per_request: round((r.total_exec_time * 1000) / per, 1),
          }));
        }
        return figures;
      },
    };
    try {
      return await load(
        cluster.nodes.map((n) => n.url),
        created.api_key,
        pids,
        probe,
      );
    } finally {
      await stats.close();
      redis.close();
    }
  } finally {
    for (const p of providers) p.kill("SIGKILL");
    await Promise.all(providers.map((p) => p.exited));
    await cluster.close();
  }
}

/** The cluster's private Redis server's pid (the one listening on its port). */
function redisPid(cluster: TestCluster): number {
  const out = Bun.spawnSync(["pgrep", "-f", `redis-server 127.0.0.1:${cluster.redis.port}`]).stdout.toString().trim();
  return Number(out.split("\n")[0] ?? 0);
}

async function hopFigures(mockUrl: string) {
  const cluster = await startCluster({ nodes: 2, models: MODELS, extraArgs: raisedLimitFlags() });
  const provider = startProvider("bench-hop", cluster.nodes[0]!.wsUrl, mockUrl, cluster.dataDir);
  try {
    const created = JSON.parse(cluster.cli(["accounts", "create", "--tier", "paid", "--name", "hop"]).stdout) as { account_id: string; api_key: string };
    cluster.cli(["credits", "grant", "--account", created.account_id, "--credits", String(1e15)]);
    const [n1, n2] = cluster.nodes as [ClusterNodeProcess, ClusterNodeProcess];
    const n3 = HOP_PATHS.has("pubsub") ? await cluster.startNode("n3-pubsub", ["--cluster-link-host", "off"]) : null;
    for (const node of [n1, n2, n3]) if (node) await routable(node.url, created.api_key, 1);
    return await hop(created.api_key, n1, n2, n3);
  } finally {
    provider.kill("SIGKILL");
    await provider.exited;
    await cluster.close();
  }
}

const started = new Date();
const loadBefore = loadavg();
const mock = await startMock();
mockPid = mock.proc.pid;
try {
  const hopResult = PARTS.has("hop") ? await hopFigures(mock.url) : null;
  const embedded = runs("embedded") ? await embeddedThroughput(mock.url) : null;
  const oneNode = runs("one") ? await clusterThroughput(mock.url, 1) : null;
  const twoNodes = runs("two") ? await clusterThroughput(mock.url, 2) : null;
  const ratio = (a: { req_per_s: number } | null, b: { req_per_s: number } | null) => (a && b ? round(a.req_per_s / b.req_per_s, 3) : null);
  const result = {
    date: started.toISOString(),
    load_average_before: loadBefore.map((l) => round(l, 2)),
    load_average_after: loadavg().map((l) => round(l, 2)),
    hop: hopResult,
    throughput: {
      concurrency: CONCURRENCY,
      window_ms: LOAD_MS,
      embedded,
      cluster_one_node: oneNode,
      cluster_two_nodes: twoNodes,
      one_node_vs_embedded: ratio(oneNode, embedded),
      two_nodes_vs_one: ratio(twoNodes, oneNode),
    },
    targets: {
      added_ttft_p99_le_1ms: hopResult === null ? null : hopResult.added_ttft_p99_ms <= 1,
      added_transit_p99_le_0_3ms: hopResult === null ? null : hopResult.added_transit_p99_ms <= 0.3,
      one_node_ge_70pct_of_embedded: oneNode && embedded ? oneNode.req_per_s >= 0.7 * embedded.req_per_s : null,
    },
  };
  console.log(JSON.stringify(result, null, 2));
} catch (error) {
  console.error(error);
  process.exitCode = 1;
} finally {
  mock.proc.kill("SIGKILL");
  await mock.proc.exited;
  // The shared PostgreSQL stops at exit (test/support/postgres.ts).
  process.exit();
}
