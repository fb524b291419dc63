// End-to-end test support: a real gateway on a random loopback port with a real SQLite file in a temp
// dir, and real provider runtimes as child processes (`gateway provider …`) over real WebSockets.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { loadConfig, type GatewayConfig } from "../../src/config/index.ts";
import { silentLog, type Log } from "../../src/log.ts";
import type { CatalogModel } from "../../src/catalog/index.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { postgresMissing, sharedPostgres } from "./postgres.ts";
import { redisMissing, sharedRedisDatabase } from "./redis.ts";
import { connectRedis } from "../../src/cluster/redis.ts";

export const MAIN = join(import.meta.dir, "../../src/main.ts");

/**
 * How end-to-end tests run their gateways (docs/scale-out.md, "The acceptance suite in cluster mode"):
 * - `embedded` (default): SQLite in the data dir;
 * - `postgres` (GATEWAY_TEST_STORE=postgres): the same, on a fresh PostgreSQL database;
 * - `cluster` (GATEWAY_TEST_MODE=cluster): one cluster node — a fresh PostgreSQL database and a Redis
 *   database of its own on the process's shared test servers, both given as URLs as an operator does.
 */
export const TEST_MODE: "embedded" | "postgres" | "cluster" =
  process.env.GATEWAY_TEST_MODE === "cluster" ? "cluster" : process.env.GATEWAY_TEST_STORE === "postgres" ? "postgres" : "embedded";
if (TEST_MODE === "cluster" && (postgresMissing ?? redisMissing)) throw new Error(`GATEWAY_TEST_MODE=cluster needs PostgreSQL and Redis: ${postgresMissing ?? redisMissing}`);
// The shared servers start while test files load, not inside the first test's time limit.
if (TEST_MODE !== "embedded") await sharedPostgres().then((pg) => pg.freshDatabase());
if (TEST_MODE === "cluster") await sharedRedisDatabase();

/**
 * Whether a test cannot run in this mode because it is about the embedded store (it reads the SQLite
 * file, checks data-dir files): `test.skipIf(embeddedOnly("reads gateway.db"))`. The reason is printed;
 * bun counts the skip.
 */
export function embeddedOnly(reason: string): boolean {
  if (TEST_MODE === "embedded") return false;
  console.warn(`[skipped in ${TEST_MODE} mode] embedded-only: ${reason}`);
  return true;
}

export interface TestBackends {
  databaseUrl?: string;
  redisUrl?: string;
}

const backendsOfDataDir = new Map<string, Promise<TestBackends>>();
const resolvedBackends = new Map<string, TestBackends>();

/**
 * The backend URLs of the gateway whose data dir is `dataDir` in this mode (none when embedded): new
 * ones the first time, the same ones again for that dir, so a gateway restarted on its data dir finds
 * its state as an operator's node restarted with the same configuration does.
 */
export function testBackends(dataDir: string): Promise<TestBackends> {
  let backends = backendsOfDataDir.get(dataDir);
  if (!backends) {
    backends = (async () => {
      if (TEST_MODE === "embedded") return {};
      const databaseUrl = await (await sharedPostgres()).freshDatabase();
      if (TEST_MODE === "postgres") return { databaseUrl };
      return { databaseUrl, redisUrl: await sharedRedisDatabase() };
    })().then((b) => {
      resolvedBackends.set(dataDir, b);
      return b;
    });
    backendsOfDataDir.set(dataDir, backends);
  }
  return backends;
}

/**
 * An operator command's argv with the URLs of the gateway whose `--data-dir` it names appended (as
 * an operator runs `gateway ledger audit --database-url … --redis-url …` against a cluster). Call
 * `await testBackends(dataDir)` first when no test gateway was started on that dir yet.
 */
export function withBackendArgs(argv: readonly string[]): string[] {
  const at = argv.findIndex((a) => a === "--data-dir");
  const dataDir = at >= 0 ? argv[at + 1] : undefined;
  const backends = dataDir === undefined ? undefined : resolvedBackends.get(dataDir);
  if (TEST_MODE !== "embedded" && dataDir !== undefined && !backends) throw new Error(`no backends known for ${dataDir}: await testBackends(dir) first`);
  return [...argv, ...backendArgs(backends ?? {})];
}

/** The backends `testBackends(dataDir)` resolved for that dir ({} when embedded or not yet resolved). */
export function knownBackends(dataDir: string): TestBackends {
  return resolvedBackends.get(dataDir) ?? {};
}

/** `--database-url U --redis-url R` for a spawned `gateway serve` or operator command (none when embedded). */
export function backendArgs(backends: TestBackends): string[] {
  return [...(backends.databaseUrl ? ["--database-url", backends.databaseUrl] : []), ...(backends.redisUrl ? ["--redis-url", backends.redisUrl] : [])];
}

