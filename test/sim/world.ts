// One simulation run: the real gateway (startGateway: its actors, routing, settlement, SQLite store in a
// temporary file, signed catalog) on the simulated clock, simulated buyers through its HTTP handler and
// simulated providers on the in-process network, all driven by one seed. World faults — clock jumps,
// failed commits, gateway crashes with a restart from the durable store — come from the same seed.
// After the run goes quiet the invariants of docs/reliability.md are checked (invariants.ts).
import { cpSync, existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { WebSocketHandler } from "bun";
import { loadConfig, type GatewayConfig } from "../../src/config/index.ts";
import { startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import type { SocketData } from "../../src/gateway/providerEndpoint.ts";
import { silentLog } from "../../src/log.ts";
import { judgedOf, type ReceiptJudge } from "../../src/receipts/judge.ts";
import { verifyReceipt } from "../../src/receipts/verify.ts";
import { LAZY_COMMIT_MS } from "../../src/store/groupCommit.ts";
import { prng } from "../../src/provider/synthetic.ts";
import { rng as seededRng } from "../support/seededRandom.ts";
import { catalogModel } from "../support/harness.ts";
import { SimClock, type TimerScope } from "./clock.ts";
import { SimBuyer } from "./buyer.ts";
import { SimProvider } from "./provider.ts";
import { FaultCounter, Trace } from "./trace.ts";
import { checkInvariants, QUIET_MS, type Bug } from "./invariants.ts";

export interface SimOptions {
  seed: number;
  /** Share of provider jobs with a fault (default 0.3). */
  faultRate?: number;
  /** World faults (clock jumps, failed commits, crashes); default on. */
  worldFaults?: boolean;
  /** A bug planted through a test-only hook, to prove the simulation finds it (sim.test.ts). */
  plantedBug?: Bug | null;
  /** The gateway stops on a failed commit, as it does in production (default); false: the behaviour before. */
  failStop?: boolean;
}

export interface SimResult {
  seed: number;
  violations: string[];
  trace: string[];
  faults: Map<string, number>;
  /** Buyers' endings and attempts' final labels, counted. */
  outcomes: Map<string, number>;
  /** Invariant checks evaluated (each a comparison that could have failed). */
  checks: number;
  requests: number;
  settlements: number;
  events: number;
}

/** Same rules as the gateway's judges, on the calling thread with node:crypto: no thread, no turn in between. */
const syncJudge: ReceiptJudge = {
  judge(input, done) {
    done(judgedOf(verifyReceipt(input)));
    return false;
  },
  stop() {},
};

const MODEL = "sim-model";
/** Drains the microtasks the last event started (every promise the gateway and buyers chain). */
const drain = () => new Promise<void>((resolve) => setImmediate(resolve));
const MAX_EVENTS = 200_000;

/** Temporary directories in memory when the machine has /dev/shm: the WAL's fsyncs then cost nothing. */
const TEMP_ROOT = existsSync("/dev/shm") ? "/dev/shm" : tmpdir();

function baseConfig(): GatewayConfig {
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  return { ...loaded.config, port: 0, logLevel: "error" };
}

let template: string | null = null;

/**
 * A data dir as a first start leaves it — database migrated, catalog key made and the model's catalog
 * signed — copied from one made once per process (a seed's own start then finds it all in place).
 */
async function freshDataDir(): Promise<string> {
  if (template === null) {
    const dir = mkdtempSync(join(TEMP_ROOT, "gw-sim-template-"));
    const clock = new SimClock();
    const scope = clock.scope("template");
    const gateway = await startGateway({ ...baseConfig(), dataDir: dir }, {
      now: clock.wall,
      log: silentLog,
      timers: scope,
      judge: syncJudge,
      catalogModels: [catalogModel(MODEL)],
      serve: () => ({ port: 1, stop: async () => {} }) as never,
      storeHooks: { syncWal: null },
    });
    await gateway.stop();
    template = dir;
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  const dir = mkdtempSync(join(TEMP_ROOT, "gw-sim-"));
  cpSync(template, dir, { recursive: true });
  return dir;
}

/** One gateway process: its timers, and the handlers Bun.serve would have been given. */
interface Incarnation {
  n: number;
  gateway: RunningGateway;
  scope: TimerScope;
  fetch: (request: Request) => Promise<Response | undefined>;
  websocket: WebSocketHandler<SocketData>;
  alive: boolean;
}

export async function runSeed(o: SimOptions): Promise<SimResult> {
  const faultRate = o.faultRate ?? 0.3;
  const worldFaults = o.worldFaults ?? true;
  const r = seededRng(o.seed);
  const gatewayRandom = prng((o.seed ^ 0x5eed) >>> 0);
  const clock = new SimClock();
  const trace = new Trace(clock);
  const faults = new FaultCounter();
  const dataDir = await freshDataDir();
  const config: GatewayConfig = {
    ...baseConfig(),
    dataDir,
    settlementMode: "enforce",
    firstByteTimeoutMs: 2_000,
    streamIdleTimeoutMs: 2_000,
    requestDeadlineMs: 20_000,
    heartbeatIntervalMs: 5_000,
    handshakeTimeoutMs: 2_000,
    pendingDeadlineMs: 10_000,
    maxAttempts: 3,
    // A third of the runs hedge: a second attempt to another provider when the first is slow to start.
    hedgeAfterMs: r.next() < 1 / 3 ? 100 + r.int(900) : 0,
    hedgeMaxPercent: 50,
    rateCard: JSON.stringify([{ slug: "default", prompt_credits_per_million: 700_000, completion_credits_per_million: 2_300_000 }]),
  };
  const model = catalogModel(MODEL);
  let failCommits = 0;
  let current: Incarnation | null = null;
  const stopErrors: string[] = [];
  let incarnations = 0;
  /** ms the gateway was down (I2's allowance) and the wall clock's forward jumps. */
  const allowance = { downMs: 0, forwardJumpMs: 0, backwardJumpMs: 0 };

  /**
   * The gateway process dies (kill -9, or its fail-stop on a failed commit): at once nothing of it runs
   * any more — no timer, no socket, no buyer connection — and what it had not committed is lost (closing
   * its store rolls the open group back: its commit fails, the process being dead). It restarts on the
   * same data dir a little later.
   */
  const crash = (dead: Incarnation, why: string): void => {
    if (!dead.alive) return;
    // A disk error that made a commit fail is gone after the restart.
    failCommits = 0;
    trace.add(`gateway #${dead.n} dies (${why})`);
    dead.alive = false;
    dead.scope.kill();
    for (const b of buyers) if (b.incarnation === dead.n) b.reset();
    for (const p of providers) p.gatewayDied();
    const downMs = 100 + r.int(3_000);
    allowance.downMs += downMs;
    // Its stop() stands in for the OS releasing the file; one that throws leaves the store unclosed.
    clock.at(0, () => void dead.gateway.stop().catch((error: unknown) => stopErrors.push(`gateway #${dead.n}'s stop() threw: ${String(error)}`)));
    clock.at(downMs, () => {
      void start().then((inc) => (current = inc));
    });
  };

  const start = async (): Promise<Incarnation> => {
    const n = ++incarnations;
    const scope = clock.scope(`gateway#${n}`);
    let handlers: { fetch: Incarnation["fetch"]; websocket: WebSocketHandler<SocketData> } | null = null;
    const inc = { n, scope, alive: true } as Incarnation;
    const gateway = await startGateway(config, {
      now: clock.wall,
      monotonicNow: clock.monotonic,
      randomBytes: (len) => {
        const out = new Uint8Array(len);
        for (let i = 0; i < len; i++) out[i] = Math.floor(gatewayRandom() * 256);
        return out;
      },
      log: silentLog,
      timers: scope,
      judge: syncJudge,
      catalogModels: [model],
      serve: (options) => {
        const server = { upgrade: () => false, requestIP: () => ({ address: "10.9.0.1", family: "IPv4", port: 40000 }) };
        handlers = {
          fetch: async (request) => (await (options.fetch as (req: Request, srv: unknown) => Response | Promise<Response | undefined> | undefined)(request, server)) ?? undefined,
          websocket: options.websocket as WebSocketHandler<SocketData>,
        };
        return { port: 1, stop: async () => {} } as never;
      },
      storeHooks: {
        endOfTurn: scope.setImmediate,
        lazyCommitTimer: (run) => void scope.setTimeout(run, LAZY_COMMIT_MS),
        // The WAL sync of a money-moving group: done a little later, unless the process died first.
        syncWal: (done) => void scope.setTimeout(() => done(true), r.int(3)),
        commitFails: () => {
          if (!inc.alive) return true;
          if (failCommits === 0) return false;
          failCommits--;
          trace.add("a group commit fails (injected)");
          return true;
        },
        onCommitFailed: () => {
          if (o.failStop !== false) crash(inc, "fail-stop on the failed commit");
        },
      },
    });
    if (!handlers) throw new Error("the gateway did not listen");
    Object.assign(inc, handlers, { gateway });
    if (o.plantedBug) plantBug(gateway, o.plantedBug, trace);
    trace.add(`gateway #${n} started`);
    return inc;
  };

  current = await start();
  const store = () => current!.gateway.store;

  // Buyers' accounts, keys and grants; providers pinned by the operator.
  const grants = new Map<string, number>();
  const accounts: { accountId: string; apiKey: string }[] = [];
  for (let i = 0, n = 1 + r.int(3); i < n; i++) {
    const { account_id } = await store().createAccount({ name: `buyer${i}`, tier: "paid" });
    const { api_key } = await store().createApiKey({ account_id });
    const credits = 200 + r.int(2_000);
    await store().grantCredits(account_id, credits, "sim grant");
    grants.set(account_id, credits);
    accounts.push({ accountId: account_id, apiKey: api_key });
  }
  const providers: SimProvider[] = [];
  for (let i = 0, n = 1 + r.int(3); i < n; i++) {
    const keySeed = new Uint8Array(32);
    for (let j = 0; j < 32; j++) keySeed[j] = r.int(256);
    const p = new SimProvider(
      { id: `prov${i}`, keySeed, model: { model_id: MODEL, model_hash: model.model_hash }, maxConcurrency: 1 + r.int(3), faultRate },
      clock,
      r,
      trace,
      faults,
      () => (current?.alive ? current.websocket : null),
    );
    await store().pinProvider(p.id, p.publicKey);
    providers.push(p);
    clock.at(r.int(300), () => p.connect());
  }

  // Buyers arrive over the first 15 s.
  const buyers: SimBuyer[] = [];
  for (let i = 0, n = 2 + r.int(10); i < n; i++) {
    const account = r.pick(accounts);
    const at = 500 + r.int(15_000);
    const abort = r.next() < faultRate / 3;
    const spec = {
      name: `buyer${i}`,
      apiKey: account.apiKey,
      model: MODEL,
      stream: r.next() < 0.5,
      maxTokens: 2 + r.int(20),
      prompt: `question ${i} ${"x".repeat(r.int(40))}`,
      abortAfterMs: abort ? r.int(3_000) : null,
    };
    clock.at(at, () => {
      const buyer = new SimBuyer(spec, trace, clock.monotonic);
      buyers.push(buyer);
      if (!current?.alive) return buyer.reset();
      buyer.incarnation = current.n;
      void buyer.run(current.fetch);
      if (spec.abortAfterMs !== null) {
        faults.count("buyer_abort");
        clock.at(spec.abortAfterMs, () => buyer.abort());
      }
    });
  }

  let providersLeftAt: number | null = null;
  // World faults over the first 25 s (none once the providers left: the run is winding down).
  if (worldFaults) {
    for (let i = 0, n = r.int(4); i < n; i++) {
      const kind = r.pick(["clock_jump", "commit_fails", "gateway_crash"] as const);
      const at = 200 + r.int(25_000);
      clock.at(at, () => {
        if (!current?.alive || providersLeftAt !== null) return;
        faults.count(kind);
        if (kind === "clock_jump") {
          const ms = r.pick([-1, 1]) * (1 + r.int(45_000));
          if (ms > 0) allowance.forwardJumpMs += ms;
          else allowance.backwardJumpMs -= ms;
          clock.jumpWall(ms);
          trace.add(`the wall clock jumps ${ms} ms`);
        } else if (kind === "commit_fails") {
          failCommits += 1 + r.int(2);
        } else crash(current, "killed");
      });
    }
  }

  // The end of the run: once every buyer is done and every receipt answered (or the pending deadline
  // has long passed), providers leave for good and the gateway goes quiet.
  let lastBuyersDone: number | null = null;
  const closer = () => {
    const allDone = buyers.length > 0 && buyers.every((b) => b.ended) && clock.monotonic() > 16_000;
    if (allDone) lastBuyersDone ??= clock.monotonic();
    const answered = providers.every((p) => p.outbox.size === 0);
    if (allDone && current?.alive && (answered || clock.monotonic() - lastBuyersDone! > config.pendingDeadlineMs + 10_000)) {
      trace.add("providers leave");
      providersLeftAt = clock.monotonic();
      for (const p of providers) p.retire();
      return;
    }
    clock.at(1_000, closer);
  };
  clock.at(1_000, closer);

  let events = 0;
  const violations: string[] = [];
  for (;;) {
    // Quiet: nothing left but the gateway's own intervals — or, once the providers left, nothing due
    // before every pending deadline has passed, and QUIET_MS more (a timer armed beyond that is a leak
    // I5 reports). A deadline is wall time (it survives a restart): after the wall clock went back, a
    // restart's resumed attempt waits that much longer.
    if (clock.onlyBackgroundLeft()) break;
    if (providersLeftAt !== null && (clock.nextAt() ?? 0) > providersLeftAt + config.pendingDeadlineMs + allowance.backwardJumpMs + QUIET_MS) break;
    if (!clock.step()) break;
    await drain();
    if (++events > MAX_EVENTS) {
      violations.push(`runaway: more than ${MAX_EVENTS} events`);
      break;
    }
  }
  await drain();
  const inc = current!;
  const checked = await checkInvariants({
    gateway: inc.gateway,
    scope: inc.scope,
    buyers,
    grants,
    config,
    allowance,
    acknowledged: new Map(providers.flatMap((p) => [...p.acknowledged])),
  });
  violations.push(...checked.violations);
  violations.push(...stopErrors);
  const rows = await inc.gateway.store.listSettlements();
  const settlements = rows.length;
  // What the buyers saw and how attempts ended, for the batch figures.
  const outcomes = new Map<string, number>();
  const tally = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1);
  for (const b of buyers) {
    const x = b.result;
    tally(
      x.reset ? "buyer: cut by a crash" : x.aborted ? "buyer: aborted" : `buyer: ${x.status ?? "no status"}${x.errorCode ? ` ${x.errorCode}` : x.completed ? " complete" : ""}`,
    );
  }
  for (const row of rows) tally(`attempt: ${row.label}${row.reason ? ` (${row.reason})` : ""}${row.debit_credits > 0 ? " charged" : ""}`);
  await inc.gateway.stop();
  rmSync(dataDir, { recursive: true, force: true });
  return { seed: o.seed, violations, trace: trace.lines, faults: faults.counts, outcomes, checks: checked.checks, requests: buyers.length, settlements, events };
}

/**
 * Plants a known bug by replacing one of the store's methods on the object every part of the gateway
 * calls through: `double_charge` bills twice the receipt's completion tokens; `leaked_slot` drops the
 * first release of a buyer's concurrency slot.
 */
function plantBug(gateway: RunningGateway, bug: Bug, trace: Trace): void {
  const store = gateway.store as unknown as Record<string, (...args: unknown[]) => unknown>;
  if (bug === "double_charge") {
    const settle = store.settleAttempt!;
    store.settleAttempt = (input: unknown, ...rest: unknown[]) => {
      const i = input as { billed?: { prompt_tokens: number; completion_tokens: number } | null };
      if (i.billed && i.billed.completion_tokens > 0) {
        trace.add("planted bug: billing twice the completion tokens");
        return settle({ ...i, billed: { ...i.billed, completion_tokens: i.billed.completion_tokens * 2 } }, ...rest);
      }
      return settle(input, ...rest);
    };
  } else {
    const release = store.releaseRequestSlot!;
    let dropped = false;
    store.releaseRequestSlot = (...args: unknown[]) => {
      if (!dropped) {
        dropped = true;
        trace.add("planted bug: a request slot is not released");
        return;
      }
      return release(...args);
    };
  }
}
