// Routing decision (pure): which provider gets the next attempt, from snapshots of the candidates and
// of what the gateway learned about them. Rules, formula and when each policy fits: docs/routing.md.
// Pure over plain data so that candidates held by other gateway nodes can be fed in too.
import type { ProviderTier } from "../../actors/providerSession.ts";
import type { Health } from "./cooldowns.ts";

/** What a provider reports of its load in heartbeats (optional on the wire: docs/protocol.md). */
export interface ProviderLoad {
  /** Jobs accepted and not yet producing output (waiting in the provider's own queue or prefill). */
  queuedJobs: number;
  /** Output tokens per second the machine decoded lately, all jobs together. */
  decodeTokensPerS: number;
  /** Output tokens still to come of the jobs it runs: the sum of each job's max_tokens minus what it produced. */
  outstandingOutputTokens: number;
}

export interface ProviderView {
  sessionId: string;
  providerId: string;
  tier: ProviderTier;
  /** Sub-state of the admitted session: only "ready" takes new work. */
  state: "ready" | "busy" | "asleep" | "draining";
  warmModels: readonly string[];
  freeSlots: number;
  inFlight: number;
  /** The session's max_concurrency (capacity share in the spread bound); default freeSlots + inFlight. */
  maxConcurrency?: number;
  /** The last load report, or null when the provider does not send one. */
  load?: ProviderLoad | null;
  /** Attempts on it that have not delivered a first chunk yet: the gateway's own, always current, count. */
  awaitingFirstByte?: number;
}

/** What the gateway learned about a (provider, model) pair; absent = nothing known (a newcomer). */
export interface RouteSignals {
  health: Health;
  /** Observed time to first token of this provider for the model (EWMA, ms), or null. */
  ttftMs: number | null;
  /** This provider's share (0–1) of the model's recent dispatches. */
  recentShare: number;
  /** Settlement history of the provider: attempts labelled verified, and quarantined. */
  verified: number;
  quarantined: number;
  /** Failures of the provider on this model in the recent window. */
  recentFailures: number;
}

export type RoutingPolicy = "consolidate" | "shortest_wait";
export const ROUTING_POLICIES: readonly RoutingPolicy[] = ["consolidate", "shortest_wait"];

export interface RouteOptions {
  policy?: RoutingPolicy;
  /** A provider may take at most this multiple of its capacity share of a model's recent dispatches. */
  spreadFactor?: number;
  /** The conversation's pinned provider (sticky routing), used when it can take the request. */
  stickyProviderId?: string | null;
  /** Signals by provider id. */
  signals?: ReadonlyMap<string, RouteSignals>;
}

export type RouteChoice =
  | {
      ok: true;
      provider: ProviderView;
      /** The pair was half-open: this attempt is its trial. */
      trial: boolean;
      /** The sticky provider was used. */
      sticky: boolean;
      /** Only providers in cooldown (or with a trial running) could take it. */
      lastResort: boolean;
    }
  | { ok: false; code: "model_not_available" | "coordinator_unavailable" };

export const DEFAULT_SPREAD_FACTOR = 2;
/** TTFT assumed for a provider never measured, when no candidate has been measured either. */
const UNMEASURED_TTFT_MS = 1_000;
/** Reliability this far below the best candidate's leaves a provider out of consolidation's first band. */
const TRUSTED_BAND = 0.25;
/** Consolidation treats a provider this many times slower to first token than the pool's median as saturated. */
const SLOW_FACTOR = 3;

const NO_SIGNALS: RouteSignals = { health: "healthy", ttftMs: null, recentShare: 0, verified: 0, quarantined: 0, recentFailures: 0 };
const tierRank = (tier: ProviderTier): number => (tier === "pinned" ? 0 : 1);
const capacityOf = (p: ProviderView): number => Math.max(1, p.maxConcurrency ?? p.freeSlots + p.inFlight);

/**
 * How much routing trusts a provider (0–1): (verified + 4) / (verified + quarantined + 4) of its
 * settlement history — a newcomer starts at 1, one quarantine alone does not demote it, repeated ones
 * do — halved per recent failure on the model.
 */
export function reliability(s: RouteSignals): number {
  const history = (s.verified + 4) / (s.verified + s.quarantined + 4);
  return Math.min(1, history) * 0.5 ** Math.min(s.recentFailures, 10);
}

/**
 * Expected wait (ms) to the first token on a provider, docs/routing.md: its observed TTFT, stretched by
 * how full it is (in flight / slots); plus, when it reports jobs queued in its own engine, the time for
 * that many slots and one more to free — one frees every O / (R × S) seconds (O outstanding output
 * tokens, R tokens/s decoded, S slots).
 */
export function expectedWaitMs(p: ProviderView, ttftMs: number): number {
  const slots = capacityOf(p);
  const base = ttftMs * (1 + p.inFlight / slots);
  const load = p.load;
  if (!load || load.queuedJobs <= 0 || load.decodeTokensPerS <= 0) return base;
  return base + ((load.queuedJobs + 1) * 1000 * load.outstandingOutputTokens) / (load.decodeTokensPerS * slots);
}

/**
 * Among admitted, ready sessions with the model warm and a free slot (excluding providers that already
 * failed this request): the sticky provider if it is one of them and healthy; else, among healthy or
 * half-open pairs (cooling ones only when nothing else can take it), within the spread bound, by policy.
 * A model no connected provider advertises is unknown (model_not_available); a known model with no
 * usable provider right now is a capacity problem (coordinator_unavailable).
 */
