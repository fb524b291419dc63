// The signed catalog feed's body (docs/catalog.md): one TypeBox schema per shape, types derived.
// Invariant: the signature covers the exact bytes of catalog.json; this schema is checked only after
// the signature verified, and a body that fails it is refused as a whole (never partly used).
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";

const Strict = { additionalProperties: false } as const;

/** The body format this build writes and reads. A new format is a new number, never an edit. */
export const CATALOG_VERSION = 1;

/** How `model_hash` was computed from the weights (docs/catalog.md; docs/catalog.md). */
export const HASH_SCOPES = ["snapshot-manifest-v1", "gguf-file-v1"] as const;
export const HashScope = Type.Union(HASH_SCOPES.map((s) => Type.Literal(s)));
export type HashScope = (typeof HASH_SCOPES)[number];

/** Lowercase hex SHA-256, the form of every hash in the wire protocol and receipts. */
export const Sha256Hex = Type.String({ pattern: "^[0-9a-f]{64}$" });

/** Printable ASCII without spaces: covers `llama3.2:1b`, `org/name`, `name@rev`; no control bytes. */
export const CatalogModelId = Type.String({ pattern: "^[\\x21-\\x7e]{1,128}$" });

/** Rate-card row slug (docs/ledger.md); `default` is the row every model without its own uses. */
export const RateCardRow = Type.String({ pattern: "^[a-z0-9][a-z0-9_-]{0,63}$" });

/** `cat_` + at most 64 id characters. The generator's format (feed.ts) is one choice inside this. */
export const CatalogId = Type.String({ pattern: "^cat_[A-Za-z0-9_-]{1,64}$" });

/**
 * UTC instant exactly as `Date.prototype.toISOString` writes it (`2026-03-15T12:00:00.000Z`).
 * One fixed form, so equal instants are equal strings; feed.ts also rejects impossible dates.
 */
export const IsoInstant = Type.String({ pattern: "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}\\.\\d{3}Z$" });

export const CatalogCapabilities = Type.Object(
  { tools: Type.Boolean(), structured_output: Type.Boolean() },
  Strict,
);
export type CatalogCapabilities = Static<typeof CatalogCapabilities>;

export const CatalogModel = Type.Object(
  {
    model_id: CatalogModelId,
    model_hash: Sha256Hex,
    hash_scope: HashScope,
    /** RAM tier in GB that provider runtimes use as guidance; 0 = no stated minimum. */
    min_ram_gb: Type.Integer({ minimum: 0, maximum: 65536 }),
    rate_card_row: RateCardRow,
    capabilities: CatalogCapabilities,
  },
  Strict,
);
export type CatalogModel = Static<typeof CatalogModel>;

/** Upper bounds keep a hostile or corrupt feed from costing much memory before it is refused. */
export const MAX_CATALOG_MODELS = 4096;
export const MAX_CATALOG_BODY_BYTES = 4 * 1024 * 1024;

export const CatalogBody = Type.Object(
  {
    version: Type.Literal(CATALOG_VERSION),
    catalog_id: CatalogId,
    issued_at: IsoInstant,
    expires_at: IsoInstant,
    models: Type.Array(CatalogModel, { maxItems: MAX_CATALOG_MODELS }),
  },
  Strict,
);
export type CatalogBody = Static<typeof CatalogBody>;

export const catalogBodyChecker = TypeCompiler.Compile(CatalogBody);
export const catalogModelChecker = TypeCompiler.Compile(CatalogModel);