export const modelHash = (modelId: string) => createHash("sha256").update(`test-weights:${modelId}`).digest("hex");

export function tempDir(prefix = "gw-test-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

export interface TestGateway {
  gateway: RunningGateway;
  url: string;
  baseURL: string;
  wsUrl: string;
  apiKey: string;
  accountId: string;
  dataDir: string;
  /** The store and Redis URLs this gateway was given (none when embedded). */
  backends: TestBackends;
  /** Arguments an operator command needs to reach this gateway's state: the data dir and both URLs. */
  cliArgs: string[];
  close(): Promise<void>;
}

let nodes = 0;

const liveGateways = new Set<RunningGateway>();

/**
 * Commits every in-process test gateway's open group of ledger writes. Call it before blocking this
 * process (Bun.spawnSync of a CLI that writes the same SQLite file): a group commits at the end of an
 * event-loop turn, so a blocked loop would hold the write lock until the CLI's busy timeout.
 */
export function flushTestGateways(): void {
  for (const gateway of liveGateways) gateway.store.flushCommits();
}

/** A catalog entry for a test model, with the hash test providers advertise (modelHash). */
export const catalogModel = (modelId: string, extra: Partial<CatalogModel> = {}): CatalogModel => ({
  model_id: modelId,
  model_hash: modelHash(modelId),
  hash_scope: "gguf-file-v1",
  min_ram_gb: 0,
  rate_card_row: "default",
  capabilities: { tools: true, structured_output: true },
  ...extra,
});

export interface TestGatewayOptions {
  /** Model ids put in the signed catalog at start (with modelHash hashes). */
  catalog?: readonly (string | CatalogModel)[];
  /** The gateway's log; default silent. */
  log?: Log;
}

/**
 * A gateway on a random port. Settlement runs in observe mode unless the test asks for enforce: most
 * tests use uncatalogued models and test something other than billing (docs/receipts.md lets observe route them).
 */
export async function startTestGateway(overrides: Partial<GatewayConfig> = {}, options: TestGatewayOptions = {}): Promise<TestGateway> {
  const dataDir = tempDir();
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  const backends = await testBackends(dataDir);
  const nodeId = backends.redisUrl ? { nodeId: `test-node-${process.pid}-${++nodes}` } : {};
  const config: GatewayConfig = { ...loaded.config, port: 0, dataDir, ...backends, ...nodeId, logLevel: "error", settlementMode: "observe", ...overrides };
  const catalogModels = options.catalog?.map((m) => (typeof m === "string" ? catalogModel(m) : m));
  // As `gateway serve` does (src/serveCommand.ts): a Redis URL makes this gateway a cluster node.
  const log = options.log ?? silentLog;
  const redis = config.redisUrl ? await connectRedis({ url: config.redisUrl, log }) : undefined;
  const gateway = await startGateway(config, { log, catalogModels, redis });
  await gateway.cluster?.ready;
  liveGateways.add(gateway);
  const { account_id } = await gateway.store.createAccount({ name: "test", tier: "free" });
  const { api_key } = await gateway.store.createApiKey({ account_id });
  return {
    gateway,
    url: gateway.url,
    baseURL: `${gateway.url}/v1`,
    wsUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`,
    apiKey: api_key,
    accountId: account_id,
    dataDir,
    backends,
    cliArgs: ["--data-dir", dataDir, ...backendArgs(backends)],
    async close() {
      liveGateways.delete(gateway);
      await gateway.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export async function waitFor(predicate: () => boolean | Promise<boolean>, timeoutMs = 5000, what = "condition"): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await predicate())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(5);
  }
}

/** Waits until the gateway at `url` (often another process) has a routable provider: free slots in /v1/status. */
export function waitForRoutable(url: string, timeoutMs = 5000): Promise<void> {
  const freeSlots = async () => ((await (await fetch(`${url}/v1/status`)).json()) as { capacity: { free_slots: number } }).capacity.free_slots;
  return waitFor(async () => (await freeSlots()) > 0, timeoutMs, "a routable provider");
}

/** Waits until `n` providers are admitted and ready (idle slots) on the gateway. */
export function waitForReadyProviders(gw: TestGateway, n: number, timeoutMs = 8000): Promise<void> {
  return waitFor(() => [...gw.gateway.registry.providerViews()].filter((v) => v.state === "ready").length >= n, timeoutMs, `${n} ready providers`);
}

/** Collects the JSON log lines of a child's stdout as they arrive (other lines are skipped). */
export function collectJsonLines(stream: ReadableStream<Uint8Array>, into: Record<string, unknown>[]): void {
  void (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const bytes of stream) {
      buffered += decoder.decode(bytes, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        try {
          into.push(JSON.parse(line));
        } catch {}
      }
    }
  })();
}

export interface ProviderProcessOptions {
  id: string;
  models?: string[];
  fault?: string;
  ttftMs?: number;
  tokensPerSecond?: number;
  maxConcurrency?: number;
  extraArgs?: string[];
  /** Default "synthetic". With "openai" no synthetic flags are passed: give `--upstream …` in extraArgs. */
  engine?: "synthetic" | "openai";
}

/** A child process whose stdout is JSON log lines (`gateway serve`, `gateway provider`). */
export interface LoggingProcess {
  proc: ReturnType<typeof Bun.spawn>;
  /** Parsed JSON log lines, as they arrive. */
  events: Record<string, unknown>[];
  waitForEvent(event: string, predicate?: (e: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  /** SIGKILL (unless it has exited), and wait for the exit. */
  kill(): Promise<void>;
}

/** Spawns `args` with piped output, collecting its stdout's JSON log lines. */
export function spawnLogging(args: string[]): LoggingProcess {
  const proc = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  return {
    proc,
    events,
    async waitForEvent(event, predicate = () => true, timeoutMs = 5000) {
      let found: Record<string, unknown> | undefined;
      await waitFor(() => (found = events.find((e) => e.event === event && predicate(e))) !== undefined, timeoutMs, `event ${event}`);
      return found!;
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}

export interface ProviderProcess extends LoggingProcess {
  id: string;
}

export function spawnProvider(gw: TestGateway, o: ProviderProcessOptions): ProviderProcess {
  const models = o.models ?? ["test-model"];
  const args = [
    "bun",
    MAIN,
    "provider",
    "--gateway",
    gw.wsUrl,
    "--id",
    o.id,
    "--key-file",
    join(gw.dataDir, "provider-keys", `${o.id}.key`),
    "--engine",
    o.engine ?? "synthetic",
    "--backoff-min-ms",
    "50",
    "--backoff-max-ms",
    "200",
    "--max-concurrency",
    String(o.maxConcurrency ?? 1),
    ...(o.engine === "openai"
      ? []
      : ["--synthetic-ttft-ms", String(o.ttftMs ?? 0), "--synthetic-tokens-per-second", String(o.tokensPerSecond ?? 500)]),
    ...models.flatMap((m) => ["--model", `${m}=${modelHash(m)}`]),
    // Test gateways run in observe mode with uncatalogued models; the runtime advertises only catalog
    // models unless told otherwise (a retired or mismatched one is withheld either way).
    "--advertise-uncatalogued",
    ...(o.fault ? ["--synthetic-fault", o.fault] : []),
    ...(o.extraArgs ?? []),
  ];
  return { id: o.id, ...spawnLogging(args) };
}

/** Where a gateway listens. */
export interface GatewayAddress {
  port: number;
  url: string;
  baseURL: string;
  wsUrl: string;
}

export interface GatewayProcess extends LoggingProcess, GatewayAddress {}

/**
 * Where a `gateway serve` child listens (its `gateway_listening` line), once it logged `readyEvent`.
 * A child that never does is killed; one that exited first is an error with its stderr.
 */
export async function listeningAddress(p: LoggingProcess, readyEvent: string, timeoutMs: number, what = "gateway"): Promise<GatewayAddress> {
  try {
    await waitFor(() => p.events.some((e) => e.event === readyEvent) || p.proc.exitCode !== null, timeoutMs, `${what}: ${readyEvent}`);
  } catch (e) {
    await p.kill();
    throw e;
  }
  const listening = p.events.find((e) => e.event === "gateway_listening");
  if (!listening) throw new Error(`${what} exited with ${p.proc.exitCode}: ${await new Response(p.proc.stderr as ReadableStream).text()}`);
  const port = listening.port as number;
  const url = `http://127.0.0.1:${port}`;
  return { port, url, baseURL: `${url}/v1`, wsUrl: `ws://127.0.0.1:${port}${PROVIDER_CONNECT_PATH}` };
}

/**
 * `gateway serve` as a child process on a random loopback port (`--port 0`), for tests that need a
 * real process: signals, restarts on the same data dir. Resolves once it logged `gateway_listening`.
 */
export async function spawnGatewayProcess(dataDir: string, extraArgs: string[] = [], timeoutMs = 10_000): Promise<GatewayProcess> {
  // In cluster mode the process is a cluster node on this data dir's URLs (the same on a restart).
  const backends = await testBackends(dataDir);
  // A cluster node keeps its name across restarts, as the systemd unit of docs/scale-out.md gives it.
  const nodeId = backends.redisUrl && !extraArgs.includes("--node-id") ? ["--node-id", `node-${createHash("sha256").update(dataDir).digest("hex").slice(0, 12)}`] : [];
  const child = spawnLogging(["bun", MAIN, "serve", "--data-dir", dataDir, "--port", "0", ...backendArgs(backends), ...nodeId, ...extraArgs]);
  return { ...child, ...(await listeningAddress(child, backends.redisUrl ? "cluster_joined" : "gateway_listening", timeoutMs)) };
}
