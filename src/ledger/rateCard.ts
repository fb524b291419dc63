// The rate card (docs/ledger.md): rows by slug, a `default` row every model without its own
// row uses, provider_share_bps on every row, and the USD conversion. Pure; the handler builds the
// GET /v1/rate-card response for the HTTP layer to mount.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { PROVIDER_SHARE_BPS, type Rates } from "./money.ts";

export const DEFAULT_ROW = "default";
/** 1 USD = 1,000,000 credits by default, so usd_per_million_credits = 1. */
export const DEFAULT_USD_PER_MILLION_CREDITS = 1;
/** The default row charges 1,000,000 credits per million tokens: one credit a token, 1.00 USD per million. */
export const DEFAULT_CREDITS_PER_MILLION = 1_000_000;

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });

/** One row as configured (the slug is the catalog's `rate_card_row`). */
export const RateRowConfig = Type.Object(
  {
    slug: Type.String({ pattern: "^[a-z0-9][a-z0-9_-]{0,63}$" }),
    prompt_credits_per_million: Count,
    completion_credits_per_million: Count,
  },
  { additionalProperties: false },
);
export type RateRowConfig = Static<typeof RateRowConfig>;
export const rateRowConfigChecker = TypeCompiler.Compile(RateRowConfig);

export interface RateRow extends Rates {
  slug: string;
}

export interface RateCard {
  usd_per_million_credits: number;
  rows: ReadonlyMap<string, RateRow>;
}

/**
 * A card from configured rows. The `default` row is always present (a configured `default`
 * replaces its prices); every row gets the provider share of docs/ledger.md. A repeated slug is a
 * configuration error, returned as a value.
 */
export function buildRateCard(
  input: { rows?: readonly RateRowConfig[]; usd_per_million_credits?: number } = {},
): { ok: true; card: RateCard } | { ok: false; message: string } {
  const rows = new Map<string, RateRow>();
  rows.set(DEFAULT_ROW, {
    slug: DEFAULT_ROW,
    prompt_credits_per_million: DEFAULT_CREDITS_PER_MILLION,
    completion_credits_per_million: DEFAULT_CREDITS_PER_MILLION,
    provider_share_bps: PROVIDER_SHARE_BPS,
  });
  const seen = new Set<string>();
  for (const row of input.rows ?? []) {
    if (!rateRowConfigChecker.Check(row)) return { ok: false, message: `invalid rate-card row ${JSON.stringify(row)}` };
    if (seen.has(row.slug)) return { ok: false, message: `rate-card row ${row.slug} given twice` };
    seen.add(row.slug);
    rows.set(row.slug, { ...row, provider_share_bps: PROVIDER_SHARE_BPS });
  }
  const usd = input.usd_per_million_credits ?? DEFAULT_USD_PER_MILLION_CREDITS;
  if (!(Number.isFinite(usd) && usd > 0)) return { ok: false, message: "usd_per_million_credits must be a positive number" };
  return { ok: true, card: { usd_per_million_credits: usd, rows } };
}

/** The row a catalog entry names, or `default` when it names none or one the card lacks. */
export function rowFor(card: RateCard, slug: string | undefined | null): RateRow {
  return (slug ? card.rows.get(slug) : undefined) ?? card.rows.get(DEFAULT_ROW)!;
}

export interface RateCardRowBody {
  slug: string;
  prompt_credits_per_million_tokens: number;
  completion_credits_per_million_tokens: number;
  prompt_usd_per_million_tokens: number;
  completion_usd_per_million_tokens: number;
  provider_share_bps: number;
  /** Catalog model ids priced by this row (the caller maps serve ids to rows; docs/ledger.md). */
  model_ids: string[];
}

export interface RateCardBody {
  object: "rate_card";
  /** ISO 8601 UTC instant the card was generated. */
  generated_at: string;
  usd_per_million_credits: number;
  credits_per_usd: number;
  provider_share_bps: number;
  default_row: string;
  rows: Record<string, RateCardRowBody>;
}

/**
 * The GET /v1/rate-card body. `models` maps catalog model ids to their row slug (models naming an
 * unknown row are listed under `default`, the row that actually prices them).
 */
export function rateCardBody(
  card: RateCard,
  now_ms: number,
  models: readonly { model_id: string; rate_card_row: string }[] = [],
): RateCardBody {
  const usd = (creditsPerMillion: number) => (creditsPerMillion * card.usd_per_million_credits) / 1_000_000;
  const rows: Record<string, RateCardRowBody> = {};
  for (const slug of [...card.rows.keys()].sort()) {
    const row = card.rows.get(slug)!;
    rows[slug] = {
      slug,
      prompt_credits_per_million_tokens: row.prompt_credits_per_million,
      completion_credits_per_million_tokens: row.completion_credits_per_million,
      prompt_usd_per_million_tokens: usd(row.prompt_credits_per_million),
      completion_usd_per_million_tokens: usd(row.completion_credits_per_million),
      provider_share_bps: row.provider_share_bps,
      model_ids: [],
    };
  }
  for (const m of models) rows[rowFor(card, m.rate_card_row).slug]!.model_ids.push(m.model_id);
  for (const row of Object.values(rows)) row.model_ids.sort();
  return {
    object: "rate_card",
    generated_at: new Date(now_ms).toISOString(),
    usd_per_million_credits: card.usd_per_million_credits,
    credits_per_usd: 1_000_000 / card.usd_per_million_credits,
    provider_share_bps: PROVIDER_SHARE_BPS,
    default_row: DEFAULT_ROW,
    rows,
  };
}

/** A handler the HTTP layer mounts at GET /v1/rate-card (public; docs/ledger.md leaves auth open). */
export function rateCardHandler(deps: {
  card: () => RateCard;
  now: () => number;
  models?: () => readonly { model_id: string; rate_card_row: string }[];
}): () => Response {
  return () =>
    Response.json(rateCardBody(deps.card(), deps.now(), deps.models?.() ?? []), {
      headers: { "cache-control": "public, max-age=60" },
    });
}
