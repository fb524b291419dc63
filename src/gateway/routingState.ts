// Routing's live state for one gateway node and what the request path tells it: the cooldown table,
// what routing remembers, the admission queue, the hedge trigger and budget, and the counters that
// /metrics, /v1/status and the logs show (docs/routing.md).
import { Cooldowns, type CooldownChange, type CooldownRules, type FailureKind } from "./cooldowns.ts";
import { HedgeBudget, hedgeDelayMs, spareForHedge, TtftWindow, type HedgeMode } from "./hedging.ts";
import { RouteMemory } from "./routeMemory.ts";
import { chooseProvider, type ProviderView, type RouteChoice, type RoutingPolicy } from "./routing.ts";
import { SlotQueue, type QueueTimers } from "./slotQueue.ts";
import type { Log } from "../log.ts";
import type { RoutingMetrics } from "../metrics.ts";

export interface RoutingSettings {
  policy: RoutingPolicy;
  spreadFactor: number;
  cooldown: CooldownRules;
  queueWaitMs: number;
  queueMaxDepth: number;
  hedge: HedgeMode;
  /** Hedges may be at most this share (0–1) of requests. */
  hedgeShare: number;
}

export const DEFAULT_ROUTING: RoutingSettings = {
  policy: "consolidate",
  spreadFactor: 2,
  cooldown: { baseMs: 5_000, maxMs: 300_000, trialTimeoutMs: 60_000 },
  queueWaitMs: 5_000,
  queueMaxDepth: 1_000,
  hedge: { kind: "off" },
  hedgeShare: 0.05,
};

/** Routing settings from the gateway's configuration (docs/configuration.md). */
export function routingSettingsFrom(config: {
  routingPolicy: RoutingPolicy;
  routingSpreadFactor: number;
  cooldownBaseMs: number;
  cooldownMaxMs: number;
  queueWaitMs: number;
  queueMaxDepth: number;
  hedgeAfterMs: number;
  hedgeAdaptive: boolean;
  hedgeMaxPercent: number;
}): RoutingSettings {
  const hedge: HedgeMode = config.hedgeAdaptive
    ? { kind: "adaptive", minMs: config.hedgeAfterMs }
    : config.hedgeAfterMs > 0
      ? { kind: "fixed", afterMs: config.hedgeAfterMs }
      : { kind: "off" };
  return {
    policy: config.routingPolicy,
    spreadFactor: config.routingSpreadFactor,
    cooldown: { baseMs: config.cooldownBaseMs, maxMs: Math.max(config.cooldownBaseMs, config.cooldownMaxMs), trialTimeoutMs: DEFAULT_ROUTING.cooldown.trialTimeoutMs },
    queueWaitMs: config.queueWaitMs,
    queueMaxDepth: config.queueMaxDepth,
    hedge,
    hedgeShare: Math.min(100, config.hedgeMaxPercent) / 100,
  };
}

/** How an attempt ended, for routing: it completed, it failed (a cooldown), or it says nothing of the provider. */
export type AttemptVerdict = { kind: "success" } | { kind: "failure"; failure: FailureKind } | { kind: "no_verdict" };

/** Counters shown in /metrics (cumulative since start). */
export interface RoutingCounters {
  cooldownTransitions: Record<CooldownChange["event"], number>;
  queue: { full: number };
  sticky: { hit: number; miss: number };
  hedges: { sent: number; won: number; lost: number };
}

