// GET /v1/models and GET /v1/status bodies, computed from the live provider views (pure).
import type { ProviderView } from "../gateway/routing.ts";

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
  /** Catalog model ids with a named rate-card row (priced); the rest use `default`. */
  priced: readonly string[];
  /** Paid entrypoints whose attempts settle under the mode (docs/receipts.md). */
  coveredEntrypoints: readonly string[];
  /** Addresses that reach providers outside the gateway's settlement (configured), named as excluded. */
  excludedEntrypoints: readonly string[];
}

export function modelsBody(views: readonly ProviderView[], settlementMode: "observe" | "enforce", catalog: CatalogView) {
  const warm = warmModelIds(views);
  // In enforce mode only catalog models route (docs/receipts.md): the list shows what a request can reach.
  const eligible = new Set(catalog.eligible);
  const listed = settlementMode === "enforce" ? warm.filter((id) => eligible.has(id)) : warm;
  return {
    object: "list",
    data: listed.map((id) => ({ id, object: "model", created: 0, owned_by: "provider-network", compute_integrity: computeIntegrity })),
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
        priced: [...catalog.priced].sort(),
        covered_entrypoints: catalog.coveredEntrypoints,
        excluded_entrypoints: catalog.excludedEntrypoints,
      },
      limits:
        "Prompts and outputs are processed as plaintext on provider hardware. No private inference, hardware attestation or protection from a dishonest provider is claimed.",
    },
  };
}

export type PoolStatus = "up" | "degraded" | "idle" | "down";

export function statusBody(
  views: readonly ProviderView[],
  accepting: boolean,
  now: number,
  catalog: { status: "ok" } | { status: "degraded"; reason: string } = { status: "ok" },
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
    capacity: { free_slots: freeSlots, in_flight: inFlight },
    catalog: catalog.status === "ok" ? { status: "ok" } : { status: "degraded", reason: catalog.reason },
    models,
  };
}
