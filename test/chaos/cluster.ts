// Crash chaos on a cluster (issue 22): `bun run chaos --cluster --runs N [--seed S] [--nodes N]
// [--mode M]`. The embedded variant's counterpart (test/chaos/chaos.ts), with the same buyers and the
// same checks (common.ts). Each run: N `gateway serve` nodes (3 unless --nodes) on one private
// PostgreSQL database and one private Redis, two provider processes given every node's URL (they move
// to the next after a dropped connection), six paid buyers spread over the nodes, streaming and not,
// which act as a load balancer in front of SDKs would: a request whose connection failed before any
// response is sent once more to another node (`x-stainless-retry-count: 1`), and the failed node gets
// no more traffic until it is back. Then the run's fault, one mode a run (seeded, or --mode):
//   - kill:   `kill -9` of a random node at a random moment (sometimes the one holding the providers'
//             sockets, sometimes only buyers'), restarted under its own id at once (as systemd's
//             Restart=always does) or after a while;
//   - double: the same node killed again within six leases of its first death, soon after its
//             restart (while the survivors may still be resolving its first incarnation);
//   - two:    a second node killed while the first is down or just back;
//   - pg:     PostgreSQL stopped for 1–5 s around the kill (before or after it);
//   - redis:  Redis killed and started again empty (`--save ''`) around the kill;
//   - split:  no kill: one live node cut off from Redis, PostgreSQL or both (through a TCP proxy the
//             run severs: connections reset, or held silent) for 1.5–3 leases while it keeps its
//             provider sockets and buyers; a free-tier account (2 at once) holds two slow streams on
//             it and asks a survivor for two more once the cut outlived a lease;
//   - splitkill: the split, and a node killed while it lasts (the cut-off one or another), started
//             again at once or a moment later;
//   - links:  no kill: the node links between two live nodes cut, and only those (each node's link
//             server behind a proxy it announces, which cuts by the dialing node: reset, or held
//             silent) for 1.5–3 leases while both reach the engines and buyers are served across them;
//   - oneway: no kill: the node links between two live nodes silent in one direction only (a one-way
//             packet loss, a half-broken NAT: no FIN, no RST, B's bytes to A just stop while A's reach
//             B) for 1–3 leases — B mostly one holding a provider's socket, so its answers go the
//             silent way — then restored, or reset and made again; no request may wait on an answer
//             sent into the silence for longer than the link's silence is noticed in;
//   - stall:  no kill: one live node's process stopped (SIGSTOP) for 1–3 leases — mostly one holding a
//             provider's socket — while buyers are served across the cluster, then woken (SIGCONT):
//             the others take it for dead meanwhile, and it must fence itself on waking before it
//             relays or writes anything of what they resolved; it serves again without a restart.
// On kill runs also a provider or a CLI in the middle of `credits grant` on some. Then more load,
// every settlement resolves, and the run checks the embedded run's invariants against PostgreSQL
// (`gateway ledger audit --database-url …`), plus: no request hangs, no concurrency slot is left once
// the load stops, no account ever had more streams open than its limit, every node serves again
// without a restart of its own, and no buyer got an error other than a retryable 503 (or a 4xx).
// Figures: time until the dead node's providers are served again by a survivor, until its slots stop
// counting, and until the restarted node serves.
import { RedisClient } from "bun";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { syntheticPlan } from "../../src/provider/synthetic.ts";
import { collectJsonLines, MAIN, modelHash, waitFor } from "../support/harness.ts";
import { startPostgres, type PostgresServer } from "../support/postgres.ts";
import { freePort } from "../support/ports.ts";
import { startRedis, type TestRedis } from "../support/redis.ts";
import { rng } from "../support/seededRandom.ts";
import { startTcpProxy, type CutStyle, type TcpProxy } from "../support/tcpProxy.ts";
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

const LEASE_MS = 2000;
const PENDING_DEADLINE_MS = 2000;
/** The free tier's concurrency limit (the default): what the split's slot check counts against. */
const FREE_LIMIT = 2;

export const CLUSTER_MODES = ["kill", "double", "two", "pg", "redis", "split", "splitkill", "links", "stall", "oneway"] as const;
export type ClusterMode = (typeof CLUSTER_MODES)[number];
/** The modes a run without --mode draws from its seed: those before `oneway`, so that a seed draws what it drew before (CI's 22100–22102, the seeds in docs/reliability.md). */
const DRAWN_MODES = CLUSTER_MODES.slice(0, CLUSTER_MODES.indexOf("oneway"));

