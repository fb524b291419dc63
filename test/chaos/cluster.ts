// Crash chaos on a cluster (issue 22): `bun run chaos --cluster --runs N [--seed S]`. The embedded
// variant's counterpart (test/chaos/chaos.ts), with the same buyers and the same checks (common.ts).
// Each run: three `gateway serve` nodes on one private PostgreSQL database and one private Redis,
// two provider processes given every node's URL (they move to the next after a dropped connection),
// six paid buyers spread over the nodes, streaming and not, which act as a load balancer in front of
// SDKs would: a request whose connection failed before any response is sent once more to another
// node (`x-stainless-retry-count: 1`), and the failed node gets no more traffic until it is back.
// Then `kill -9` of a random node at a random moment (sometimes the one holding the providers'
// sockets, sometimes only buyers'), on some runs also of a provider or of a CLI in the middle of
// `credits grant`; the node is restarted under its own id (at once, as systemd's Restart=always does,
// or after a while), more load, every settlement resolves, and the run checks the embedded run's
// invariants against PostgreSQL (`gateway ledger audit --database-url …`), plus: no request hangs,
// and no concurrency slot is left once the load stops. Figures: time until the dead node's providers
// are served again by a survivor, until its slots stop counting, and until the restarted node serves.
import { RedisClient } from "bun";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collectJsonLines, MAIN, modelHash, waitFor } from "../support/harness.ts";
import { startPostgres, type PostgresServer } from "../support/postgres.ts";
import { freePort } from "../support/ports.ts";
import { startRedis, type TestRedis } from "../support/redis.ts";
import { rng } from "../support/seededRandom.ts";
import {
  cli as gatewayCli,
  exitReason,
  keepTail,
  killHard,
  ledgerViolations,
  MODEL,
  oneRequest,
  SETTLEMENT_COLUMNS,
  startProvider,
  type Logged,
  type Received,
  type Retries,
  type RunResult,
  type SettlementRow,
} from "./common.ts";

const NODES = 3;
const LEASE_MS = 2000;
const PENDING_DEADLINE_MS = 2000;

/** The engines of an invocation: one private PostgreSQL server (a fresh database a run); Redis is per run. */
export interface Engines {
  postgres: PostgresServer;
  stop(): void;
}

export async function startEngines(): Promise<Engines> {
  const postgres = await startPostgres();
  return { postgres, stop: () => postgres.destroy() };
}

interface Node extends Logged {
  name: string;
  port: number;
  base: string;
  ws: string;
}

// Slots of `members` (request ids taken before the kill) that Redis still counts (lease not expired).
const STILL_COUNTED = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for _, m in ipairs(ARGV) do
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s and tonumber(s) > now then n = n + 1 end
end
return n`;
const COUNTED = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')`;

/** The node URL a provider's current session is on, from its log (null while it has none). */
function providerNode(p: Logged): string | null {
  let connected: string | null = null;
  let current: string | null = null;
  for (const e of p.events) {
    if (e.event === "connected") connected = String(e.url);
    else if (e.event === "welcome") current = connected;
    else if (e.event === "closed") current = null;
  }
  return current;
}

