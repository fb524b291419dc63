// A cluster for end-to-end tests: one private Redis (support/redis.ts), one PostgreSQL database (a
// fresh one on the process's shared server, support/postgres.ts), `gateway serve` nodes as child
// processes on both, and real provider runtimes that may list several gateways. Everything on
// loopback with random ports; SIGKILL is a real kill -9.
import { rmSync } from "node:fs";
import type OpenAI from "openai";
import { join } from "node:path";
import { listeningAddress, MAIN, modelHash, spawnLogging, tempDir, waitFor, type GatewayProcess, type ProviderProcess } from "./harness.ts";
import { postgresMissing, sharedPostgres } from "./postgres.ts";
import { redisMissing, startRedis, type TestRedis } from "./redis.ts";

/** Why a cluster cannot be started here (tests skip themselves), or null. */
export const clusterMissing: string | null = redisMissing ?? postgresMissing;

export interface ClusterNodeProcess extends GatewayProcess {
  name: string;
}

export type ClusterProviderProcess = ProviderProcess;

export interface TestCluster {
  redis: TestRedis;
  /** The cluster's PostgreSQL database. */
  databaseUrl: string;
  dataDir: string;
  nodes: ClusterNodeProcess[];
  /** Runs `gateway ARGS… --data-dir D --database-url U` (the operator CLI against the shared store). */
  cli(args: string[]): { exitCode: number; stdout: string; stderr: string };
  /** A new paid account with `credits` granted (default 1,000,000), through the CLI; throws if either step fails. */
  paidBuyer(name: string, credits?: number): { account_id: string; api_key: string };
  /** Starts one more node (`extraArgs` after the cluster's own). */
  startNode(name: string, extraArgs?: string[]): Promise<ClusterNodeProcess>;
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
  /** Runs each node under `bun --cpu-prof` writing Markdown profiles here; close() then stops nodes with SIGTERM so the profile is written. */
  cpuProfileDir?: string;
}

/** Waits until the node behind `client` answers a short completion of `model` again (after a fault). */
export function servingAgain(client: OpenAI, model: string, what: string): Promise<void> {
  return waitFor(async () => {
    try {
      await client.chat.completions.create({ model, max_tokens: 3, messages: [{ role: "user", content: "serving?" }] });
      return true;
    } catch {
      return false;
    }
  }, 20_000, what);
}

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

  async function startNode(name: string, extraArgs: string[] = []): Promise<ClusterNodeProcess> {
    const bun = options.cpuProfileDir ? ["bun", "--cpu-prof", "--cpu-prof-md", `--cpu-prof-dir=${options.cpuProfileDir}`] : ["bun"];
    const args = [...bun, MAIN, "serve", "--data-dir", dataDir, "--port", "0", "--database-url", databaseUrl, "--redis-url", redis.url, "--node-id", name];
    args.push("--cluster-lease-ms", String(leaseMs), "--settlement-mode", "enforce", "--heartbeat-interval-ms", "500", ...(options.extraArgs ?? []), ...extraArgs);
    const child = spawnLogging(args);
    if (options.cpuProfileDir) {
      procs.push({
        async kill() {
          child.proc.kill("SIGTERM");
          await Promise.race([child.proc.exited, Bun.sleep(15_000)]);
          await child.kill();
        },
      });
    } else procs.push(child);
    return { name, ...child, ...(await listeningAddress(child, "cluster_joined", 30_000, `node ${name}`)) };
  }

  const nodes: ClusterNodeProcess[] = [];
  for (let i = 1; i <= options.nodes; i++) nodes.push(await startNode(`n${i}`));

  return {
    redis,
    databaseUrl,
    dataDir,
    nodes,
    cli,
    paidBuyer(name, credits = 1_000_000) {
      const created = cli(["accounts", "create", "--tier", "paid", "--name", name]);
      if (created.exitCode !== 0) throw new Error(`accounts create: ${created.stderr}`);
      const buyer = JSON.parse(created.stdout) as { account_id: string; api_key: string };
      const granted = cli(["credits", "grant", "--account", buyer.account_id, "--credits", String(credits)]);
      if (granted.exitCode !== 0) throw new Error(`credits grant: ${granted.stderr}`);
      return buyer;
    },
    startNode,
    provider(o) {
      const args = ["bun", MAIN, "provider", ...o.gateways.flatMap((g) => ["--gateway", g.wsUrl]), "--id", o.id];
      args.push("--key-file", join(dataDir, "provider-keys", `${o.id}.key`), "--engine", "synthetic", "--backoff-min-ms", "50", "--backoff-max-ms", "200");
      args.push("--max-concurrency", String(o.maxConcurrency ?? 4), "--synthetic-ttft-ms", String(o.ttftMs ?? 0));
      args.push("--synthetic-tokens-per-second", String(o.tokensPerSecond ?? 500));
      for (const m of o.models ?? models) args.push("--model", `${m}=${modelHash(m)}`);
      const child = spawnLogging(args);
      procs.push(child);
      return { id: o.id, ...child };
    },
    async waitRoutable(node, n, timeoutMs = 30_000) {
      const admitted = async () => ((await (await fetch(`${node.url}/healthz`)).json()) as { providers_admitted: number }).providers_admitted;
      await waitFor(async () => (await admitted()) >= n, timeoutMs, `${n} providers routable at ${node.url}`);
    },
    async close() {
      for (const p of procs.reverse()) await p.kill();
      await redis.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