export function chooseProvider(
  providers: Iterable<ProviderView>,
  modelId: string,
  excludedProviderIds: readonly string[],
  options: RouteOptions = {},
): RouteChoice {
  const signalsOf = (p: ProviderView) => options.signals?.get(p.providerId) ?? NO_SIGNALS;
  let known = false;
  const preferred: ProviderView[] = [];
  const lastResort: ProviderView[] = [];
  for (const p of providers) {
    if (!p.warmModels.includes(modelId)) continue;
    known = true;
    if (p.state !== "ready" || p.freeSlots <= 0 || excludedProviderIds.includes(p.providerId)) continue;
    const health = signalsOf(p).health;
    (health === "healthy" || health === "half_open" ? preferred : lastResort).push(p);
  }
  if (options.stickyProviderId) {
    const pinned = preferred.find((p) => p.providerId === options.stickyProviderId);
    if (pinned) return { ok: true, provider: pinned, trial: signalsOf(pinned).health === "half_open", sticky: true, lastResort: false };
  }
  const pool = preferred.length > 0 ? preferred : lastResort;
  if (pool.length === 0) return { ok: false, code: known ? "coordinator_unavailable" : "model_not_available" };
  const best = rank(withinSpread(pool, signalsOf, options.spreadFactor ?? DEFAULT_SPREAD_FACTOR), signalsOf, options.policy ?? "consolidate");
  return { ok: true, provider: best, trial: signalsOf(best).health === "half_open", sticky: false, lastResort: preferred.length === 0 };
}

/**
 * The spread bound: a provider whose share of the model's recent dispatches exceeds `factor` times its
 * share of the pool's capacity sits out while others can take the request (never all of them).
 */
function withinSpread(pool: ProviderView[], signalsOf: (p: ProviderView) => RouteSignals, factor: number): ProviderView[] {
  if (pool.length < 2) return pool;
  const total = pool.reduce((n, p) => n + capacityOf(p), 0);
  const within = pool.filter((p) => signalsOf(p).recentShare <= (factor * capacityOf(p)) / total);
  return within.length > 0 ? within : pool;
}

function rank(pool: ProviderView[], signalsOf: (p: ProviderView) => RouteSignals, policy: RoutingPolicy): ProviderView {
  if (policy === "shortest_wait") {
    const measured = pool.map((p) => signalsOf(p).ttftMs).filter((t): t is number => t !== null);
    const fallback = measured.length > 0 ? median(measured) : UNMEASURED_TTFT_MS;
    const cost = new Map(pool.map((p) => {
      const s = signalsOf(p);
      return [p, expectedWaitMs(p, s.ttftMs ?? fallback) / Math.max(0.01, reliability(s))] as const;
    }));
    return pool.reduce((best, p) => {
      if (p.tier !== best.tier) return tierRank(p.tier) < tierRank(best.tier) ? p : best;
      const a = cost.get(p)!;
      const b = cost.get(best)!;
      return a < b || (a === b && p.providerId < best.providerId) ? p : best;
    });
  }
  const bestReliability = Math.max(...pool.map((p) => reliability(signalsOf(p))));
  const measured = pool.map((p) => signalsOf(p).ttftMs).filter((t): t is number => t !== null);
  const typicalTtft = measured.length > 0 ? median(measured) : null;
  const band = new Map(pool.map((p) => {
    const s = signalsOf(p);
    // 0: trusted and keeping up; 1: trusted but saturated; 2: outside the trusted band.
    return [p, reliability(s) < bestReliability - TRUSTED_BAND ? 2 : saturated(p, s, typicalTtft) ? 1 : 0] as const;
  }));
  return pool.reduce((best, p) => (consolidatesBetter(p, best, band, signalsOf) ? p : best));
}

/**
 * Consolidation fills a machine only while it keeps up: it is saturated when at least half its jobs
 * (two or more) still wait for a first token — by its own report or by the gateway's count, whichever
 * is higher (a report is up to a heartbeat old) — or when its observed TTFT is over SLOW_FACTOR times
 * the pool's median.
 */
function saturated(p: ProviderView, s: RouteSignals, typicalTtft: number | null): boolean {
  const queued = Math.max(p.load?.queuedJobs ?? 0, p.awaitingFirstByte ?? 0);
  if (queued >= 1) return true;
  return typicalTtft !== null && s.ttftMs !== null && s.ttftMs > SLOW_FACTOR * typicalTtft;
}

/** Consolidation: pinned first, then trusted and keeping up, then the busiest, the bigger machine, the more used lately. */
function consolidatesBetter(
  a: ProviderView,
  b: ProviderView,
  band: ReadonlyMap<ProviderView, number>,
  signalsOf: (p: ProviderView) => RouteSignals,
): boolean {
  if (a.tier !== b.tier) return tierRank(a.tier) < tierRank(b.tier);
  const ba = band.get(a)!;
  const bb = band.get(b)!;
  if (ba !== bb) return ba < bb;
  if (a.inFlight !== b.inFlight) return a.inFlight > b.inFlight;
  const ca = capacityOf(a);
  const cb = capacityOf(b);
  if (ca !== cb) return ca > cb;
  // Sequential traffic stays on the machine already serving it (the spread bound caps how much).
  const sa = signalsOf(a).recentShare;
  const sb = signalsOf(b).recentShare;
  if (sa !== sb) return sa > sb;
  return a.providerId < b.providerId;
}

function median(values: number[]): number {
  const sorted = [...values].sort((x, y) => x - y);
  return sorted[Math.floor(sorted.length / 2)]!;
}
