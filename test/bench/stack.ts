// The processes under test, each on its own (loopback only): the mock upstream, the gateway (`gateway
// serve`, enforce mode) with its provider runtimes (`gateway provider --engine openai`), and the bare
// relay (server + clients). Everything is configured the way an operator would: CLI commands and a
// config file, never a benchmark-only code path.
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FLOOR_API_KEY } from "./floor.ts";
import { LOOP_PRELOAD } from "./loopDelay.ts";
import { settingSpecs } from "../../src/config/index.ts";

export const MAIN = join(import.meta.dir, "../../src/main.ts");
const HERE = import.meta.dir;

/** Models the catalog holds; each names its mock behaviour (mock.ts), sent upstream as is. */
export const BENCH_MODELS = ["bench-json", "bench-json-d20", "bench-sse", "bench-sse-n4-i0", "bench-sse-n256-i0", "bench-sse-n16-i5"] as const;
const modelHash = (id: string) => createHash("sha256").update(`bench-weights:${id}`).digest("hex");

/** Raised fetch cap for every Bun process that opens many upstream requests at once. */
export const FETCH_ENV = { BUN_CONFIG_MAX_HTTP_REQUESTS: "65535" };

type Proc = ReturnType<typeof Bun.spawn>;

/** BENCH_CPU_PROF=DIR: the gateway and provider runtimes run under Bun's CPU profiler (Markdown + .cpuprofile in DIR). */
const PROFILE_DIR = process.env.BENCH_CPU_PROF;
/**
 * How the gateway and provider runtimes are started. BENCH_CENSUS_DIR=DIR (set by census.ts before it
 * starts a stack): with census-preload.ts and the collector off.
 */
const bunArgs = (): string[] => [
  ...(PROFILE_DIR ? ["bun", "--cpu-prof", "--cpu-prof-md", `--cpu-prof-dir=${PROFILE_DIR}`] : ["bun"]),
  ...(process.env.BENCH_CENSUS_DIR ? ["--preload", join(HERE, "census-preload.ts")] : []),
  ...(process.env.BENCH_PRELOAD ? ["--preload", process.env.BENCH_PRELOAD] : []),
];
/** BENCH_LOOP_DIR=DIR (set by run.ts): each server under test samples its event-loop delay there (loop-delay-preload.ts). */
const serverPreload = (): string[] => (process.env.BENCH_LOOP_DIR ? ["--preload", LOOP_PRELOAD] : []);
const collectorEnv = (): Record<string, string> => (process.env.BENCH_CENSUS_DIR ? { BUN_JSC_disableGC: "1", BUN_GC_TIMER_DISABLE: "1" } : {});
/**
 * mimalloc's purge delay of the processes under test: 1000 ms, as the gateway's service files and the
 * provider runtime's documented units set it (deploy/gateway.service, Dockerfile; docs/provider-machines.md,
 * "The allocator"). The relay's and the floor's processes get the same, so that every path is measured
 * with the same allocator (docs/benchmarks.md, "Unthrottled deltas pass"). BENCH_PURGE_DELAY overrides
 * all (e.g. 100, mimalloc's default); BENCH_PROVIDER_PURGE_DELAY and BENCH_TWOHOP_PURGE_DELAY override
 * the provider runtimes' and the relay's and floor's alone.
 */
const PURGE_DELAY = process.env.BENCH_PURGE_DELAY ?? "1000";
export const GATEWAY_ENV = { MIMALLOC_PURGE_DELAY: PURGE_DELAY };
export const PROVIDER_ENV = { MIMALLOC_PURGE_DELAY: process.env.BENCH_PROVIDER_PURGE_DELAY ?? PURGE_DELAY };
const TWOHOP_ENV = { MIMALLOC_PURGE_DELAY: process.env.BENCH_TWOHOP_PURGE_DELAY ?? PURGE_DELAY };

export class Processes {
  readonly all: Proc[] = [];
  readonly dataDir = mkdtempSync(join(tmpdir(), "gw-bench-"));

  spawn(cmd: string[], opts: { env?: Record<string, string>; log?: string } = {}): Proc {
    const proc = Bun.spawn(cmd, {
      env: { ...process.env, ...opts.env },
      stdout: opts.log ? Bun.file(join(this.dataDir, opts.log)) : "ignore",
      stderr: "inherit",
    });
    this.all.push(proc);
    return proc;
  }

