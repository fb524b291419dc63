// A simulated fleet on xstate's SimulatedClock: provider machines of mixed speeds (a share of them slow),
// buyers arriving at random, and the gateway's routing parts as they run in the request path —
// chooseProvider, RouteMemory and Cooldowns, the admission queue, the hedge trigger and budget.
// Deterministic for a seed. The figures it yields are in docs/routing.md.
import { SimulatedClock } from "xstate";
import { Cooldowns, DEFAULT_COOLDOWN_RULES } from "../../src/gateway/cooldowns.ts";
import { HedgeBudget, hedgeDelayMs, spareForHedge, TtftWindow, type HedgeMode } from "../../src/gateway/hedging.ts";
import { RouteMemory } from "../../src/gateway/routeMemory.ts";
import { chooseProvider, type ProviderLoad, type ProviderView, type RoutingPolicy } from "../../src/gateway/routing.ts";
import { SlotQueue } from "../../src/gateway/slotQueue.ts";
import { rng, type Rng } from "./seededRandom.ts";

export interface ProviderSpec {
  id: string;
  /** Slots it advertises (max_concurrency). */
  slots: number;
  /** Jobs its engine really runs at once; the rest wait in its own queue. */
  parallel: number;
  /** Time to first token when idle (ms). */
  prefillMs: number;
  /** Decode rate of one stream when alone (tokens/s). */
  decodeTps: number;
  /** A share of its jobs (`chance`) take `factor` times longer to a first token: the owner's other work, swapping, throttling. */
  slowJobs?: { chance: number; factor: number };
}

export interface FleetOptions {
  seed: number;
  providers: ProviderSpec[];
  policy: RoutingPolicy;
  /** Mean buyer arrivals per second (Poisson). */
  arrivalsPerS: number;
  requests: number;
  hedge?: HedgeMode;
  hedgeShare?: number;
  heartbeatMs?: number;
  queueWaitMs?: number;
}

export interface FleetResult {
  ttftMs: number[];
  p50: number;
  p99: number;
  served: number;
  unserved: number;
  hedges: number;
  hedgeWins: number;
  /** Share of heartbeat instants at which a provider had nothing in flight (machines that could sleep). */
  idleShare: number;
  /** Requests each provider served. */
  byProvider: Map<string, number>;
}

interface Job {
  request: SimRequest;
  provider: SimProvider;
  outTokens: number;
  state: "queued" | "prefill" | "decode" | "done";
  rate: number;
  decodeStart: number;
  timers: number[];
}

interface SimRequest {
  arrivedAt: number;
  outTokens: number;
  firstTokenAt: number | null;
  attempts: Job[];
  hedgeTimer: number | null;
  hedged: boolean;
}

class SimProvider {
  inFlight = 0;
  running: Job[] = [];
  waiting: Job[] = [];
  report: ProviderLoad = { queuedJobs: 0, decodeTokensPerS: 0, outstandingOutputTokens: 0 };
  constructor(readonly spec: ProviderSpec) {}

  /** Contention: each running job slows the others (half a job's worth at full parallelism). */
  slowdown(): number {
    return 1 + (0.5 * this.running.length) / this.spec.parallel;
  }

  load(now: number): ProviderLoad {
    let decode = 0;
    let outstanding = 0;
    let prefilling = 0;
    for (const j of this.running) {
      if (j.state === "prefill") {
        prefilling++;
        outstanding += j.outTokens;
      } else {
        decode += j.rate;
        outstanding += Math.max(0, j.outTokens - ((now - j.decodeStart) / 1000) * j.rate);
      }
    }
    for (const j of this.waiting) outstanding += j.outTokens;
    return { queuedJobs: this.waiting.length + prefilling, decodeTokensPerS: decode, outstandingOutputTokens: Math.round(outstanding) };
  }
}

/** Runs callbacks at their due times on a SimulatedClock (each sees `now()` equal to its due time). */
class Scheduler {
  readonly clock = new SimulatedClock();
  private readonly due: number[] = [];

  /** Delays are whole milliseconds: with fractions, the clock's `now - start >= timeout` can round false at the due time. */
  at(delayMs: number, run: () => void): number {
    const delay = Math.max(0, Math.ceil(delayMs));
    this.push(this.clock.now() + delay);
    return this.clock.setTimeout(run, delay);
  }

  cancel(id: number): void {
    this.clock.clearTimeout(id);
  }

  run(): void {
    while (this.due.length > 0) {
      const next = this.pop();
      if (next > this.clock.now()) this.clock.set(next);
    }
  }

  private push(t: number): void {
    const h = this.due;
    h.push(t);
    for (let i = h.length - 1; i > 0; ) {
      const p = (i - 1) >> 1;
      if (h[p]! <= h[i]!) break;
      [h[p], h[i]] = [h[i]!, h[p]!];
      i = p;
    }
  }

