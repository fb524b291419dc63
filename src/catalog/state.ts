// The catalog in force, as plain data with pure lookups (no I/O, no clock reads): routing, the
// `/v1/models` disclosure and route snapshots ask it which models are eligible, which hash a model
// must report, its capabilities and its rate-card row. A retired model is one not in the current
// body; its old entries stay in the history (store) for receipts issued while it was listed.
import { isExpiredAt, verifyCatalogFeed, type FeedError, type VerifiedFeed } from "./feed.ts";
import type { CatalogBody, CatalogCapabilities, CatalogModel } from "./schema.ts";

export interface CatalogState {
  /** History position of this feed (0 when it did not come from a store, e.g. fetched over HTTP). */
  seq: number;
  catalog_id: string;
  /** catalog_body_digest: sha256 hex of `bytes`. */
  body_digest: string;
  body: CatalogBody;
  /** Exact signed bytes, served as-is by GET /v1/catalog. */
  bytes: Uint8Array;
  /** Standard padded base64 signature, served by GET /v1/catalog.sig. */
  signature: string;
  issued_at_ms: number;
  expires_at_ms: number;
  models: ReadonlyMap<string, CatalogModel>;
}

/** The parts of a stored history entry this module reads (the store's CatalogHistoryEntry fits). */
export interface SignedCatalogRecord {
  seq: number;
  catalog_id: string;
  body: Uint8Array;
  signature: string;
  public_key: Uint8Array;
}

export type CatalogStateResult = { ok: true; state: CatalogState } | FeedError | { ok: false; code: "key_mismatch"; message: string };

/** State from a feed that already passed verifyCatalogFeed. */
export function catalogStateFromFeed(feed: VerifiedFeed, seq = 0): CatalogState {
  return {
    seq,
    catalog_id: feed.body.catalog_id,
    body_digest: feed.digest,
    body: feed.body,
    bytes: feed.bytes,
    signature: feed.signature,
    issued_at_ms: feed.issued_at_ms,
    expires_at_ms: feed.expires_at_ms,
    models: new Map(feed.body.models.map((m) => [m.model_id, m])),
  };
}

/**
 * State from a history entry, re-verified under the operator key the caller trusts now. Expiry is not
 * judged: the entry was accepted while fresh, and an expired catalog stays in force (degraded) until
 * a fresh one is signed (docs/catalog.md). A row signed by another key is refused: the key in the data dir
 * is the trust anchor, not the key a row says it was checked with.
 */
export function catalogStateFromEntry(entry: SignedCatalogRecord, operatorPublicKey: Uint8Array): CatalogStateResult {
  if (!Buffer.from(entry.public_key).equals(Buffer.from(operatorPublicKey))) {
    return { ok: false, code: "key_mismatch", message: `catalog ${entry.catalog_id} was accepted under another operator key` };
  }
  const verified = verifyCatalogFeed(entry.body, entry.signature, operatorPublicKey);
  if (!verified.ok) return verified;
  return { ok: true, state: catalogStateFromFeed(verified.feed, entry.seq) };
}

/** The catalog entry for a model id, or null when it is not (or no longer) in the catalog. */
export function lookupModel(state: CatalogState | null, model_id: string): CatalogModel | null {
  return state?.models.get(model_id) ?? null;
}

/** The canonical hash a provider must report for `model_id`, or null when the catalog lacks it. */
export function expectedModelHash(state: CatalogState | null, model_id: string): string | null {
  return lookupModel(state, model_id)?.model_hash ?? null;
}

/** True when the model is listed and supports the capability (false for unknown models). */
export function hasCapability(state: CatalogState | null, model_id: string, capability: keyof CatalogCapabilities): boolean {
  return lookupModel(state, model_id)?.capabilities[capability] === true;
}

/** The eligible list (docs/catalog.md): every model id in the catalog, bytewise sorted as in the body. */
export function eligibleModelIds(state: CatalogState | null): string[] {
  return state === null ? [] : state.body.models.map((m) => m.model_id);
}

