// What a model costs and whether it may route, from the catalog and rate card in force.
import { lookupModel, type CatalogState } from "../../catalog/state.ts";
import type { SettlementMode } from "../../ledger/charges.ts";
import { rowFor, type RateCard } from "../../ledger/index.ts";
import type { Rates } from "../../ledger/money.ts";

/**
 * The price a request was admitted at: its reservation's hold was computed from these rates, and every
 * attempt of the request is charged at them, so that a charge never exceeds the hold (a catalog signed
 * mid-request may move the model to another rate-card row; docs/ledger.md, "Reservations").
 */
export interface AdmittedPricing {
  rateCardRow: string;
  rates: Rates;
}

/** What the pipeline needs at admission to price and route a model. */
export type ModelAdmission = ({ ok: true } & AdmittedPricing) | { ok: false; code: "model_not_available" };

export interface PricingSources {
  mode: SettlementMode;
  catalog: () => CatalogState | null;
  rateCard: () => RateCard;
}

/** The catalog entry (if any) and the rate-card row in force for a model. */
export function pricing(sources: PricingSources, modelId: string) {
  const catalog = sources.catalog();
  const entry = catalog ? lookupModel(catalog, modelId) : undefined;
  return { catalog, entry, row: rowFor(sources.rateCard(), entry?.rate_card_row) };
}

/**
 * Route-time pricing of a model, and whether it may route at all: enforce mode routes only catalogued
 * models (docs/catalog.md).
 */
export function admitModel(sources: PricingSources, modelId: string): ModelAdmission {
  const { entry, row } = pricing(sources, modelId);
  if (!entry && sources.mode === "enforce") return { ok: false, code: "model_not_available" };
  return {
    ok: true,
    rateCardRow: row.slug,
    rates: {
      prompt_credits_per_million: row.prompt_credits_per_million,
      completion_credits_per_million: row.completion_credits_per_million,
      provider_share_bps: row.provider_share_bps,
    },
  };
}

/** The hash a provider must advertise for a model to be routed to it; null: any (observe, uncatalogued). */
export function expectedHash(sources: PricingSources, modelId: string): string | null {
  return pricing(sources, modelId).entry?.model_hash ?? null;
}
