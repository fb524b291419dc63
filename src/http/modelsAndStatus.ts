// GET /v1/models, GET /v1/models/{id} and GET /v1/status bodies, computed from the live provider views (pure).
import type { ProviderView } from "../gateway/routing.ts";
import { rowFor, type RateCard } from "../ledger/index.ts";

export const TIER1_DISCLOSURE_VERSION = "tier1-2026-11";

const computeIntegrity = {
  status: "unavailable",
  live_telemetry_available: false,
  settlement_effect: "not_evaluated",
  description:
    "Sampled, overt distribution-drift readiness telemetry. Not proof of honest computation and not an attestation.",
} as const;

function warmModelIds(views: readonly ProviderView[]): string[] {
  const ids = new Set<string>();
  for (const v of views) if (v.state !== "asleep") for (const m of v.warmModels) ids.add(m);
  return [...ids].sort();
}

/** What the catalog and the rate card say, for the disclosure (pure inputs). */
export interface CatalogView {
  /** The catalog in force, or null before one was accepted. */
  catalogId: string | null;
  /** Catalog model ids (eligible). */
  eligible: readonly string[];
  /** What a request for the model is charged (its catalog entry's row, else `default`); null: no rate card. */
  priceOf: (modelId: string) => ModelPrice | null;
  /** Paid entrypoints whose attempts settle under the mode (docs/receipts.md). */
  coveredEntrypoints: readonly string[];
  /** Addresses that reach providers outside the gateway's settlement (configured), named as excluded. */
  excludedEntrypoints: readonly string[];
}

/**
 * The price of one model per million tokens, in credits and USD, and the rate-card row it comes from:
 * "priced" on /v1/models means exactly this (docs/ledger.md). Paid accounts are debited at it; free and
 * demo usage counts against token quotas instead.
 */
export interface ModelPrice {
  rate_card_row: string;
  prompt_credits_per_million_tokens: number;
  completion_credits_per_million_tokens: number;
  prompt_usd_per_million_tokens: number;
  completion_usd_per_million_tokens: number;
}

/** The price of a model whose catalog entry names `slug` (undefined: not catalogued → `default`). */
export function modelPrice(card: RateCard, slug: string | undefined): ModelPrice {
  const row = rowFor(card, slug);
  const usd = (creditsPerMillion: number) => (creditsPerMillion * card.usd_per_million_credits) / 1_000_000;
  return {
    rate_card_row: row.slug,
    prompt_credits_per_million_tokens: row.prompt_credits_per_million,
    completion_credits_per_million_tokens: row.completion_credits_per_million,
    prompt_usd_per_million_tokens: usd(row.prompt_credits_per_million),
    completion_usd_per_million_tokens: usd(row.completion_credits_per_million),
  };
}

/** Model ids a request can reach: warm ones, and in enforce mode only catalogued ones (docs/receipts.md). */
function listedModelIds(views: readonly ProviderView[], settlementMode: "observe" | "enforce", catalog: CatalogView): string[] {
  const warm = warmModelIds(views);
  const eligible = new Set(catalog.eligible);
  return settlementMode === "enforce" ? warm.filter((id) => eligible.has(id)) : warm;
}

/** One entry of /v1/models' `data`, in the OpenAI model shape plus `pricing`. */
function modelObject(id: string, catalog: CatalogView) {
  const pricing = catalog.priceOf(id);
  return { id, object: "model" as const, created: 0, owned_by: "provider-network", compute_integrity: computeIntegrity, ...(pricing ? { pricing } : {}) };
}

/** GET /v1/models/{id}: the model as listed by /v1/models, or null when a request cannot reach it. */
export function modelBody(views: readonly ProviderView[], settlementMode: "observe" | "enforce", catalog: CatalogView, id: string) {
  return listedModelIds(views, settlementMode, catalog).includes(id) ? modelObject(id, catalog) : null;
}