/** Rate-card rows named by catalog models (the billing module decides which rows exist). */
export function catalogRateCardRows(state: CatalogState | null): string[] {
  return state === null ? [] : [...new Set(state.body.models.map((m) => m.rate_card_row))].sort();
}

/**
 * The catalog fields of a job's `route` and of the route snapshot (docs/protocol.md, docs/receipts.md) for `model_id`, or
 * null when the catalog in force does not list it (enforce: not routable; observe: the caller uses
 * "" for all three).
 */
export function routeCatalogFields(
  state: CatalogState | null,
  model_id: string,
): { catalog_id: string; catalog_body_digest: string; expected_catalog_model_hash: string } | null {
  const model = lookupModel(state, model_id);
  if (state === null || model === null) return null;
  return { catalog_id: state.catalog_id, catalog_body_digest: state.body_digest, expected_catalog_model_hash: model.model_hash };
}

export type CatalogHealth =
  | { status: "ok"; catalog_id: string; expires_at: string }
  | { status: "degraded"; reason: "catalog_missing" }
  | { status: "degraded"; reason: "catalog_expired"; catalog_id: string; expires_at: string };

/**
 * Whether the catalog in force is fresh. An expired catalog stays in force; the gateway reports
 * itself degraded with this reason until a fresh feed is signed (docs/catalog.md).
 */
export function catalogHealth(state: CatalogState | null, now_ms: number): CatalogHealth {
  if (state === null) return { status: "degraded", reason: "catalog_missing" };
  if (isExpiredAt(state.expires_at_ms, now_ms)) {
    return { status: "degraded", reason: "catalog_expired", catalog_id: state.catalog_id, expires_at: state.body.expires_at };
  }
  return { status: "ok", catalog_id: state.catalog_id, expires_at: state.body.expires_at };
}

// ── edits of the model list (pure; the caller signs the result) ─────────────────────────────────

export type ModelsEdit =
  | { ok: true; models: CatalogModel[]; changed: boolean }
  | { ok: false; code: "already_listed" | "not_listed"; message: string };

const sameModel = (a: CatalogModel, b: CatalogModel) =>
  a.model_id === b.model_id &&
  a.model_hash === b.model_hash &&
  a.hash_scope === b.hash_scope &&
  a.min_ram_gb === b.min_ram_gb &&
  a.rate_card_row === b.rate_card_row &&
  a.capabilities.tools === b.capabilities.tools &&
  a.capabilities.structured_output === b.capabilities.structured_output;

/**
 * Adds `model`. An identical entry already listed is no change; a different entry under the same id
 * is refused unless `replace` — a new hash under an old id changes what every provider must run, so
 * it has to be asked for explicitly.
 */
export function addModel(models: readonly CatalogModel[], model: CatalogModel, replace = false): ModelsEdit {
  const existing = models.find((m) => m.model_id === model.model_id);
  if (existing !== undefined && sameModel(existing, model)) return { ok: true, models: [...models], changed: false };
  if (existing !== undefined && !replace) {
    return { ok: false, code: "already_listed", message: `model ${model.model_id} is already in the catalog with another entry (use --replace)` };
  }
  return { ok: true, models: [...models.filter((m) => m.model_id !== model.model_id), model], changed: true };
}

/** Retires `model_id`: it leaves the current body; history keeps the feeds that listed it. */
export function removeModel(models: readonly CatalogModel[], model_id: string): ModelsEdit {
  if (!models.some((m) => m.model_id === model_id)) {
    return { ok: false, code: "not_listed", message: `model ${model_id} is not in the catalog` };
  }
  return { ok: true, models: models.filter((m) => m.model_id !== model_id), changed: true };
}

/** Adds or replaces each of `wanted` (e.g. the demo's models); no change when all are listed as given. */
export function upsertModels(models: readonly CatalogModel[], wanted: readonly CatalogModel[]): ModelsEdit {
  let current: CatalogModel[] = [...models];
  let changed = false;
  for (const model of wanted) {
    const edit = addModel(current, model, true);
    if (!edit.ok) return edit;
    current = edit.models;
    changed ||= edit.changed;
  }
  return { ok: true, models: current, changed };
}
