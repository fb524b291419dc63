// Hedged dispatch before the first byte (docs/routing.md, Hedging): when to send a second attempt to
// another provider, and the budget that caps hedges at a share of traffic. Pure state, no clocks.

/** off; after a fixed delay; or at the model's p95 time to first byte, never earlier than `minMs`. */
export type HedgeMode = { kind: "off" } | { kind: "fixed"; afterMs: number } | { kind: "adaptive"; minMs?: number };

/** TTFT samples a model needs before the adaptive trigger hedges at its p95. */
export const ADAPTIVE_MIN_SAMPLES = 20;
const WINDOW = 256;

/** Recent first-token times per model (a ring of the last 256), for the adaptive trigger. */
export class TtftWindow {
  private readonly rings = new Map<string, { samples: number[]; next: number }>();

  add(model: string, ms: number): void {
    let ring = this.rings.get(model);
    if (!ring) this.rings.set(model, (ring = { samples: [], next: 0 }));
    if (ring.samples.length < WINDOW) ring.samples.push(ms);
    else ring.samples[ring.next] = ms;
    ring.next = (ring.next + 1) % WINDOW;
  }

  /** The q-quantile (nearest rank) of the model's recent samples, or null with fewer than `min`. */
  quantile(model: string, q: number, min = ADAPTIVE_MIN_SAMPLES): number | null {
    const samples = this.rings.get(model)?.samples;
    if (!samples || samples.length < min) return null;
    const sorted = [...samples].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
  }
}

/** How long an attempt may go without a first byte before a hedge is sent; null = no hedge. */
export function hedgeDelayMs(mode: HedgeMode, window: TtftWindow, model: string): number | null {
  switch (mode.kind) {
    case "off":
      return null;
    case "fixed":
      return mode.afterMs;
    case "adaptive": {
      const p95 = window.quantile(model, 0.95);
      return p95 === null ? null : Math.max(p95, mode.minMs ?? 0);
    }
  }
}

/** Free slots a model's pool must keep after a hedge: hedges use spare capacity only. */
export const HEDGE_SPARE_SHARE = 0.1;

/**
 * Whether a hedge may go now: nobody waits in the admission queue for the model, and at least
 * HEDGE_SPARE_SHARE of the pool's slots would still be free after it (near saturation a hedge takes a
 * slot a waiting buyer needs, and makes the tail worse: docs/routing.md, fleet figures).
 */
export function spareForHedge(pool: { freeSlots: number; totalSlots: number; queued: number }): boolean {
  return pool.queued === 0 && pool.freeSlots - 1 >= HEDGE_SPARE_SHARE * pool.totalSlots;
}

/**
 * Caps hedges at `share` of requests: every request earns `share` of a hedge, a hedge spends one, and
 * savings stop at `burst` (so a quiet hour does not fund a storm of hedges).
 */
export class HedgeBudget {
  private balance: number;
  hedges = 0;
  requests = 0;

  constructor(
    readonly share: number,
    private readonly burst = 5,
  ) {
    this.balance = Math.min(1, burst);
  }

  requestStarted(): void {
    this.requests++;
    this.balance = Math.min(this.burst, this.balance + this.share);
  }

  /** Takes one hedge from the budget when there is one. */
  take(): boolean {
    if (this.balance < 1) return false;
    this.balance -= 1;
    this.hedges++;
    return true;
  }
}
