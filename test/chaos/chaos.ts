// Crash chaos with real processes (issue 26; issue 27, decision 1): `bun run chaos --runs N [--seed S]`.
// Each run: a gateway process and two provider processes on loopback, paid buyers streaming and not,
// operators granting credits with the CLI; then `kill -9` at a random moment — of the gateway, of a
// provider, or of a CLI in the middle of `credits grant` (the gateway every run, the others on some).
// The gateway is restarted on the same data dir and port, the load resumes, every attempt settles,
// and the run checks:
//   - `gateway ledger audit` is clean;
//   - no acknowledged posting is lost: every grant whose CLI exited 0 is in the ledger, and every
//     `settled` frame a provider logged matches the stored settlement (label and provider credits);
//   - no request is charged twice (at most one charged attempt per request) or beyond what its buyer
//     received (the charged attempt's delivered bytes ≤ the content bytes the buyer read). Buyers act
//     as the official SDKs do: a request whose connection failed before any response is sent once
//     more after the restart, with the same body and `x-stainless-retry-count: 1`; a replayed answer
//     carries the first run's request id, so it counts as that request received (docs/receipts.md,
//     "Crashes");
//   - the time to recover (restart → healthy → a completion served).
// Prints one JSON line per run and a summary; exits 1 if any run broke an invariant.
import { Database } from "bun:sqlite";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collectJsonLines, MAIN, waitFor } from "../support/harness.ts";
import { rng } from "../support/seededRandom.ts";
import { cli as gatewayCli, exitReason, failedRun, keepTail, killHard, ledgerViolations, oneRequest, realViolations, SETTLEMENT_COLUMNS, startProvider as startProviderProcess, summary, type Logged, type Received, type Retries, type RunResult, type SettlementRow } from "./common.ts";

interface Args {
  runs: number;
  seed: number;
  keep: boolean;
  cluster: boolean;
  /** Cluster runs: nodes (default 3) and one fault mode for every run (default: drawn per run). */
  nodes: number | undefined;
  mode: string | undefined;
}

function parseArgs(argv: string[]): Args {
  const args: Args = { runs: 5, seed: Date.now() % 1_000_000, keep: false, cluster: false, nodes: undefined, mode: undefined };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--runs") args.runs = Number(argv[++i]);
    else if (argv[i] === "--seed") args.seed = Number(argv[++i]);
    else if (argv[i] === "--keep") args.keep = true;
    else if (argv[i] === "--cluster") args.cluster = true;
    else if (argv[i] === "--nodes") args.nodes = Number(argv[++i]);
    else if (argv[i] === "--mode") args.mode = argv[++i];
  }
  return args;
}

const cli = (dataDir: string, args: string[]) => gatewayCli([...args, "--data-dir", dataDir]);

async function freePort(): Promise<number> {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const port = server.port!;
  server.stop(true);
  return port;
}

type Gateway = Logged;

async function startGatewayProcess(dataDir: string, port: number): Promise<Gateway> {
  const proc = Bun.spawn(
    ["bun", MAIN, "serve", "--data-dir", dataDir, "--port", String(port), "--settlement-mode", "observe", "--pending-deadline-ms", "2000", "--heartbeat-interval-ms", "500"],
    { stdout: "pipe", stderr: "pipe" },
  );
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  const stderr = keepTail(proc.stderr as ReadableStream<Uint8Array>);
  // Generous: on a loaded shared machine a process start has taken 20 s.
  await waitFor(() => events.some((e) => e.event === "gateway_listening") || proc.exitCode !== null, 120_000, "gateway_listening");
  if (proc.exitCode !== null) throw new Error(await exitReason("gateway", proc, stderr, events));
  return { proc, events };
}

const startProvider = (dataDir: string, port: number, id: string) =>
  startProviderProcess(dataDir, [`ws://127.0.0.1:${port}/v1/provider/connect`], id, ["--advertise-uncatalogued"]);

