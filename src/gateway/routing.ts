// Routing decision (pure): which admitted provider session gets the next attempt.
import type { ProviderTier } from "../../actors/providerSession.ts";

export interface ProviderView {
  sessionId: string;
  providerId: string;
  tier: ProviderTier;
  /** Sub-state of the admitted session: only "ready" takes new work. */
  state: "ready" | "busy" | "asleep" | "draining";
  warmModels: readonly string[];
  freeSlots: number;
  inFlight: number;
}

export type RouteChoice =
  | { ok: true; provider: ProviderView }
  | { ok: false; code: "model_not_available" | "coordinator_unavailable" };

const tierRank = (tier: ProviderTier): number => (tier === "pinned" ? 0 : 1);

/**
 * Among admitted, ready sessions with the model warm and a free slot (excluding providers that already
 * failed this request): pinned before provisional, then the busiest one, so idle machines can sleep.
 * A model no connected provider advertises is unknown (model_not_available); a known model with no
 * usable provider right now is a capacity problem (coordinator_unavailable).
 */
export function chooseProvider(
  providers: Iterable<ProviderView>,
  modelId: string,
  excludedProviderIds: readonly string[],
): RouteChoice {
  let known = false;
  let best: ProviderView | undefined;
  for (const p of providers) {
    if (!p.warmModels.includes(modelId)) continue;
    known = true;
    if (p.state !== "ready" || p.freeSlots <= 0 || excludedProviderIds.includes(p.providerId)) continue;
    if (!best || better(p, best)) best = p;
  }
  if (best) return { ok: true, provider: best };
  return { ok: false, code: known ? "coordinator_unavailable" : "model_not_available" };
}

function better(a: ProviderView, b: ProviderView): boolean {
  if (a.tier !== b.tier) return tierRank(a.tier) < tierRank(b.tier);
  if (a.inFlight !== b.inFlight) return a.inFlight > b.inFlight;
  if (a.freeSlots !== b.freeSlots) return a.freeSlots < b.freeSlots;
  return a.providerId < b.providerId;
}
