// A cluster for end-to-end tests: one private Redis (support/redis.ts), one PostgreSQL database (a
// fresh one on the process's shared server, support/postgres.ts), `gateway serve` nodes as child
// processes on both, and real provider runtimes that may list several gateways. Everything on
// loopback with random ports; SIGKILL is a real kill -9.
import { rmSync } from "node:fs";
import { join } from "node:path";
import { collectJsonLines, MAIN, modelHash, tempDir, waitFor } from "./harness.ts";
import { postgresMissing, sharedPostgres } from "./postgres.ts";
import { redisMissing, startRedis, type TestRedis } from "./redis.ts";

/** Why a cluster cannot be started here (tests skip themselves), or null. */
export const clusterMissing: string | null = redisMissing ?? postgresMissing;

export interface ClusterNodeProcess {
  name: string;
  proc: ReturnType<typeof Bun.spawn>;
  port: number;
  url: string;
  baseURL: string;
  wsUrl: string;
  events: Record<string, unknown>[];
  waitForEvent(event: string, predicate?: (e: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(): Promise<void>;
}

export interface ClusterProviderProcess {
  id: string;
  proc: ReturnType<typeof Bun.spawn>;
  events: Record<string, unknown>[];
  waitForEvent(event: string, predicate?: (e: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(): Promise<void>;
}

export interface TestCluster {
  redis: TestRedis;
  /** The cluster's PostgreSQL database. */
  databaseUrl: string;
  dataDir: string;
  nodes: ClusterNodeProcess[];
  /** Runs `gateway ARGS… --data-dir D --database-url U` (the operator CLI against the shared store). */
  cli(args: string[]): { exitCode: number; stdout: string; stderr: string };
  startNode(name: string): Promise<ClusterNodeProcess>;
  provider(o: { id: string; gateways: ClusterNodeProcess[]; models?: string[]; maxConcurrency?: number; tokensPerSecond?: number; ttftMs?: number }): ClusterProviderProcess;
  /** Waits until `node` can route `model` to `n` providers (its own or other nodes'). */
  waitRoutable(node: ClusterNodeProcess, n: number, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

export interface ClusterOptions {
  nodes: number;
  leaseMs?: number;
  models?: string[];
  extraArgs?: string[];
}

const waitForEventIn = async (events: Record<string, unknown>[], event: string, predicate: (e: Record<string, unknown>) => boolean, timeoutMs: number) => {
  let found: Record<string, unknown> | undefined;
  await waitFor(() => (found = events.find((e) => e.event === event && predicate(e))) !== undefined, timeoutMs, `event ${event}`);
  return found!;
};

export async function startCluster(options: ClusterOptions): Promise<TestCluster> {
  const redis = await startRedis();
  const databaseUrl = await (await sharedPostgres()).freshDatabase();
  const dataDir = tempDir("gw-cluster-");
  const procs: { kill(): Promise<void> }[] = [];
  const leaseMs = options.leaseMs ?? 2000;
  const models = options.models ?? ["cluster-model"];

  const cli = (args: string[]) => {
    const r = Bun.spawnSync(["bun", MAIN, ...args, "--data-dir", dataDir, "--database-url", databaseUrl], { stdout: "pipe", stderr: "pipe" });
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
  };
  if (cli(["catalog", "init"]).exitCode !== 0) throw new Error("catalog init failed");
  for (const m of models) {
    const added = cli(["catalog", "add", "--model-id", m, "--model-hash", modelHash(m)]);
    if (added.exitCode !== 0) throw new Error(`catalog add: ${added.stderr}`);
  }

  async function startNode(name: string): Promise<ClusterNodeProcess> {
    const args = ["bun", MAIN, "serve", "--data-dir", dataDir, "--port", "0", "--database-url", databaseUrl, "--redis-url", redis.url, "--node-id", name];
    args.push("--cluster-lease-ms", String(leaseMs), "--settlement-mode", "enforce", "--heartbeat-interval-ms", "500", ...(options.extraArgs ?? []));
    const proc = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
    const events: Record<string, unknown>[] = [];
    collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
    const kill = async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await proc.exited;
    };
    procs.push({ kill });
    try {
      await waitFor(() => events.some((e) => e.event === "cluster_joined") || proc.exitCode !== null, 30_000, `node ${name} joined`);
    } catch (e) {
      await kill();
      throw e;
    }
    const listening = events.find((e) => e.event === "gateway_listening");
    if (!listening) throw new Error(`node ${name} exited: ${await new Response(proc.stderr as ReadableStream).text()}`);
    const port = listening.port as number;
    const url = `http://127.0.0.1:${port}`;
    return {
      name,
      proc,
      port,
      url,
      baseURL: `${url}/v1`,
      wsUrl: `ws://127.0.0.1:${port}/v1/provider/connect`,
      events,
      waitForEvent: (event, predicate = () => true, timeoutMs = 5000) => waitForEventIn(events, event, predicate, timeoutMs),
      kill,
    };
  }

  const nodes: ClusterNodeProcess[] = [];
  for (let i = 1; i <= options.nodes; i++) nodes.push(await startNode(`n${i}`));

  return {
    redis,
    databaseUrl,
    dataDir,
    nodes,
    cli,
    startNode,
    provider(o) {
      const args = ["bun", MAIN, "provider", ...o.gateways.flatMap((g) => ["--gateway", g.wsUrl]), "--id", o.id];
      args.push("--key-file", join(dataDir, "provider-keys", `${o.id}.key`), "--engine", "synthetic", "--backoff-min-ms", "50", "--backoff-max-ms", "200");
      args.push("--max-concurrency", String(o.maxConcurrency ?? 4), "--synthetic-ttft-ms", String(o.ttftMs ?? 0));
      args.push("--synthetic-tokens-per-second", String(o.tokensPerSecond ?? 500));
      for (const m of o.models ?? models) args.push("--model", `${m}=${modelHash(m)}`);
      const proc = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
      const events: Record<string, unknown>[] = [];
      collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
      const kill = async () => {
        if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
        await proc.exited;
      };
      procs.push({ kill });
      return { id: o.id, proc, events, waitForEvent: (event, predicate = () => true, timeoutMs = 5000) => waitForEventIn(events, event, predicate, timeoutMs), kill };
    },
    async waitRoutable(node, n, timeoutMs = 30_000) {
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        const health = (await (await fetch(`${node.url}/healthz`)).json()) as { providers_admitted: number };
        if (health.providers_admitted >= n) return;
        if (performance.now() > deadline) throw new Error(`${node.url}: ${health.providers_admitted} of ${n} providers routable`);
        await Bun.sleep(20);
      }
    },
    async close() {
      for (const p of procs.reverse()) await p.kill();
      await redis.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