async function oneRun(run: number, seed: number, keep: boolean): Promise<RunResult> {
  const random = rng(seed).next;
  const dataDir = mkdtempSync(join(tmpdir(), "gw-chaos-"));
  const violations: string[] = [];
  const killed: string[] = [];
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const created = JSON.parse(cli(dataDir, ["accounts", "create", "--tier", "paid", "--name", "chaos"]).stdout) as { account_id: string; api_key: string };
  const acknowledged: string[] = [];
  const grant = (memo: string) => {
    if (cli(dataDir, ["credits", "grant", "--account", created.account_id, "--credits", "1000000", "--memo", memo]).exitCode === 0) acknowledged.push(memo);
  };
  grant(`chaos-${run}-initial`);

  let gateway = await startGatewayProcess(dataDir, port);
  const providers = [startProvider(dataDir, port, "chaos-a"), startProvider(dataDir, port, "chaos-b")];
  const providerEvents = () => providers.flatMap((p) => p.events);
  const healthy = async () => {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`);
      return r.status === 200 && ((await r.json()) as { providers_admitted: number }).providers_admitted >= 1;
    } catch {
      return false;
    }
  };
  for (let i = 0; i < 600 && !(await healthy()); i++) await Bun.sleep(50);

  const received: Received = new Map();
  const retries: Retries = { unanswered: [], sent: 0, replayed: 0, timedOut: 0 };
  let load = true;
  let requests = 0;
  const loops = Array.from({ length: 6 }, async (_, i) => {
    while (load) {
      requests++;
      const unanswered = retries.unanswered.length;
      await oneRequest(base, created.api_key, i % 2 === 0, received, random, retries);
      // A buyer whose request went unanswered waits for its retry (after the restart) before the next.
      if (retries.unanswered.length > unanswered) break;
    }
  });

  // The crash: the gateway every run; on some runs also a provider, or a CLI in the middle of a grant.
  const killAtMs = 200 + Math.floor(random() * 1500);
  await Bun.sleep(killAtMs);
  const extra = random();
  let grantDuringKill: Promise<void> | null = null;
  if (extra < 0.3) {
    const memo = `chaos-${run}-killed-cli`;
    const proc = Bun.spawn(["bun", MAIN, "credits", "grant", "--account", created.account_id, "--credits", "5", "--memo", memo, "--data-dir", dataDir], { stdout: "ignore", stderr: "ignore" });
    grantDuringKill = (async () => {
      await Bun.sleep(Math.floor(random() * 300));
      await killHard(proc);
      if (proc.exitCode === 0) acknowledged.push(memo);
      killed.push("cli");
    })();
  } else if (extra < 0.55) {
    const victim = providers[Math.floor(random() * providers.length)]!;
    await killHard(victim.proc);
    killed.push("provider");
    providers[providers.indexOf(victim)] = startProvider(dataDir, port, victim === providers[0] ? "chaos-a" : "chaos-b");
    // keep the old events: their `settled` lines were acknowledgements too
    providers.push({ proc: victim.proc, events: victim.events });
  }
  await killHard(gateway.proc);
  killed.push("gateway");
  await grantDuringKill;
  load = false;
  await Promise.all(loops);

  // Restart and measure the time until a completion is served again.
  const restartedAt = performance.now();
  gateway = await startGatewayProcess(dataDir, port);
  const listeningMs = Math.round(performance.now() - restartedAt);
  let recoverMs = -1;
  for (let i = 0; i < 2400; i++) {
    if ((await healthy()) && (await oneRequest(base, created.api_key, false, received, random, null))) {
      recoverMs = Math.round(performance.now() - restartedAt);
      break;
    }
    await Bun.sleep(50);
  }
  if (recoverMs < 0) violations.push("did not recover within 120 s");
  // The SDKs' retries of what the crash left unanswered (a replay, or a new run if none was kept).
  for (const u of retries.unanswered) await oneRequest(base, created.api_key, u.stream, received, random, retries, u);
  grant(`chaos-${run}-after`);
  // A little load after the restart, then let every pending attempt reach its deadline (2 s).
  load = true;
  const after = Array.from({ length: 3 }, async (_, i) => {
    while (load) {
      requests++;
      await oneRequest(base, created.api_key, i % 2 === 0, received, random, retries);
    }
  });
  await Bun.sleep(500);
  load = false;
  await Promise.all(after);
  await Bun.sleep(3000);
  gateway.proc.kill("SIGTERM");
  await gateway.proc.exited;
  for (const p of providers) await killHard(p.proc);

  // Invariants.
  const audit = cli(dataDir, ["ledger", "audit"]);
  if (audit.exitCode !== 0) violations.push(`ledger audit: exit ${audit.exitCode} ${audit.stdout.slice(0, 300)}`);
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  let settlementCount = 0;
  try {
    const settlements = db.query(`SELECT ${SETTLEMENT_COLUMNS} FROM settlements`).all() as SettlementRow[];
    settlementCount = settlements.length;
    const storedGrantMemos = new Set((db.query("SELECT memo FROM ledger_postings WHERE kind = 'grant'").all() as { memo: string }[]).map((r) => r.memo));
    violations.push(...ledgerViolations({ acknowledgedGrants: acknowledged, storedGrantMemos, settlements, providerEvents: providerEvents(), received }));
  } finally {
    db.close();
  }
  if (!keep && violations.length === 0) rmSync(dataDir, { recursive: true, force: true });
  else violations.push(`data dir kept: ${dataDir}`);
  return { run, seed, killed, killAtMs, requests, settlements: settlementCount, grantsAcknowledged: acknowledged.length, listeningMs, recoverMs, retried: retries.sent, replayed: retries.replayed, violations };
}

if (import.meta.main) {
  const args = parseArgs(process.argv.slice(2));
  const results: RunResult[] = [];
  // --cluster: the same checks on cluster nodes over PostgreSQL and Redis (test/chaos/cluster.ts).
  const cluster = args.cluster ? await import("./cluster.ts") : null;
  if (cluster && args.mode !== undefined && !(cluster.CLUSTER_MODES as readonly string[]).includes(args.mode)) {
    console.error(`--mode: one of ${cluster.CLUSTER_MODES.join(", ")}`);
    process.exit(64);
  }
  const clusterOptions = { nodes: args.nodes, mode: args.mode as import("./cluster.ts").ClusterMode | undefined };
  const engines = cluster ? await cluster.startEngines() : null;
  try {
    for (let run = 0; run < args.runs; run++) {
      let result: RunResult;
      const startedAt = performance.now();
      try {
        result = cluster && engines ? await cluster.oneClusterRun(run, args.seed + run, args.keep, engines, clusterOptions) : await oneRun(run, args.seed + run, args.keep);
      } catch (error) {
        result = failedRun(run, args.seed + run, error);
      }
      result.durationMs = Math.round(performance.now() - startedAt);
      results.push(result);
      console.log(JSON.stringify(result));
    }
  } finally {
    engines?.stop();
  }
  console.log(JSON.stringify(summary(results)));
  process.exit(results.every((r) => realViolations(r).length === 0) ? 0 : 1);
}

export { oneRun };