export function createRoutingState(settings: RoutingSettings, deps: { now: () => number; log: Log; timers?: QueueTimers; defer?: (run: () => void) => void }) {
  const counters: RoutingCounters = {
    cooldownTransitions: { cooled: 0, trial_started: 0, reset: 0 },
    queue: { full: 0 },
    sticky: { hit: 0, miss: 0 },
    hedges: { sent: 0, won: 0, lost: 0 },
  };
  const onChange = (change: CooldownChange) => {
    counters.cooldownTransitions[change.event]++;
    const fields = { provider_id: change.providerId, model: change.model, level: change.level };
    if (change.event === "cooled") deps.log.warn("provider_cooled", { ...fields, cooldown_ms: change.cooldownMs, cause: change.failure });
    else if (change.event === "trial_started") deps.log.info("provider_trial", fields);
    else deps.log.info("provider_recovered", fields);
  };
  const cooldowns = new Cooldowns(settings.cooldown, deps.now, onChange);
  const memory = new RouteMemory(cooldowns);
  const timers: QueueTimers = deps.timers ?? { setTimeout: (run, ms) => setTimeout(run, ms), clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>) };
  const queue = new SlotQueue({ maxWaitMs: settings.queueWaitMs, maxDepth: settings.queueMaxDepth, timers, defer: deps.defer });
  const window = new TtftWindow();
  const budget = new HedgeBudget(settings.hedgeShare);

  return {
    settings,
    cooldowns,
    memory,
    queue,
    counters,
    /** The queue's and the hedges' timers (the simulation's, test/sim/, or the real ones). */
    timers,

    /** The routing decision over these candidates, with what this node learned about them. */
    choose(views: readonly ProviderView[], model: string, excluded: readonly string[], stickyProviderId: string | null): RouteChoice {
      const signals = memory.signals(model, views.map((v) => v.providerId));
      return chooseProvider(views, model, excluded, { policy: settings.policy, spreadFactor: settings.spreadFactor, stickyProviderId, signals });
    },

    dispatched(providerId: string, model: string): void {
      memory.dispatched(providerId, model);
    },

    /** An attempt's first chunk arrived `ms` after its job was sent. */
    firstByte(providerId: string, model: string, ms: number): void {
      memory.observeTtft(providerId, model, ms);
      window.add(model, ms);
    },

    /** The gateway let an attempt go: what it says about the provider; `waitedMs` when it had no first byte. */
    attemptEnded(providerId: string, model: string, verdict: AttemptVerdict, waitedMs: number | null): void {
      if (waitedMs !== null) memory.observeUnfinishedWait(providerId, model, waitedMs);
      if (verdict.kind === "success") cooldowns.succeeded(providerId, model);
      else if (verdict.kind === "failure") cooldowns.failed(providerId, model, verdict.failure);
      else cooldowns.noVerdict(providerId, model);
    },

    settled(providerId: string, label: "verified" | "quarantined" | "zero_settled"): void {
      memory.settled(providerId, label);
    },

    requestStarted(): void {
      budget.requestStarted();
    },

    /** How long an attempt of `model` may wait for its first byte before a hedge; null = never. */
    hedgeDelayMs(model: string): number | null {
      return hedgeDelayMs(settings.hedge, window, model);
    },

    /** Whether a hedge may go now for `model` (spare capacity, nobody queued, budget); spends the budget. */
    mayHedge(views: readonly ProviderView[], model: string): boolean {
      let free = 0;
      let total = 0;
      for (const v of views) {
        if (!v.warmModels.includes(model) || v.state === "asleep" || v.state === "draining") continue;
        free += v.state === "ready" ? v.freeSlots : 0;
        total += v.maxConcurrency ?? v.freeSlots + v.inFlight;
      }
      return spareForHedge({ freeSlots: free, totalSlots: total, queued: queue.depthOf(model) }) && budget.take();
    },

    /** Forgets what this node learned (cooldowns, first-token times, shares, history). */
    reset(): void {
      memory.clear();
    },

    /** What /metrics shows of routing. */
    metrics(): RoutingMetrics {
      const cooling = { cooling: 0, half_open: 0, trial: 0 };
      for (const c of cooldowns.list()) if (c.health !== "healthy") cooling[c.health]++;
      return {
        cooldowns: cooling,
        cooldownTransitions: { ...counters.cooldownTransitions },
        queueDepth: queue.depth,
        queue: { served: queue.served, expired: queue.expired, full: counters.queue.full },
        sticky: { ...counters.sticky },
        hedges: { ...counters.hedges },
      };
    },

    /** The pairs not healthy, for /v1/status. */
    cooldownList(): { provider_id: string; model: string; state: string; level: number; seconds_left: number }[] {
      const now = deps.now();
      return [...cooldowns.list()].map((c) => ({
        provider_id: c.providerId,
        model: c.model,
        state: c.health,
        level: c.entry.level,
        seconds_left: Math.max(0, Math.ceil((c.entry.until - now) / 1000)),
      }));
    },
  };
}

export type RoutingState = ReturnType<typeof createRoutingState>;
