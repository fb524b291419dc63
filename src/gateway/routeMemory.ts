// What routing remembers between requests, per (provider, model): observed time to first token, the
// share of recent dispatches, settlement history and cooldowns; `signals` snapshots it for the pure
// chooseProvider. In memory, per gateway node (docs/routing.md).
import type { Cooldowns } from "./cooldowns.ts";
import type { RouteSignals } from "./routing.ts";

/** Weight of the newest TTFT sample in the moving average. */
const TTFT_ALPHA = 0.2;
/** Dispatches a model's share counts effectively span (each dispatch decays older ones by 1 − 1/W). */
const SHARE_WINDOW = 50;
const GROWTH = 1 / (1 - 1 / SHARE_WINDOW);

interface Shares {
  /** Weight the next dispatch adds; grows instead of decaying every count (renormalized when large). */
  step: number;
  total: number;
  counts: Map<string, number>;
}

const pairKey = (providerId: string, model: string): string => `${providerId}\u0000${model}`;

export class RouteMemory {
  private readonly ttft = new Map<string, number>();
  private readonly shares = new Map<string, Shares>();
  private readonly history = new Map<string, { verified: number; quarantined: number }>();

  constructor(readonly cooldowns: Cooldowns) {}

  observeTtft(providerId: string, model: string, ms: number): void {
    const key = pairKey(providerId, model);
    const prev = this.ttft.get(key);
    this.ttft.set(key, prev === undefined ? ms : prev + TTFT_ALPHA * (ms - prev));
  }

  /**
   * An attempt let go before its first token after `elapsedMs` (a hedge's loser, a timeout): its TTFT
   * is at least that, so it counts when it is worse than the average (else the slowest attempts, the
   * ones always cut short, would never be learned).
   */
  observeUnfinishedWait(providerId: string, model: string, elapsedMs: number): void {
    const prev = this.ttftMs(providerId, model);
    if (prev === null || elapsedMs > prev) this.observeTtft(providerId, model, elapsedMs);
  }

  ttftMs(providerId: string, model: string): number | null {
    return this.ttft.get(pairKey(providerId, model)) ?? null;
  }

  dispatched(providerId: string, model: string): void {
    let s = this.shares.get(model);
    if (!s) this.shares.set(model, (s = { step: 1, total: 0, counts: new Map() }));
    s.step *= GROWTH;
    s.counts.set(providerId, (s.counts.get(providerId) ?? 0) + s.step);
    s.total += s.step;
    if (s.step > 1e12) {
      for (const [id, n] of s.counts) {
        const scaled = n / s.step;
        if (scaled < 1e-6) s.counts.delete(id);
        else s.counts.set(id, scaled);
      }
      s.total /= s.step;
      s.step = 1;
    }
    this.cooldowns.dispatched(providerId, model);
  }

  share(providerId: string, model: string): number {
    const s = this.shares.get(model);
    return s && s.total > 0 ? (s.counts.get(providerId) ?? 0) / s.total : 0;
  }

  settled(providerId: string, label: "verified" | "quarantined" | "zero_settled"): void {
    if (label === "zero_settled") return;
    let h = this.history.get(providerId);
    if (!h) this.history.set(providerId, (h = { verified: 0, quarantined: 0 }));
    h[label]++;
  }

  /** Forgets everything learned, cooldowns included. */
  clear(): void {
    this.ttft.clear();
    this.shares.clear();
    this.history.clear();
    this.cooldowns.clear();
  }

  /** Snapshot of the signals of the given providers for one model. */
  signals(model: string, providerIds: Iterable<string>): Map<string, RouteSignals> {
    const out = new Map<string, RouteSignals>();
    for (const id of providerIds) {
      if (out.has(id)) continue;
      const h = this.history.get(id);
      out.set(id, {
        health: this.cooldowns.health(id, model),
        ttftMs: this.ttftMs(id, model),
        recentShare: this.share(id, model),
        verified: h?.verified ?? 0,
        quarantined: h?.quarantined ?? 0,
        recentFailures: this.cooldowns.recentFailures(id, model),
      });
    }
    return out;
  }
}