export interface ClusterRunOptions {
  /** Nodes in the cluster (3 unless given; at least 3). */
  nodes?: number;
  /** The run's fault; drawn from the seed when not given. */
  mode?: ClusterMode;
}

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

/** A stream of the free-tier account, timed as its buyer saw it: sent, answered 200 (headers), ended. */
interface TimedStream {
  node: string;
  model: string;
  status: number;
  okAt: number | null;
  endAt: number | null;
  bytes: number;
  ended: "done" | "error" | "cut" | null;
}

/** A prompt whose synthetic answer has at least `tokens` tokens: a slow provider streams it for long. */
function longPrompt(tokens: number): string {
  for (let i = 0; ; i++) {
    const content = `hold the slot ${i}`;
    if (syntheticPlan([{ role: "user", content }], 1000).tokens.length >= tokens) return content;
  }
}

async function timedStream(base: string, node: string, apiKey: string, model: string, content: string, received: Received, into: TimedStream[], maxTokens = 1000): Promise<TimedStream> {
  const t: TimedStream = { node, model, status: 0, okAt: null, endAt: null, bytes: 0, ended: null };
  into.push(t);
  try {
    const response = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model, messages: [{ role: "user", content }], max_tokens: maxTokens, stream: true }),
      signal: AbortSignal.timeout(30_000),
    });
    t.status = response.status;
    if (response.status !== 200) {
      await response.text();
      return t;
    }
    t.okAt = performance.now();
    const id = (response.headers.get("x-request-id") ?? "").replace(/^chatcmpl-/, "");
    const text = await response.text();
    t.endAt = performance.now();
    for (const event of text.split("\n\n")) {
      if (!event.startsWith("data: {")) continue;
      const delta = (JSON.parse(event.slice(6)) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content;
      if (delta) t.bytes += new TextEncoder().encode(delta).byteLength;
    }
    received.set(id, t.bytes);
    t.ended = text.includes("data: [DONE]") ? "done" : "error";
  } catch {
    t.endAt = performance.now();
    t.ended = "cut";
  }
  return t;
}

/** The most streams open at one moment (between their 200 and their end), as their buyers saw them. */
function mostOpenAtOnce(streams: TimedStream[], until: number): number {
  const edges: [number, number][] = [];
  for (const s of streams) {
    if (s.okAt === null) continue;
    edges.push([s.okAt, 1], [s.endAt ?? until, -1]);
  }
  // An end and a start at the same instant: the end first.
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let open = 0;
  let most = 0;
  for (const [, d] of edges) most = Math.max(most, (open += d));
  return most;
}