  /** The first JSON line of `log` matching `predicate` (the process writes its log to a file). */
  async line(log: string, predicate: (o: Record<string, unknown>) => boolean, timeoutMs = 15_000): Promise<Record<string, unknown>> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      let text = "";
      try {
        text = readFileSync(join(this.dataDir, log), "utf8");
      } catch {}
      for (const l of text.split("\n")) {
        try {
          const o = JSON.parse(l) as Record<string, unknown>;
          if (predicate(o)) return o;
        } catch {}
      }
      if (performance.now() > deadline) throw new Error(`${log}: expected line not seen in ${timeoutMs} ms`);
      await Bun.sleep(20);
    }
  }

  cli(args: string[]): string {
    const r = Bun.spawnSync(["bun", MAIN, ...args, "--data-dir", this.dataDir], { stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`gateway ${args.join(" ")}: ${r.stderr.toString()}`);
    return r.stdout.toString();
  }

  /** `cli` without blocking, so that independent commands can overlap. */
  async cliAsync(args: string[]): Promise<string> {
    const r = Bun.spawn(["bun", MAIN, ...args, "--data-dir", this.dataDir], { stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([new Response(r.stdout).text(), new Response(r.stderr).text(), r.exited]);
    if (code !== 0) throw new Error(`gateway ${args.join(" ")}: ${err}`);
    return out;
  }

  /** Processes stopped with SIGTERM first, so a profiler can write its output. */
  readonly graceful: Proc[] = [];

  async stop(): Promise<void> {
    if (this.graceful.length > 0) {
      for (const p of this.graceful) if (p.exitCode === null) p.kill("SIGTERM");
      let timer: Timer | undefined;
      await Promise.race([Promise.all(this.graceful.map((p) => p.exited)), new Promise((r) => (timer = setTimeout(r, 10_000)))]);
      clearTimeout(timer);
    }
    for (const p of this.all) if (p.exitCode === null) p.kill("SIGKILL");
    await Promise.all(this.all.map((p) => p.exited));
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

export const rssMb = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

/** The mock upstream (mock.ts), listing `models` at /v1/models. */
export async function startMock(p: Processes, models: readonly string[] = BENCH_MODELS): Promise<{ url: string; proc: Proc }> {
  const proc = p.spawn(["bun", join(HERE, "mock.ts"), "--models", models.join(",")], { log: "mock.log" });
  const line = await p.line("mock.log", (o) => o.event === "mock_listening");
  return { url: line.url as string, proc };
}

export interface GatewayStack {
  url: string;
  apiKey: string;
  accountId: string;
  gateway: Proc;
  providers: Proc[];
}

/**
 * The full stack: catalog with the bench models, a paid account with ample credits, the gateway in
 * enforce mode, and `providers` provider runtimes with the openai engine pointed at the mock.
 */
export async function startGatewayStack(
  p: Processes,
  o: { mockUrl: string; providers: number; logLevel: string; settings?: Record<string, unknown> },
): Promise<GatewayStack> {
  // The catalog's models one after another (each add signs the next catalog); the account alongside.
  await p.cliAsync(["catalog", "init"]);
  const [{ account_id, api_key }] = await Promise.all([
    (async () => {
      const account = JSON.parse(await p.cliAsync(["accounts", "create", "--tier", "paid", "--name", "bench"])) as { account_id: string; api_key: string };
      await p.cliAsync(["credits", "grant", "--account", account.account_id, "--credits", String(1e15), "--memo", "benchmark"]);
      return account;
    })(),
    (async () => {
      for (const m of BENCH_MODELS) await p.cliAsync(["catalog", "add", "--model-id", m, "--model-hash", modelHash(m), "--hash-scope", "gguf-file-v1"]);
    })(),
  ]);
  // Limits raised by configuration, as an operator would for a heavy paid buyer: per-account
  // concurrency and daily tokens (when this build has those settings), nothing else changed.
  const known = new Set<string>(settingSpecs.map((spec) => spec.key));
  const raised = Object.fromEntries(
    Object.entries({ paidConcurrentRequests: 100_000, freeConcurrentRequests: 100_000, paidDailyTokens: 0 }).filter(([k]) => known.has(k)),
  );
  const config = {
    port: 0,
    dataDir: p.dataDir,
    settlementMode: "enforce",
    logLevel: o.logLevel,
    provisionalAdmissionsPerHour: 1000,
    ...raised,
    ...o.settings,
  };
  const configFile = join(p.dataDir, "gateway.json");
  writeFileSync(configFile, JSON.stringify(config));
  const gateway = p.spawn([...bunArgs(), ...serverPreload(), MAIN, "serve", "--config", configFile], { env: { ...GATEWAY_ENV, ...collectorEnv() }, log: "gateway.log" });
  if (PROFILE_DIR) p.graceful.push(gateway);
  const listening = await p.line("gateway.log", (l) => l.event === "gateway_listening");
  const url = `http://127.0.0.1:${listening.port}`;
  const providers: Proc[] = [];
  for (let i = 0; i < o.providers; i++) {
    providers.push(
      p.spawn(
        [
          ...bunArgs(), MAIN, "provider",
          "--gateway", `ws://127.0.0.1:${listening.port}/v1/provider/connect`,
          "--id", `bench-provider-${i}`,
          "--key-file", join(p.dataDir, `provider-${i}.key`),
          "--engine", "openai",
          "--upstream", o.mockUrl,
          "--max-concurrency", "1024",
          ...BENCH_MODELS.flatMap((m) => ["--model", `${m}=${modelHash(m)}`]),
        ],
        { env: { ...FETCH_ENV, ...PROVIDER_ENV, ...collectorEnv() }, log: `provider-${i}.log` },
      ),
    );
  }
  if (PROFILE_DIR) p.graceful.push(...providers);
  // Ready: every provider admitted and every bench model routable.
  const deadline = performance.now() + 20_000;
  for (;;) {
    const models = (await (await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${api_key}` } })).json()) as { data?: { id: string }[] };
    const status = (await (await fetch(`${url}/v1/status`)).json()) as { pool: { providers_admitted: number } };
    const ids = new Set((models.data ?? []).map((m) => m.id));
    if (status.pool.providers_admitted === o.providers && BENCH_MODELS.every((m) => ids.has(m))) break;
    if (performance.now() > deadline) throw new Error(`gateway stack not ready: ${JSON.stringify(status)} ${[...ids]}`);
    await Bun.sleep(50);
  }
  return { url, apiKey: api_key, accountId: account_id, gateway, providers };
}

export async function startRelay(p: Processes, o: { mockUrl: string; clients: number }): Promise<{ url: string; server: Proc }> {
  return startTwoHop(p, "relay", [], o);
}

/** The required-work floor (floor.ts): its server, with its SQLite file in the run's data directory, and `clients` clients. */
export async function startFloor(p: Processes, o: { mockUrl: string; clients: number }): Promise<{ url: string; server: Proc; apiKey: string }> {
  return { ...(await startTwoHop(p, "floor", [p.dataDir], o)), apiKey: FLOOR_API_KEY };
}

/** `NAME.ts server …` and `clients` × `NAME.ts client WS_URL UPSTREAM`, each awaited until its log says it is up. */
async function startTwoHop(p: Processes, name: "relay" | "floor", serverArgs: string[], o: { mockUrl: string; clients: number }): Promise<{ url: string; server: Proc }> {
  const script = join(HERE, `${name}.ts`);
  const server = p.spawn(["bun", ...serverPreload(), script, "server", ...serverArgs], { env: TWOHOP_ENV, log: `${name}.log` });
  const line = await p.line(`${name}.log`, (l) => l.event === `${name}_listening`);
  for (let i = 0; i < o.clients; i++) {
    const log = `${name}-client-${i}.log`;
    p.spawn(["bun", script, "client", `ws://127.0.0.1:${line.port}/connect`, o.mockUrl], { env: { ...FETCH_ENV, ...TWOHOP_ENV }, log });
    await p.line(log, (l) => l.event === `${name}_client_connected`);
  }
  return { url: `http://127.0.0.1:${line.port}`, server };
}
