// Cooldowns (outlier detection) per (provider, model): the pure rules and the live table the request
// path feeds. Rules and their reasons: docs/routing.md, Cooldowns.
//
// A failure (before or after the first byte, except a capacity decline) cools the pair for
// base × 2^(level − 1), capped at max. When the cooldown ends the pair is half-open: routable, but only
// one attempt at a time (the trial) until one completes. A completed attempt resets the pair. A trial
// that ends without a verdict (the buyer left, the gateway cancelled) reopens the trial without
// changing the level. Keyed by provider id, not session: a reconnect does not wipe the record.

export interface CooldownRules {
  /** First cooldown (ms). */
  baseMs: number;
  /** Longest cooldown (ms): the backoff doubles up to it. */
  maxMs: number;
  /** A trial older than this (ms) without a verdict no longer blocks another trial. */
  trialTimeoutMs: number;
}

export const DEFAULT_COOLDOWN_RULES: CooldownRules = { baseMs: 5_000, maxMs: 300_000, trialTimeoutMs: 60_000 };

/** One (provider, model) pair with a failure on record; a healthy pair has no entry. */
export interface CooldownEntry {
  /** Failures since the last success: the backoff level (≥ 1). */
  level: number;
  /** When the current cooldown ends (ms, wall clock). */
  until: number;
  /** When the half-open trial now running was dispatched, or null. */
  trialSince: number | null;
  /** What caused the last failure (log and status text). */
  lastFailure: FailureKind;
}

/** What failed: before the first byte or mid-stream. A capacity decline is not a failure. */
export type FailureKind =
  | "first_byte_timeout"
  | "declined"
  | "provider_error"
  | "lost_socket"
  | "stalled"
  | "bad_sequence"
  | "hash_mismatch";

/**
 * healthy: no failure on record. cooling: in cooldown, routed only as a last resort. half_open: its
 * cooldown ended, one trial may go. trial: a trial is running, further attempts only as a last resort.
 */
export type Health = "healthy" | "cooling" | "half_open" | "trial";

export const cooldownMs = (rules: CooldownRules, level: number): number =>
  Math.min(rules.maxMs, rules.baseMs * 2 ** Math.min(Math.max(0, level - 1), 40));

export function healthOf(entry: CooldownEntry | undefined, now: number, rules: CooldownRules): Health {
  if (!entry) return "healthy";
  if (now < entry.until) return "cooling";
  if (entry.trialSince !== null && now - entry.trialSince < rules.trialTimeoutMs) return "trial";
  return "half_open";
}

/** The entry after a failure at `now`: one level up, cooling from now. */
export function afterFailure(entry: CooldownEntry | undefined, now: number, rules: CooldownRules, kind: FailureKind): CooldownEntry {
  const level = (entry?.level ?? 0) + 1;
  return { level, until: now + cooldownMs(rules, level), trialSince: null, lastFailure: kind };
}

/** The entry after an attempt was dispatched at `now`: a half-open pair's trial starts. */
export function afterDispatch(entry: CooldownEntry | undefined, now: number, rules: CooldownRules): CooldownEntry | undefined {
  if (!entry || healthOf(entry, now, rules) !== "half_open") return entry;
  return { ...entry, trialSince: now };
}

/** The entry after an attempt ended without a verdict (cancelled): a running trial may be retried. */
export function afterNoVerdict(entry: CooldownEntry | undefined): CooldownEntry | undefined {
  return entry && entry.trialSince !== null ? { ...entry, trialSince: null } : entry;
}

/** A completed attempt resets the pair (no entry). */
export const afterSuccess = (_entry: CooldownEntry | undefined): undefined => undefined;

export interface CooldownChange {
  providerId: string;
  model: string;
  /** What happened. */
  event: "cooled" | "trial_started" | "reset";
  level: number;
  cooldownMs: number;
  failure?: FailureKind;
}

const pairKey = (providerId: string, model: string): string => `${providerId}\u0000${model}`;
const FORGET_AFTER_MS = 3_600_000;

/**
 * The live cooldown table of one gateway: the request path reports dispatches and outcomes, routing
 * reads `health`. `onChange` (logs, metrics) hears every transition.
 */
export class Cooldowns {
  private readonly entries = new Map<string, CooldownEntry & { providerId: string; model: string }>();
  /** Failures per (provider, model) over the last `failureWindowMs` (reliability in routing). */
  private readonly recent = new Map<string, number[]>();

  constructor(
    readonly rules: CooldownRules,
    private readonly now: () => number,
    private readonly onChange: (change: CooldownChange) => void = () => {},
    private readonly failureWindowMs = 600_000,
  ) {}

  health(providerId: string, model: string): Health {
    return healthOf(this.entries.get(pairKey(providerId, model)), this.now(), this.rules);
  }

  entry(providerId: string, model: string): CooldownEntry | undefined {
    return this.entries.get(pairKey(providerId, model));
  }

  /** Failures of the (provider, model) pair within the failure window, even after a success reset its cooldown. */
  recentFailures(providerId: string, model: string): number {
    const key = pairKey(providerId, model);
    const times = this.recent.get(key);
    if (!times) return 0;
    const since = this.now() - this.failureWindowMs;
    while (times.length > 0 && times[0]! < since) times.shift();
    if (times.length === 0) this.recent.delete(key);
    return times.length;
  }

  dispatched(providerId: string, model: string): void {
    const key = pairKey(providerId, model);
    const entry = this.entries.get(key);
    if (!entry) return;
    const next = afterDispatch(entry, this.now(), this.rules);
    if (next === entry || !next) return;
    this.entries.set(key, { ...next, providerId, model });
    this.onChange({ providerId, model, event: "trial_started", level: next.level, cooldownMs: 0 });
  }

  failed(providerId: string, model: string, kind: FailureKind): void {
    const key = pairKey(providerId, model);
    const now = this.now();
    const next = afterFailure(this.entries.get(key), now, this.rules, kind);
    this.entries.set(key, { ...next, providerId, model });
    const times = this.recent.get(key) ?? [];
    times.push(now);
    this.recent.set(key, times);
    this.onChange({ providerId, model, event: "cooled", level: next.level, cooldownMs: next.until - now, failure: kind });
  }

  succeeded(providerId: string, model: string): void {
    const key = pairKey(providerId, model);
    const entry = this.entries.get(key);
    if (!entry) return;
    this.entries.delete(key);
    this.onChange({ providerId, model, event: "reset", level: 0, cooldownMs: 0 });
  }

  /** An attempt ended without saying anything about the provider (cancelled by the buyer or the gateway). */
  noVerdict(providerId: string, model: string): void {
    const key = pairKey(providerId, model);
    const entry = this.entries.get(key);
    const next = afterNoVerdict(entry);
    if (entry && next && next !== entry) this.entries.set(key, { ...next, providerId, model });
  }

  /** Forgets every record (an operator's fresh start; tests). */
  clear(): void {
    this.entries.clear();
    this.recent.clear();
  }

  /**
   * Every pair with a failure on record, with its health now (status and metrics). A pair half-open
   * for over an hour without a trial (its provider gone, or never needed) is forgotten here.
   */
  *list(): Generator<{ providerId: string; model: string; health: Health; entry: CooldownEntry }> {
    const now = this.now();
    for (const [key, e] of this.entries) {
      const health = healthOf(e, now, this.rules);
      if (health === "half_open" && now - e.until > FORGET_AFTER_MS) {
        this.entries.delete(key);
        continue;
      }
      yield { providerId: e.providerId, model: e.model, health, entry: e };
    }
  }
}