export async function oneClusterRun(run: number, seed: number, keep: boolean, engines: Engines, options: ClusterRunOptions = {}): Promise<RunResult> {
  const random = rng(seed).next;
  const NODES = Math.max(3, options.nodes ?? 3);
  const mode: ClusterMode = options.mode ?? DRAWN_MODES[Math.floor(random() * DRAWN_MODES.length)]!;
  const dataDir = mkdtempSync(join(tmpdir(), "gw-cchaos-"));
  const databaseUrl = await engines.postgres.freshDatabase();
  let redis: TestRedis | null = null;
  let monitor: RedisClient | null = null;
  const nodes: Node[] = [];
  const providers: Logged[] = [];
  const proxies: TcpProxy[] = [];
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
    const split = mode === "split" || mode === "splitkill" ? { index: Math.floor(random() * NODES), engines: (["redis", "postgres", "both"] as const)[Math.floor(random() * 3)]!, style: (random() < 0.5 ? "reset" : "blackhole") as CutStyle } : null;
    const slowModels = split ? ["chaos-slow-a", "chaos-slow-b"] : [];
    for (const m of [MODEL, ...slowModels]) if (cli(["catalog", "add", "--model-id", m, "--model-hash", modelHash(m)]).exitCode !== 0) throw new Error("catalog add failed");
    const created = JSON.parse(cli(["accounts", "create", "--tier", "paid", "--name", "chaos"]).stdout) as { account_id: string; api_key: string };
    const acknowledged: string[] = [];
    const grant = (memo: string) => {
      if (cli(["credits", "grant", "--account", created.account_id, "--credits", "1000000", "--memo", memo]).exitCode === 0) acknowledged.push(memo);
    };
    grant(`cchaos-${run}-initial`);
    // Split runs: a free-tier account (2 at once), made before the load (a CLI blocks this process).
    const free = split ? (JSON.parse(cli(["accounts", "create", "--tier", "free", "--name", "limited"]).stdout) as { api_key: string }) : null;

    // The split node reaches its engines through proxies the run can sever; the others directly.
    const redisProxy = split && split.engines !== "postgres" ? await startTcpProxy(redis.port) : null;
    const pgProxy = split && split.engines !== "redis" ? await startTcpProxy(engines.postgres.port) : null;
    for (const p of [redisProxy, pgProxy]) if (p) proxies.push(p);
    const ports = await Promise.all(Array.from({ length: NODES }, () => freePort()));
    // Links runs: each node's link server behind a proxy of its own, which the node announces; the
    // proxy tells the dialing node by its link's header, so a cut can part two nodes only.
    const linkPorts = mode === "links" || mode === "oneway" ? await Promise.all(Array.from({ length: NODES }, () => freePort())) : [];
    const linkProxies = await Promise.all(linkPorts.map((port) => startTcpProxy(port, { tagHeader: "x-gateway-node", holdCloses: true })));
    proxies.push(...linkProxies);
    const nodeArgs = (i: number) => {
      const nodeRedis = i === split?.index && redisProxy ? `redis://127.0.0.1:${redisProxy.port}` : redisUrl;
      const nodeDatabase = i === split?.index && pgProxy ? databaseUrl.replace(`:${engines.postgres.port}/`, `:${pgProxy.port}/`) : databaseUrl;
      return [
        "bun", MAIN, "serve", "--data-dir", dataDir, "--port", String(ports[i]), "--database-url", nodeDatabase, "--redis-url", nodeRedis,
        "--node-id", `n${i + 1}`, "--cluster-lease-ms", String(LEASE_MS), "--settlement-mode", "enforce",
        "--pending-deadline-ms", String(PENDING_DEADLINE_MS), "--heartbeat-interval-ms", "500",
        // Six buyers on one account: the shared slot limit is exercised, not the point of every refusal.
        "--paid-concurrent-requests", "16",
        ...(linkProxies[i] ? ["--cluster-link-port", String(linkPorts[i]), "--cluster-link-announce", `127.0.0.1:${linkProxies[i]!.port}`] : []),
      ];
    };
    // As systemd's Restart=always (RestartSec=1): a node that exits before it joined (its engine down) is started again.
    const startNode = async (i: number): Promise<Node> => {
      const deadline = performance.now() + 120_000;
      for (;;) {
        const proc = Bun.spawn(nodeArgs(i), { stdout: "pipe", stderr: "pipe" });
        const events: Record<string, unknown>[] = [];
        collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
        const stderr = keepTail(proc.stderr as ReadableStream<Uint8Array>);
        // Generous: on a loaded shared machine a process start has taken 20 s.
        await waitFor(() => events.some((e) => e.event === "cluster_joined") || proc.exitCode !== null, Math.max(1, deadline - performance.now()), `node n${i + 1} joined`);
        if (proc.exitCode === null) return { proc, events, name: `n${i + 1}`, port: ports[i]!, base: `http://127.0.0.1:${ports[i]}`, ws: `ws://127.0.0.1:${ports[i]}/v1/provider/connect` };
        if (performance.now() > deadline) throw new Error(await exitReason(`node n${i + 1}`, proc, stderr, events));
        await Bun.sleep(1000);
      }
    };
    // Started together: a run's setup is most of its time.
    nodes.push(...(await Promise.all(Array.from({ length: NODES }, (_, i) => startNode(i)))));
    // Each provider lists every node, starting at a random one: both may land on one node, or apart.
    const gatewaysFrom = (first: number) => Array.from({ length: NODES }, (_, k) => nodes[(first + k) % NODES]!.ws);
    const providerGateways = [gatewaysFrom(Math.floor(random() * NODES)), gatewaysFrom(Math.floor(random() * NODES))];
    const providerIds = ["chaos-a", "chaos-b"];
    providers.push(startProvider(dataDir, providerGateways[0]!, providerIds[0]!), startProvider(dataDir, providerGateways[1]!, providerIds[1]!));
    /** The providers' live processes (the first two entries); killed ones stay in the list for their log. */
    const current = [0, 1];
    // The split's slow providers: one on the split node (its streams hold the free account's slots
    // there), one on the next node (what a survivor routes the account's next streams to).
    if (split) {
      providers.push(startProvider(dataDir, gatewaysFrom(split.index), "chaos-slow-a", [], { model: slowModels[0], tokensPerSecond: 6 }));
      providers.push(startProvider(dataDir, gatewaysFrom((split.index + 1) % NODES), "chaos-slow-b", [], { model: slowModels[1], tokensPerSecond: 6 }));
    }
    const admitted = async (node: Node) => {
      try {
        const r = await fetch(`${node.base}/healthz`);
        return r.status === 200 ? ((await r.json()) as { providers_admitted: number }).providers_admitted : 0;
      } catch {
        return 0;
      }
    };
    await waitFor(async () => (await Promise.all(nodes.map(admitted))).every((n) => n >= 2 + slowModels.length), 60_000, "every provider routable on every node");

    const received: Received = new Map();
    const refused = new Map<string, number>();
    const retries: Retries = { unanswered: [], sent: 0, replayed: 0, timedOut: 0, refused, longestMs: 0 };
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
        const own: Retries = { unanswered: [], sent: 0, replayed: 0, timedOut: 0, refused, longestMs: 0 };
        const at = pick(home);
        const ok = await oneRequest(nodes[at]!.base, created.api_key, i % 2 === 0, received, random, own);
        for (const u of own.unanswered) {
          // No response at all: the balancer marks the node down; the SDK's retry lands on a live one.
          down.add(at);
          await oneRequest(nodes[pick(home)]!.base, created.api_key, u.stream, received, random, own, u);
        }
        retries.sent += own.sent;
        retries.replayed += own.replayed;
        retries.timedOut += own.timedOut;
        retries.longestMs = Math.max(retries.longestMs!, own.longestMs!);
        // A refusal (an engine down, no provider yet) comes back at once: a short pause, as an SDK's backoff.
        if (!ok) await Bun.sleep(20);
      }
    };
    const loops = Array.from({ length: 6 }, (_, i) => buyer(i, i % NODES));

    const killAtMs = 300 + Math.floor(random() * 1500);
    await Bun.sleep(killAtMs);
    const killNode = async (i: number) => {
      await killHard(nodes[i]!.proc);
      killed.push(`node:${nodes[i]!.name}`);
    };
    const restartNode = async (i: number) => {
      nodes[i] = await startNode(i);
      down.delete(i);
    };
    let victimIndex = Math.floor(random() * NODES);
    let victim = nodes[victimIndex]!;
    let downMs = 0;
    let heldBy: number[] = [];
    let listeningMs = -1;
    let slotsFreed: Promise<number | null> = Promise.resolve(null);
    let providersBack: Promise<number | null> = Promise.resolve(null);
    let grantDuringKill: Promise<void> | null = null;
    const limited: TimedStream[] = [];
    let splitFigures: { cutMs: number; probeStatuses: number[]; heldEnded: (string | null)[] } | null = null;
    let linkFigures: { style: string; cutMs: number; reopenedMs?: number | null; linksOpened: number; linksClosed: number; linksSilent: number; linksLost: number; otherLinksLost: number } | null = null;

    if (split) {
      // The split: the free account's two slow streams on the split node, then its engines cut off.
      victimIndex = split.index;
      victim = nodes[victimIndex]!;
      const content = longPrompt(40);
      const held = Array.from({ length: FREE_LIMIT }, () => timedStream(victim.base, victim.name, free!.api_key, slowModels[0]!, content, received, limited));
      const limitedOk = () => limited.filter((t) => t.okAt !== null).length;
      const heldStarted = performance.now();
      // Both answered (200) before the cut, else the check below has nothing to hold.
      await waitFor(() => limitedOk() >= FREE_LIMIT, 15_000, "the free account's streams answered").catch(() => {});
      const cutMs = Math.round(LEASE_MS * (1.5 + random() * 1.5));
      for (const p of proxies) await p.cut(split.style);
      const cutAt = performance.now();
      killed.push(`split:${victim.name}:${split.engines}:${split.style}`);
      // splitkill: a node killed while the cut lasts — the cut-off one, or another — and started again
      // as systemd would: at once (it joins once it reaches its engines), or a moment later.
      let restarting: Promise<void> = Promise.resolve();
      if (mode === "splitkill") {
        const target = random() < 0.5 ? victimIndex : (victimIndex + 1 + Math.floor(random() * (NODES - 1))) % NODES;
        const killAt = Math.floor(cutMs * (0.1 + random() * 0.8));
        const pause = random() < 0.5 ? 0 : 500 + Math.floor(random() * 1500);
        restarting = (async () => {
          await Bun.sleep(killAt);
          await killNode(target);
          down.add(target);
          await Bun.sleep(pause);
          await restartNode(target);
        })();
      }
      // Once the cut outlived a lease, the account asks a survivor for two more (short) streams: the
      // split node's two must no longer run by then (or must still count), or the account has four at once.
      await Bun.sleep(LEASE_MS * 1.3);
      const survivor = nodes[(victimIndex + 1) % NODES]!;
      const probes = Array.from({ length: FREE_LIMIT }, () => timedStream(survivor.base, survivor.name, free!.api_key, slowModels[1]!, content, received, limited, 5));
      await Bun.sleep(Math.max(0, cutMs - (performance.now() - cutAt)));
      for (const p of proxies) await p.restore();
      const restoredAt = performance.now();
      await restarting;
      const all = await Promise.all([...held, ...probes]);
      splitFigures = { cutMs, probeStatuses: all.slice(FREE_LIMIT).map((t) => t.status), heldEnded: all.slice(0, FREE_LIMIT).map((t) => t.ended) };
      if (all.slice(0, FREE_LIMIT).some((t) => t.okAt === null)) violations.push(`the split node did not start the free account's streams before the cut (statuses ${all.slice(0, FREE_LIMIT).map((t) => t.status)})`);
      if (all.some((t) => t.okAt !== null && t.endAt !== null && t.endAt - heldStarted > 60_000)) violations.push("a free-tier stream ran for more than 60 s");
      // The split node serves again once its engines are back, without a restart.
      let recoverMs = -1;
      while (performance.now() - restoredAt < 60_000) {
        const node = nodes[victimIndex]!;
        if ((await admitted(node)) >= 1 && (await oneRequest(node.base, created.api_key, false, received, random, null))) {
          recoverMs = Math.round(performance.now() - restoredAt);
          break;
        }
        await Bun.sleep(50);
      }
      listeningMs = 0;
      if (recoverMs < 0) violations.push(`the split node ${victim.name} did not serve within 60 s of its engines' return`);
      downMs = cutMs;
      return await finish(recoverMs);
    }

    if (mode === "links") {
      // Two live nodes split from each other, and from no one else: each one's proxy cuts the links the
      // other dials into it (reset, or held silent) for 1.5–3 leases while both reach Redis and
      // PostgreSQL and serve. One of them holds a provider's socket when one does, so buyers of the
      // other are served across the cut; the other nodes' links to both stay up.
      const holding = nodes.findIndex((n) => current.some((p) => providerNode(providers[p]!) === n.ws));
      const anyNode = Math.floor(random() * NODES);
      victimIndex = holding >= 0 ? holding : anyNode;
      victim = nodes[victimIndex]!;
      const other = (victimIndex + 1 + Math.floor(random() * (NODES - 1))) % NODES;
      const style: CutStyle = random() < 0.5 ? "reset" : "blackhole";
      const cutMs = Math.round(LEASE_MS * (1.5 + random() * 1.5));
      await linkProxies[victimIndex]!.cut(style, [nodes[other]!.name]);
      await linkProxies[other]!.cut(style, [victim.name]);
      killed.push(`links:${victim.name}-${nodes[other]!.name}:${style}`);
      await Bun.sleep(cutMs);
      await linkProxies[victimIndex]!.restore();
      await linkProxies[other]!.restore();
      const logged = (event: string) => nodes.reduce((n, node) => n + node.events.filter((e) => e.event === event).length, 0);
      // Links lost between a node of the pair and one outside it: none, the partition being exact.
      const pair = new Set([victim.name, nodes[other]!.name]);
      const otherLinksLost = nodes.reduce((n, node) => n + node.events.filter((e) => e.event === "cluster_link_lost" && pair.has(node.name) !== pair.has(String(e.peer))).length, 0);
      linkFigures = { style, cutMs, linksOpened: logged("cluster_link_open"), linksClosed: logged("cluster_link_closed"), linksSilent: logged("cluster_link_silent"), linksLost: logged("cluster_link_lost"), otherLinksLost };
      downMs = cutMs;
      listeningMs = 0;
      return await finish(0);
    }

    if (mode === "oneway") {
      // B's bytes to A stop, A's to B flow: on B's outbound links A's proxy holds what B sends
      // (dialer-silent), on A's outbound links B's proxy holds what B answers (listener-silent, its
      // pongs). B is mostly a node holding a provider's socket, so its frames to A's buyers go the silent way.
      const holding = nodes.findIndex((n) => current.some((p) => providerNode(providers[p]!) === n.ws));
      const anyNode = Math.floor(random() * NODES);
      victimIndex = holding >= 0 && random() < 0.8 ? holding : anyNode;
      victim = nodes[victimIndex]!;
      heldBy = current.filter((p) => providerNode(providers[p]!) === victim.ws);
      const hearing = (victimIndex + 1 + Math.floor(random() * (NODES - 1))) % NODES;
      const cutMs = Math.round(LEASE_MS * (1 + random() * 2));
      const ending = random() < 0.5 ? "restore" : "reset";
      await linkProxies[hearing]!.cut("dialer-silent", [victim.name]);
      await linkProxies[victimIndex]!.cut("listener-silent", [nodes[hearing]!.name]);
      killed.push(`oneway:${victim.name}->${nodes[hearing]!.name}:${ending}`);
      await Bun.sleep(cutMs);
      // Restored (what waited flows), or both ways reset first (the links are made again).
      if (ending === "reset") {
        await linkProxies[hearing]!.cut("reset", [victim.name]);
        await linkProxies[victimIndex]!.cut("reset", [nodes[hearing]!.name]);
      }
      await linkProxies[hearing]!.restore();
      await linkProxies[victimIndex]!.restore();
      const restoredAt = performance.now();
      // Both links between the two are made again once both ways flow (a dropped link retries every second).
      const linkUp = (from: Node, to: Node) =>
        from.events.filter((e) => e.peer === to.name && ["cluster_link_open", "cluster_link_closed", "cluster_link_silent", "cluster_link_unreachable"].includes(String(e.event))).at(-1)?.event === "cluster_link_open";
      const reopened = await waitFor(() => linkUp(victim, nodes[hearing]!) && linkUp(nodes[hearing]!, victim), 15_000, "the links made again").then(
        () => Math.round(performance.now() - restoredAt),
        () => null,
      );
      if (reopened === null) violations.push(`the links between ${victim.name} and ${nodes[hearing]!.name} were not made again within 15 s of the restore`);
      const logged = (event: string) => nodes.reduce((n, node) => n + node.events.filter((e) => e.event === event).length, 0);
      const pair = new Set([victim.name, nodes[hearing]!.name]);
      const otherLinksLost = nodes.reduce((n, node) => n + node.events.filter((e) => e.event === "cluster_link_lost" && pair.has(node.name) !== pair.has(String(e.peer))).length, 0);
      linkFigures = { style: ending, cutMs, reopenedMs: reopened, linksOpened: logged("cluster_link_open"), linksClosed: logged("cluster_link_closed"), linksSilent: logged("cluster_link_silent"), linksLost: logged("cluster_link_lost"), otherLinksLost };
      downMs = cutMs;
      listeningMs = 0;
      return await finish(0);
    }

    if (mode === "stall") {
      const holding = nodes.findIndex((n) => current.some((p) => providerNode(providers[p]!) === n.ws));
      victimIndex = holding >= 0 && random() < 0.7 ? holding : Math.floor(random() * NODES);
      victim = nodes[victimIndex]!;
      heldBy = current.filter((p) => providerNode(providers[p]!) === victim.ws);
      const stallMs = Math.round(LEASE_MS * (1 + random() * 2));
      victim.proc.kill("SIGSTOP");
      killed.push(`stall:${victim.name}:${stallMs}`);
      await Bun.sleep(stallMs);
      victim.proc.kill("SIGCONT");
      const wokenAt = performance.now();
      // The woken node serves again without a restart (its providers may have moved to a survivor).
      let recoverMs = -1;
      while (performance.now() - wokenAt < 60_000) {
        if (await oneRequest(victim.base, created.api_key, false, received, random, null)) {
          recoverMs = Math.round(performance.now() - wokenAt);
          break;
        }
        await Bun.sleep(50);
      }
      if (recoverMs < 0) violations.push(`the stalled node ${victim.name} did not serve within 60 s of waking`);
      downMs = stallMs;
      listeningMs = 0;
      return await finish(recoverMs);
    }

    // The crash: a random node every run; on some runs also a provider, or a CLI in the middle of a grant.
    const extra = random();
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
    // pg / redis: the engine fails shortly before the kill, or shortly after it.
    const engineFirst = random() < 0.5;
    const engineGap = Math.floor(random() * 800);
    const engineDownMs = 1000 + Math.floor(random() * 4000);
    const engineOutage = async () => {
      if (mode === "pg") {
        killed.push("postgres");
        await engines.postgres.stopAsync();
        await Bun.sleep(engineDownMs);
        await engines.postgres.startAsync();
      } else if (mode === "redis") {
        killed.push("redis");
        await redis!.kill();
        await Bun.sleep(Math.floor(engineDownMs / 2));
        await redis!.restart();
      }
    };
    let outage: Promise<void> = Promise.resolve();
    if (engineFirst && (mode === "pg" || mode === "redis")) {
      outage = engineOutage();
      await Bun.sleep(engineGap);
    }
    heldBy = current.filter((p) => providerNode(providers[p]!) === victim.ws);
    const slotsBefore = mode === "redis" ? [] : ((await monitor.send("ZRANGE", [`gw:slots:${created.account_id}`, "0", "-1"]).catch(() => [])) as string[]);
    const eventsBefore = heldBy.map((p) => providers[p]!.events.length);
    await killNode(victimIndex);
    const killedAt = performance.now();
    if (!engineFirst && (mode === "pg" || mode === "redis")) {
      await Bun.sleep(engineGap);
      outage = engineOutage();
    }

    // Figures while the node is down: its slots stop counting; its providers are served by a survivor.
    slotsFreed = (async () => {
      while (performance.now() - killedAt < 30_000) {
        const counted = slotsBefore.length === 0 ? 0 : Number(await monitor!.send("EVAL", [STILL_COUNTED, "1", `gw:slots:${created.account_id}`, ...slotsBefore]).catch(() => 1));
        if (counted === 0) return Math.round(performance.now() - killedAt);
        await Bun.sleep(20);
      }
      violations.push("slots taken before the kill still counted 30 s after it");
      return null;
    })();
    // A survivor: the first node after the victim that runs now (in `two` runs the next one may be the
    // second node killed; asking it measured that node's restart, not the providers' move).
    const survivor = () => {
      for (let k = 1; k < NODES; k++) {
        const n = nodes[(victimIndex + k) % NODES]!;
        if (n.proc.exitCode === null && n.proc.signalCode === null) return n;
      }
      return null;
    };
    providersBack = (async () => {
      if (heldBy.length === 0) return null;
      while (performance.now() - killedAt < 60_000) {
        const moved = heldBy.every((p, k) => providers[p]!.events.slice(eventsBefore[k]).some((e) => e.event === "welcome"));
        const at = moved ? survivor() : null;
        if (at && (await admitted(at)) >= 2 && (await oneRequest(at.base, created.api_key, false, received, random, null))) {
          return Math.round(performance.now() - killedAt);
        }
        await Bun.sleep(20);
      }
      violations.push("the dead node's providers were not served again within 60 s");
      return null;
    })();
    await grantDuringKill;

    // Down for a while (or restarted at once, as systemd does), under the buyers' load on the survivors.
    downMs = random() < 0.3 ? 0 : 500 + Math.floor(random() * 4000);
    if (mode === "two") {
      // A second node dies while the first is down, or just after it came back.
      const second = (victimIndex + 1 + Math.floor(random() * (NODES - 1))) % NODES;
      const whileDown = random() < 0.5;
      const secondDownMs = random() < 0.3 ? 0 : 500 + Math.floor(random() * 2500);
      if (whileDown) {
        downMs = Math.max(downMs, 1000);
        const at = Math.floor(random() * downMs);
        await Bun.sleep(at);
        await killNode(second);
        await Bun.sleep(downMs - at);
      } else await Bun.sleep(downMs);
      const restartedAt = performance.now();
      const restarting = restartNode(victimIndex);
      if (!whileDown) {
        await restarting;
        await Bun.sleep(Math.floor(random() * 1500));
        await killNode(second);
      }
      await Bun.sleep(secondDownMs);
      await restartNode(second);
      await restarting;
      listeningMs = Math.round(performance.now() - restartedAt);
    } else {
      await Bun.sleep(downMs);
      const restartedAt = performance.now();
      await restartNode(victimIndex);
      listeningMs = Math.round(performance.now() - restartedAt);
      if (mode === "double") {
        // Killed again within six leases of the first death: soon after it joined, while the others
        // may still be letting go of (or resolving) its first incarnation.
        await Bun.sleep(Math.floor(random() * 2000));
        await killNode(victimIndex);
        await Bun.sleep(random() < 0.5 ? 0 : 300 + Math.floor(random() * 2000));
        await restartNode(victimIndex);
      }
    }
    await outage;
    const restartedAt = performance.now();
    let recoverMs = -1;
    while (performance.now() - restartedAt < 120_000) {
      if ((await admitted(nodes[victimIndex]!)) >= 1 && (await oneRequest(nodes[victimIndex]!.base, created.api_key, false, received, random, null))) {
        recoverMs = Math.round(performance.now() - restartedAt);
        break;
      }
      await Bun.sleep(50);
    }
    if (recoverMs < 0) violations.push("the restarted node did not serve within 120 s");
    return await finish(recoverMs);

    async function finish(recoverMs: number): Promise<RunResult> {
      const slotsFreedMs = await slotsFreed;
      const providersBackMs = await providersBack;
      // Every node serves again with no restart of its own (an engine's return is noticed by itself).
      for (const n of nodes) {
        const from = performance.now();
        let served = false;
        while (!served && performance.now() - from < 30_000) {
          served = (await admitted(n)) >= 1 && (await oneRequest(n.base, created.api_key, false, received, random, null));
          if (!served) await Bun.sleep(100);
        }
        if (!served) violations.push(`node ${n.name} did not serve within 30 s once the faults were over`);
      }
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
        // A fresh client: the run's may have lost its connection with a Redis restart.
        const counter = new RedisClient(redisUrl);
        const slotsLeft = Number(await counter.send("EVAL", [COUNTED, "1", `gw:slots:${created.account_id}`]).finally(() => counter.close()));
        if (slotsLeft > 0) violations.push(`${slotsLeft} concurrency slots still held once the load stopped`);
        if (retries.timedOut > 0) violations.push(`${retries.timedOut} requests had not ended 15 s after they were sent`);
        // A one-way silence is noticed within 1.2 leases of the link's last byte: a request that waited
        // much longer waited on an answer sent into the silence (up to the first-byte timeout).
        if (mode === "oneway" && retries.longestMs! > LEASE_MS * 4) violations.push(`a request took ${retries.longestMs} ms (more than 4 leases) across a one-way silent link`);
        // The account's limit held across the split: never more of its streams open at once than it allows.
        const most = mostOpenAtOnce(limited, performance.now());
        if (most > FREE_LIMIT) violations.push(`a free-tier account (limit ${FREE_LIMIT}) had ${most} streams open at once`);
        // An engine down is a retryable 503 to buyers, never another server error.
        for (const [what, n] of refused) if (what.startsWith("5") && !/^503 \S+ retryable$/.test(what)) violations.push(`${n} responses ${what}`);
        await Promise.all(
          nodes.map(async (n) => {
            n.proc.kill("SIGTERM");
            await Promise.race([n.proc.exited, Bun.sleep(15_000)]);
            await killHard(n.proc);
          }),
        );
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
          writeFileSync(join(dataDir, "limited.json"), JSON.stringify(limited, null, 1));
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
          cluster: {
            mode,
            nodes: NODES,
            victim: victim.name,
            heldProviders: heldBy.length,
            downMs,
            providersBackMs,
            slotsFreedMs,
            longestMs: retries.longestMs!,
            refused: Object.fromEntries(refused),
            ...(splitFigures ? { split: splitFigures } : {}),
            ...(linkFigures ? { links: linkFigures } : {}),
          },
          violations,
        };
      } finally {
        await sql.close();
      }
    }
  } finally {
    for (const n of nodes) {
      if (n.proc.exitCode === null) n.proc.kill("SIGCONT");
      await killHard(n.proc);
    }
    for (const p of providers) await killHard(p.proc);
    for (const p of proxies) await p.stop();
    monitor?.close();
    await redis?.stop();
    if (!keepDir) rmSync(dataDir, { recursive: true, force: true });
  }
}
