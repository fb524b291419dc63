// End-to-end test support: a real gateway on a random loopback port with a real SQLite file in a temp
// dir, and real provider runtimes as child processes (`gateway provider …`) over real WebSockets.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { loadConfig, type GatewayConfig } from "../../src/config/index.ts";
import { silentLog } from "../../src/log.ts";
import type { CatalogModel } from "../../src/catalog/index.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { sharedPostgres } from "./postgres.ts";

export const MAIN = join(import.meta.dir, "../../src/main.ts");

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
  close(): Promise<void>;
}

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
}

/**
 * A gateway on a random port. Settlement runs in observe mode unless the test asks for enforce: most
 * tests use uncatalogued models and test something other than billing (docs/receipts.md lets observe route them).
 */
export async function startTestGateway(overrides: Partial<GatewayConfig> = {}, options: TestGatewayOptions = {}): Promise<TestGateway> {
  const dataDir = tempDir();
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  // GATEWAY_TEST_STORE=postgres runs the same tests on a cluster node's store: a fresh database of a
  // private PostgreSQL (test/support/postgres.ts) per gateway.
  const databaseUrl = process.env.GATEWAY_TEST_STORE === "postgres" ? await (await sharedPostgres()).freshDatabase() : undefined;
  const config: GatewayConfig = { ...loaded.config, port: 0, dataDir, databaseUrl, logLevel: "error", settlementMode: "observe", ...overrides };
  const catalogModels = options.catalog?.map((m) => (typeof m === "string" ? catalogModel(m) : m));
  const gateway = await startGateway(config, { log: silentLog, catalogModels });
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

export interface ProviderProcess {
  id: string;
  proc: ReturnType<typeof Bun.spawn>;
  /** Parsed JSON log lines, as they arrive. */
  events: Record<string, unknown>[];
  waitForEvent(event: string, predicate?: (e: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(): Promise<void>;
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
  const proc = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  return {
    id: o.id,
    proc,
    events,
    async waitForEvent(event, predicate = () => true, timeoutMs = 5000) {
      let found: Record<string, unknown> | undefined;
      await waitFor(() => (found = events.find((e) => e.event === event && predicate(e))) !== undefined, timeoutMs, `provider event ${event}`);
      return found!;
    },
    async kill() {
      proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}

export interface GatewayProcess {
  proc: ReturnType<typeof Bun.spawn>;
  port: number;
  url: string;
  baseURL: string;
  wsUrl: string;
  /** Parsed JSON log lines of the child's stdout, as they arrive. */
  events: Record<string, unknown>[];
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
}

/**
 * `gateway serve` as a child process on a random loopback port (`--port 0`), for tests that need a
 * real process: signals, restarts on the same data dir. Resolves once it logged `gateway_listening`.
 */
export async function spawnGatewayProcess(dataDir: string, extraArgs: string[] = [], timeoutMs = 10_000): Promise<GatewayProcess> {
  const proc = Bun.spawn(["bun", MAIN, "serve", "--data-dir", dataDir, "--port", "0", ...extraArgs], { stdout: "pipe", stderr: "pipe" });
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  try {
    await waitFor(() => events.some((e) => e.event === "gateway_listening") || proc.exitCode !== null, timeoutMs, "gateway_listening");
  } catch (e) {
    proc.kill("SIGKILL");
    throw e;
  }
  const listening = events.find((e) => e.event === "gateway_listening");
  if (!listening) throw new Error(`gateway exited with ${proc.exitCode}: ${await new Response(proc.stderr as ReadableStream).text()}`);
  const port = listening.port as number;
  const url = `http://127.0.0.1:${port}`;
  return {
    proc,
    port,
    url,
    baseURL: `${url}/v1`,
    wsUrl: `ws://127.0.0.1:${port}${PROVIDER_CONNECT_PATH}`,
    events,
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}