export function modelsBody(views: readonly ProviderView[], settlementMode: "observe" | "enforce", catalog: CatalogView) {
  const warm = warmModelIds(views);
  const listed = listedModelIds(views, settlementMode, catalog);
  const priced = [...new Set([...catalog.eligible, ...listed])]
    .sort()
    .flatMap((id) => {
      const price = catalog.priceOf(id);
      return price ? [{ model_id: id, ...price }] : [];
    });
  return {
    object: "list",
    data: listed.map((id) => modelObject(id, catalog)),
    tier1_disclosure: {
      version: TIER1_DISCLOSURE_VERSION,
      provider_reported_model_ids: {
        description: "Model ids as reported by connected provider machines. The gateway does not verify what a provider runs.",
        warm: warm,
      },
      catalog_hash_status: {
        description:
          "Whether a model id has a canonical weight hash in the operator-signed catalog. A provider advertising another hash is not routed for that model.",
        catalog_loaded: catalog.catalogId !== null,
        catalog_id: catalog.catalogId,
        eligible: [...catalog.eligible].sort(),
      },
      settlement_receipt_matching: {
        description:
          settlementMode === "enforce"
            ? "Billing requires a provider-signed receipt that matches the route-time catalog snapshot. A matching receipt shows what the provider claimed; it does not prove it."
            : "Observe mode: receipts are checked and recorded, but billing follows observed usage and no attempt is presented as matching the catalog.",
        settlement_mode: settlementMode,
        priced_description:
          "What each routable or catalogued model is charged per million tokens, from the rate-card row its catalog entry names (uncatalogued models: the default row). Paid accounts are debited at these prices; free-tier and demo usage counts against token quotas instead.",
        priced,
        covered_entrypoints: catalog.coveredEntrypoints,
        excluded_entrypoints: catalog.excludedEntrypoints,
      },
      limits:
        "Prompts and outputs are processed as plaintext on provider hardware. No private inference, hardware attestation or protection from a dishonest provider is claimed.",
    },
  };
}

export type PoolStatus = "up" | "degraded" | "idle" | "down";

/** Routing's part of /v1/status capacity (docs/routing.md). */
export interface RoutingStatus {
  /** Requests waiting for a free slot. */
  queued: number;
  /** (provider, model) pairs not healthy. */
  cooldowns: { provider_id: string; model: string; state: string; level: number; seconds_left: number }[];
}

export function statusBody(
  views: readonly ProviderView[],
  accepting: boolean,
  now: number,
  catalog: { status: "ok" } | { status: "degraded"; reason: string } = { status: "ok" },
  routing?: RoutingStatus,
) {
  const count = (state: ProviderView["state"]) => views.filter((v) => v.state === state).length;
  const awake = views.filter((v) => v.state !== "asleep");
  const freeSlots = awake.filter((v) => v.state === "ready").reduce((n, v) => n + v.freeSlots, 0);
  const inFlight = views.reduce((n, v) => n + v.inFlight, 0);
  let status: PoolStatus;
  if (!accepting) status = "down";
  else if (awake.length === 0) status = "idle";
  else if (freeSlots === 0 || catalog.status === "degraded") status = "degraded";
  else status = "up";
  const models = warmModelIds(views).map((id) => {
    const serving = awake.filter((v) => v.warmModels.includes(id));
    const free = serving.filter((v) => v.state === "ready").reduce((n, v) => n + v.freeSlots, 0);
    return { id, available: free > 0, providers_warm: serving.length, free_slots: free };
  });
  return {
    status,
    generated_at: new Date(now).toISOString(),
    pool: {
      providers_admitted: views.length,
      ready: count("ready"),
      busy: count("busy"),
      asleep: count("asleep"),
      draining: count("draining"),
      pinned: views.filter((v) => v.tier === "pinned").length,
      provisional: views.filter((v) => v.tier === "provisional").length,
    },
    capacity: { free_slots: freeSlots, in_flight: inFlight, ...(routing ? { queued: routing.queued, cooldowns: routing.cooldowns } : {}) },
    catalog: catalog.status === "ok" ? { status: "ok" } : { status: "degraded", reason: catalog.reason },
    models,
  };
}