  private pop(): number {
    const h = this.due;
    const top = h[0]!;
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      for (let i = 0; ; ) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && h[l]! < h[m]!) m = l;
        if (r < h.length && h[r]! < h[m]!) m = r;
        if (m === i) break;
        [h[m], h[i]] = [h[i]!, h[m]!];
        i = m;
      }
    }
    return top;
  }
}

const quantile = (sorted: number[], q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;

export function simulateFleet(options: FleetOptions): FleetResult {
  const r: Rng = rng(options.seed);
  const sched = new Scheduler();
  const now = () => sched.clock.now();
  const providers = options.providers.map((spec) => new SimProvider(spec));
  const memory = new RouteMemory(new Cooldowns(DEFAULT_COOLDOWN_RULES, now));
  const window = new TtftWindow();
  const budget = new HedgeBudget(options.hedgeShare ?? 0.05);
  const hedge = options.hedge ?? { kind: "off" };
  const queue = new SlotQueue({
    maxWaitMs: options.queueWaitMs ?? 5_000,
    maxDepth: 10_000,
    timers: { setTimeout: (run, ms) => sched.at(ms, run), clearTimeout: (id) => sched.cancel(id as number) },
    defer: (run) => sched.at(0, run),
  });
  const result: FleetResult = { ttftMs: [], p50: 0, p99: 0, served: 0, unserved: 0, hedges: 0, hedgeWins: 0, idleShare: 0, byProvider: new Map() };
  let idleSamples = 0;
  let samples = 0;
  const model = "m";

  const views = (): ProviderView[] =>
    providers.map((p) => ({
      sessionId: p.spec.id,
      providerId: p.spec.id,
      tier: "pinned",
      state: p.inFlight < p.spec.slots ? "ready" : "busy",
      warmModels: [model],
      freeSlots: p.spec.slots - p.inFlight,
      inFlight: p.inFlight,
      maxConcurrency: p.spec.slots,
      load: p.report,
      awaitingFirstByte: p.waiting.length + p.running.filter((j) => j.state === "prefill").length,
    }));

  const startJob = (job: Job) => {
    const p = job.provider;
    job.state = "prefill";
    p.running.push(job);
    const hiccup = p.spec.slowJobs && r.next() < p.spec.slowJobs.chance ? p.spec.slowJobs.factor : 1;
    const slow = p.slowdown() * hiccup * (0.8 + 0.4 * r.next());
    job.timers.push(
      sched.at(p.spec.prefillMs * slow, () => {
        job.state = "decode";
        job.decodeStart = now();
        job.rate = p.spec.decodeTps / p.slowdown();
        firstToken(job);
        if (job.state !== "decode") return;
        job.timers.push(sched.at((job.outTokens / job.rate) * 1000, () => finish(job, true)));
      }),
    );
  };

  const release = (job: Job) => {
    const p = job.provider;
    for (const t of job.timers) sched.cancel(t);
    const wasRunning = p.running.indexOf(job);
    if (wasRunning >= 0) p.running.splice(wasRunning, 1);
    const wasWaiting = p.waiting.indexOf(job);
    if (wasWaiting >= 0) p.waiting.splice(wasWaiting, 1);
    job.state = "done";
    p.inFlight--;
    while (p.running.length < p.spec.parallel && p.waiting.length > 0) startJob(p.waiting.shift()!);
    queue.wake();
  };

  const finish = (job: Job, completed: boolean) => {
    if (job.state === "done") return;
    release(job);
    if (completed) memory.cooldowns.succeeded(job.provider.spec.id, model);
  };

  const firstToken = (job: Job) => {
    const req = job.request;
    memory.observeTtft(job.provider.spec.id, model, now() - (job as Job & { sentAt: number }).sentAt);
    if (req.firstTokenAt !== null) return;
    req.firstTokenAt = now();
    if (req.hedgeTimer !== null) sched.cancel(req.hedgeTimer);
    const ttft = now() - req.arrivedAt;
    window.add(model, ttft);
    result.ttftMs.push(ttft);
    result.served++;
    result.byProvider.set(job.provider.spec.id, (result.byProvider.get(job.provider.spec.id) ?? 0) + 1);
    if (req.hedged && job !== req.attempts[0]) result.hedgeWins++;
    // The first byte wins: the other attempt is cancelled at once.
    for (const other of req.attempts) {
      if (other === job) continue;
      memory.observeUnfinishedWait(other.provider.spec.id, model, now() - (other as Job & { sentAt: number }).sentAt);
      finish(other, false);
    }
  };

  const dispatch = (req: SimRequest, excluded: string[]): boolean => {
    const choice = chooseProvider(views(), model, excluded, { policy: options.policy, signals: memory.signals(model, providers.map((p) => p.spec.id)) });
    if (!choice.ok) return false;
    const p = providers.find((x) => x.spec.id === choice.provider.providerId)!;
    memory.dispatched(p.spec.id, model);
    p.inFlight++;
    const job: Job & { sentAt: number } = { request: req, provider: p, outTokens: req.outTokens, state: "queued", rate: 0, decodeStart: 0, timers: [], sentAt: now() };
    req.attempts.push(job);
    if (p.running.length < p.spec.parallel) startJob(job);
    else p.waiting.push(job);
    return true;
  };

  const armHedge = (req: SimRequest) => {
    const delay = hedgeDelayMs(hedge, window, model);
    if (delay === null) return;
    req.hedgeTimer = sched.at(delay, () => {
      req.hedgeTimer = null;
      if (req.firstTokenAt !== null) return;
      const pool = views();
      const spare = { freeSlots: pool.reduce((n, v) => n + v.freeSlots, 0), totalSlots: pool.reduce((n, v) => n + v.maxConcurrency!, 0), queued: queue.depthOf(model) };
      if (!spareForHedge(spare) || !budget.take()) return;
      if (dispatch(req, req.attempts.map((a) => a.provider.spec.id))) {
        req.hedged = true;
        result.hedges++;
      }
    });
  };

  const arrive = () => {
    const req: SimRequest = { arrivedAt: now(), outTokens: 50 + r.int(350), firstTokenAt: null, attempts: [], hedgeTimer: null, hedged: false };
    budget.requestStarted();
    if (dispatch(req, [])) armHedge(req);
    else {
      const queued = queue.enqueue({
        model,
        accountId: `acct-${r.int(10)}`,
        tryDispatch: () => {
          if (!dispatch(req, [])) return "no_slot";
          armHedge(req);
          return "dispatched";
        },
        expire: () => result.unserved++,
      });
      if (!queued) result.unserved++;
    }
  };

  // Arrivals (Poisson) and heartbeats (load reports every heartbeatMs), each scheduling the next, so
  // the clock holds few timers (SimulatedClock sorts them all at every step).
  let arrivals = 0;
  const nextArrival = () => {
    if (arrivals++ >= options.requests) return;
    sched.at((-Math.log(1 - r.next()) / options.arrivalsPerS) * 1000, () => {
      arrive();
      nextArrival();
    });
  };
  nextArrival();
  const running = () => arrivals <= options.requests || providers.some((p) => p.inFlight > 0);
  const heartbeatMs = options.heartbeatMs ?? 1_000;
  const beat = () => {
    for (const p of providers) {
      p.report = p.load(now());
      samples++;
      if (p.inFlight === 0) idleSamples++;
    }
    if (running()) sched.at(heartbeatMs, beat);
  };
  beat();
  sched.run();
  const sorted = [...result.ttftMs].sort((a, b) => a - b);
  result.p50 = quantile(sorted, 0.5);
  result.p99 = quantile(sorted, 0.99);
  result.idleShare = samples > 0 ? idleSamples / samples : 0;
  return result;
}

/** 20 providers of mixed speeds: 5 fast, 10 middling, 5 slow; two middling ones advertise more slots than they run. */
export function mixedFleet(): ProviderSpec[] {
  const fleet: ProviderSpec[] = [];
  for (let i = 0; i < 5; i++) fleet.push({ id: `fast-${i}`, slots: 8, parallel: 8, prefillMs: 150, decodeTps: 60 });
  for (let i = 0; i < 10; i++) {
    const overstated = i < 2;
    fleet.push({ id: `mid-${i}`, slots: overstated ? 8 : 4, parallel: overstated ? 2 : 4, prefillMs: 400, decodeTps: 30 });
  }
  for (let i = 0; i < 5; i++) fleet.push({ id: `slow-${i}`, slots: 2, parallel: 2, prefillMs: 1_200, decodeTps: 12 });
  return fleet;
}

/**
 * 20 providers, 10 % of them slow: 15 % of their jobs take ten times as long to a first token —
 * slowness routing cannot predict per request, only average.
 */
export function fleetWithSlowTenth(): ProviderSpec[] {
  const fleet: ProviderSpec[] = [];
  for (let i = 0; i < 18; i++) fleet.push({ id: `ok-${i}`, slots: 4, parallel: 4, prefillMs: 300, decodeTps: 30 });
  for (let i = 0; i < 2; i++) fleet.push({ id: `slow-${i}`, slots: 4, parallel: 4, prefillMs: 300, decodeTps: 30, slowJobs: { chance: 0.15, factor: 10 } });
  return fleet;
}

/** 20 alike providers, every one of them slow on 3 % of its jobs (ten times the first-token time): slowness no routing can avoid. */
export function fleetWithHiccups(): ProviderSpec[] {
  const fleet: ProviderSpec[] = [];
  for (let i = 0; i < 20; i++) fleet.push({ id: `p-${i}`, slots: 4, parallel: 4, prefillMs: 300, decodeTps: 30, slowJobs: { chance: 0.03, factor: 10 } });
  return fleet;
}