export async function oneClusterRun(run: number, seed: number, keep: boolean, engines: Engines): Promise<RunResult> {
  const random = rng(seed).next;
  const dataDir = mkdtempSync(join(tmpdir(), "gw-cchaos-"));
  const databaseUrl = await engines.postgres.freshDatabase();
  let redis: TestRedis | null = null;
  let monitor: RedisClient | null = null;
  const nodes: Node[] = [];
  const providers: Logged[] = [];
  let keepDir = keep;
  try {
    redis = await startRedis();
    const redisUrl = redis.url;
    monitor = new RedisClient(redisUrl);
    await monitor.connect();
    const violations: string[] = [];
    const killed: string[] = [];
    const cli = (args: string[]) => gatewayCli([...args, "--data-dir", dataDir, "--database-url", databaseUrl]);
    if (cli(["catalog", "init"]).exitCode !== 0) throw new Error("catalog init failed");
    if (cli(["catalog", "add", "--model-id", MODEL, "--model-hash", modelHash(MODEL)]).exitCode !== 0) throw new Error("catalog add failed");
    const created = JSON.parse(cli(["accounts", "create", "--tier", "paid", "--name", "chaos"]).stdout) as { account_id: string; api_key: string };
    const acknowledged: string[] = [];
    const grant = (memo: string) => {
      if (cli(["credits", "grant", "--account", created.account_id, "--credits", "1000000", "--memo", memo]).exitCode === 0) acknowledged.push(memo);
    };
    grant(`cchaos-${run}-initial`);

    const ports = await Promise.all(Array.from({ length: NODES }, () => freePort()));
    const nodeArgs = (i: number) => [
      "bun", MAIN, "serve", "--data-dir", dataDir, "--port", String(ports[i]), "--database-url", databaseUrl, "--redis-url", redisUrl,
      "--node-id", `n${i + 1}`, "--cluster-lease-ms", String(LEASE_MS), "--settlement-mode", "enforce",
      "--pending-deadline-ms", String(PENDING_DEADLINE_MS), "--heartbeat-interval-ms", "500",
      // Six buyers on one account: the shared slot limit is exercised, not the point of every refusal.
      "--paid-concurrent-requests", "16",
    ];
    const startNode = async (i: number): Promise<Node> => {
      const proc = Bun.spawn(nodeArgs(i), { stdout: "pipe", stderr: "pipe" });
      const events: Record<string, unknown>[] = [];
      collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
      const stderr = keepTail(proc.stderr as ReadableStream<Uint8Array>);
      // Generous: on a loaded shared machine a process start has taken 20 s.
      await waitFor(() => events.some((e) => e.event === "cluster_joined") || proc.exitCode !== null, 120_000, `node n${i + 1} joined`);
      if (proc.exitCode !== null) throw new Error(await exitReason(`node n${i + 1}`, proc, stderr, events));
      return { proc, events, name: `n${i + 1}`, port: ports[i]!, base: `http://127.0.0.1:${ports[i]}`, ws: `ws://127.0.0.1:${ports[i]}/v1/provider/connect` };
    };
    for (let i = 0; i < NODES; i++) nodes.push(await startNode(i));
    // Each provider lists every node, starting at a random one: both may land on one node, or apart.
    const gatewaysFrom = (first: number) => Array.from({ length: NODES }, (_, k) => nodes[(first + k) % NODES]!.ws);
    const providerGateways = [gatewaysFrom(Math.floor(random() * NODES)), gatewaysFrom(Math.floor(random() * NODES))];
    const providerIds = ["chaos-a", "chaos-b"];
    providers.push(startProvider(dataDir, providerGateways[0]!, providerIds[0]!), startProvider(dataDir, providerGateways[1]!, providerIds[1]!));
    /** The providers' live processes (the first two entries); killed ones stay in the list for their log. */
    const current = [0, 1];
    const admitted = async (node: Node) => {
      try {
        const r = await fetch(`${node.base}/healthz`);
        return r.status === 200 ? ((await r.json()) as { providers_admitted: number }).providers_admitted : 0;
      } catch {
        return 0;
      }
    };
    await waitFor(async () => (await Promise.all(nodes.map(admitted))).every((n) => n >= 2), 60_000, "both providers routable on every node");

    const received: Received = new Map();
    const retries: Retries = { unanswered: [], sent: 0, replayed: 0, timedOut: 0 };
    // The load balancer's view: a node whose connection failed gets no traffic until it is back.
    const down = new Set<number>();
    const pick = (home: number) => {
      for (let k = 0; k < NODES; k++) if (!down.has((home + k) % NODES)) return (home + k) % NODES;
      return home;
    };
    let load = true;
    let requests = 0;
    const buyer = async (i: number, home: number) => {
      while (load) {
        requests++;
        const own: Retries = { unanswered: [], sent: 0, replayed: 0, timedOut: 0 };
        const at = pick(home);
        await oneRequest(nodes[at]!.base, created.api_key, i % 2 === 0, received, random, own);
        for (const u of own.unanswered) {
          // No response at all: the balancer marks the node down; the SDK's retry lands on a live one.
          down.add(at);
          await oneRequest(nodes[pick(home)]!.base, created.api_key, u.stream, received, random, own, u);
        }
        retries.sent += own.sent;
        retries.replayed += own.replayed;
        retries.timedOut += own.timedOut;
      }
    };
    const loops = Array.from({ length: 6 }, (_, i) => buyer(i, i % NODES));

    // The crash: a random node every run; on some runs also a provider, or a CLI in the middle of a grant.
    const killAtMs = 300 + Math.floor(random() * 1500);
    await Bun.sleep(killAtMs);
    const victimIndex = Math.floor(random() * NODES);
    const victim = nodes[victimIndex]!;
    const extra = random();
    let grantDuringKill: Promise<void> | null = null;
    if (extra < 0.2) {
      const memo = `cchaos-${run}-killed-cli`;
      const proc = Bun.spawn(["bun", MAIN, "credits", "grant", "--account", created.account_id, "--credits", "5", "--memo", memo, "--data-dir", dataDir, "--database-url", databaseUrl], {
        stdout: "ignore",
        stderr: "ignore",
      });
      grantDuringKill = (async () => {
        await Bun.sleep(Math.floor(random() * 600));
        await killHard(proc);
        if (proc.exitCode === 0) acknowledged.push(memo);
        killed.push("cli");
      })();
    } else if (extra < 0.4) {
      const which = Math.floor(random() * 2);
      await killHard(providers[current[which]!]!.proc);
      killed.push("provider");
      providers.push(startProvider(dataDir, providerGateways[which]!, providerIds[which]!));
      current[which] = providers.length - 1;
    }
    const heldBy = current.filter((p) => providerNode(providers[p]!) === victim.ws);
    const slotsBefore = (await monitor.send("ZRANGE", [`gw:slots:${created.account_id}`, "0", "-1"])) as string[];
    const eventsBefore = heldBy.map((p) => providers[p]!.events.length);
    await killHard(victim.proc);
    const killedAt = performance.now();
    killed.push(`node:${victim.name}`);

    // Figures while the node is down: its slots stop counting; its providers are served by a survivor.
    const slotsFreed = (async () => {
      while (performance.now() - killedAt < 30_000) {
        const counted = slotsBefore.length === 0 ? 0 : Number(await monitor!.send("EVAL", [STILL_COUNTED, "1", `gw:slots:${created.account_id}`, ...slotsBefore]));
        if (counted === 0) return Math.round(performance.now() - killedAt);
        await Bun.sleep(20);
      }
      violations.push("slots taken before the kill still counted 30 s after it");
      return null;
    })();
    const survivor = nodes[(victimIndex + 1) % NODES]!;
    const providersBack = (async () => {
      if (heldBy.length === 0) return null;
      while (performance.now() - killedAt < 60_000) {
        const moved = heldBy.every((p, k) => providers[p]!.events.slice(eventsBefore[k]).some((e) => e.event === "welcome"));
        if (moved && (await admitted(survivor)) >= 2 && (await oneRequest(survivor.base, created.api_key, false, received, random, null))) {
          return Math.round(performance.now() - killedAt);
        }
        await Bun.sleep(20);
      }
      violations.push("the dead node's providers were not served again within 60 s");
      return null;
    })();
    await grantDuringKill;

    // Down for a while (or restarted at once, as systemd does), under the buyers' load on the survivors.
    const downMs = random() < 0.3 ? 0 : 500 + Math.floor(random() * 4000);
    await Bun.sleep(downMs);
    const restartedAt = performance.now();
    nodes[victimIndex] = await startNode(victimIndex);
    const listeningMs = Math.round(performance.now() - restartedAt);
    down.delete(victimIndex);
    let recoverMs = -1;
    while (performance.now() - restartedAt < 120_000) {
      if ((await admitted(nodes[victimIndex]!)) >= 1 && (await oneRequest(nodes[victimIndex]!.base, created.api_key, false, received, random, null))) {
        recoverMs = Math.round(performance.now() - restartedAt);
        break;
      }
      await Bun.sleep(50);
    }
    if (recoverMs < 0) violations.push("the restarted node did not serve within 120 s");
    const slotsFreedMs = await slotsFreed;
    const providersBackMs = await providersBack;
    grant(`cchaos-${run}-after`);
    await Bun.sleep(500);
    load = false;
    await Promise.all(loops);

    // Every settlement resolves by its deadline (a dead node's by the survivor that reaps it).
    const sql = new Bun.SQL(databaseUrl, { max: 1 });
    try {
      // Read while every node still runs: a node's clean stop hands its leftovers to the others, which
      // would hide what nobody resolved.
      const unresolved = async () =>
        (await sql`SELECT (SELECT count(*)::int FROM settlements WHERE label = 'pending') AS pending, (SELECT count(*)::int FROM reservations WHERE state = 'held') AS held`)[0] as {
          pending: number;
          held: number;
        };
      const settleBy = performance.now() + PENDING_DEADLINE_MS + LEASE_MS * 3 + 5000;
      let left = await unresolved();
      while ((left.pending > 0 || left.held > 0) && performance.now() < settleBy) {
        await Bun.sleep(100);
        left = await unresolved();
      }
      if (left.pending > 0) violations.push(`${left.pending} settlements still pending ${Math.round((PENDING_DEADLINE_MS + LEASE_MS * 3 + 5000) / 1000)} s after the load stopped`);
      if (left.held > 0) violations.push(`${left.held} reservations still held after the load stopped`);
      // What was left, for finding the cause (the database goes with the invocation's server).
      const leftRows =
        left.pending + left.held > 0
          ? [
              ...(await sql`SELECT 'settlement' AS kind, request_id, attempt_n, provider_id, created_at_ms, ended_at_ms, pending_deadline_at_ms FROM settlements WHERE label = 'pending'`),
              ...(await sql`SELECT 'reservation' AS kind, request_id, created_at_ms, request_ended FROM reservations WHERE state = 'held'`),
            ]
          : [];
      // Once quiet, no slot is held (the embedded run's I5, on Redis's count).
      const slotsLeft = Number(await monitor.send("EVAL", [COUNTED, "1", `gw:slots:${created.account_id}`]));
      if (slotsLeft > 0) violations.push(`${slotsLeft} concurrency slots still held once the load stopped`);
      if (retries.timedOut > 0) violations.push(`${retries.timedOut} requests had not ended 15 s after they were sent`);
      for (const n of nodes) {
        n.proc.kill("SIGTERM");
        await Promise.race([n.proc.exited, Bun.sleep(15_000)]);
        await killHard(n.proc);
      }
      for (const p of providers) await killHard(p.proc);

      // Invariants, read from PostgreSQL.
      const audit = cli(["ledger", "audit"]);
      if (audit.exitCode !== 0) violations.push(`ledger audit: exit ${audit.exitCode} ${audit.stdout.slice(0, 300)}`);
      const settlements = (await sql.unsafe(`SELECT ${SETTLEMENT_COLUMNS} FROM settlements`)) as SettlementRow[];
      const storedGrantMemos = new Set(((await sql`SELECT memo FROM ledger_postings WHERE kind = 'grant'`) as { memo: string }[]).map((r) => r.memo));
      violations.push(...ledgerViolations({ acknowledgedGrants: acknowledged, storedGrantMemos, settlements, providerEvents: providers.flatMap((p) => p.events), received }));
      if (keep || violations.length > 0) {
        // What it takes to find the cause: every process's log and the settlements.
        for (const n of nodes) writeFileSync(join(dataDir, `${n.name}.log`), n.events.map((e) => JSON.stringify(e)).join("\n"));
        writeFileSync(join(dataDir, "killed-node.log"), victim.events.map((e) => JSON.stringify(e)).join("\n"));
        providers.forEach((p, i) => writeFileSync(join(dataDir, `provider-${i}.log`), p.events.map((e) => JSON.stringify(e)).join("\n")));
        writeFileSync(join(dataDir, "settlements.json"), JSON.stringify(settlements, null, 1));
        writeFileSync(join(dataDir, "received.json"), JSON.stringify([...received]));
        writeFileSync(join(dataDir, "unresolved.json"), JSON.stringify(leftRows, null, 1));
        keepDir = true;
        violations.push(`data dir kept: ${dataDir}`);
      }
      return {
        run,
        seed,
        killed,
        killAtMs,
        requests,
        settlements: settlements.length,
        grantsAcknowledged: acknowledged.length,
        listeningMs,
        recoverMs,
        retried: retries.sent,
        replayed: retries.replayed,
        cluster: { victim: victim.name, heldProviders: heldBy.length, downMs, providersBackMs, slotsFreedMs },
        violations,
      };
    } finally {
      await sql.close();
    }
  } finally {
    for (const n of nodes) await killHard(n.proc);
    for (const p of providers) await killHard(p.proc);
    monitor?.close();
    await redis?.stop();
    if (!keepDir) rmSync(dataDir, { recursive: true, force: true });
  }
}
