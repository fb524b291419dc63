// The stand-alone receipt verifier behind `gateway verify-receipt` (docs/operator.md, docs/receipts.md): what anyone
// holding a receipt, the provider's public key and the catalog history can check without the gateway.
// It certifies what docs/receipts.md says a receipt certifies — the tuple was signed by that key, the
// provider claimed that model hash, and the hash was in the catalog the receipt names — nothing more.
import { parseEnvelope, verifySignature } from "./envelope.ts";
import { receiptKeyId } from "./hashes.ts";
import { ISSUED_AT_TOLERANCE_MS } from "./verify.ts";

/** The verifier's version line (docs/buyer-api.md: 1.1.x). */
export const VERIFIER_VERSION = "1.1.0";

/** One accepted catalog as the history file gives it (its signature already checked by the reader). */
export interface HistoryCatalog {
  catalog_id: string;
  body_digest: string;
  issued_at_ms: number;
  models: readonly { model_id: string; model_hash: string }[];
}

export type StandaloneReason =
  | "malformed"
  | "not_canonical"
  | "field_set"
  | "field_invalid"
  | "wrong_key"
  | "bad_signature"
  | "expected_hash_mismatch"
  | "model_hash_not_in_catalog"
  | "catalog_digest_mismatch"
  | "catalog_after_receipt"
  | "catalog_not_in_history";

export type StandaloneResult =
  | { result: "valid"; reason: null; verifier_version: string }
  | { result: "invalid"; reason: Exclude<StandaloneReason, "catalog_not_in_history">; verifier_version: string }
  | { result: "inconclusive"; reason: "catalog_not_in_history"; verifier_version: string };

/**
 * Checks, in order: the envelope and its exact field set; that the receipt names the operator-given
 * key and its signature verifies under it (a key inside the receipt is never trusted); then the
 * model hash against the catalog the receipt names. A catalog missing from the history is
 * `inconclusive`, not invalid: the history given may simply be incomplete.
 */
export function verifyStandalone(input: {
  envelope: string;
  providerPublicKey: Uint8Array;
  history: readonly HistoryCatalog[];
}): StandaloneResult {
  const invalid = (reason: Exclude<StandaloneReason, "catalog_not_in_history">): StandaloneResult => ({
    result: "invalid",
    reason,
    verifier_version: VERIFIER_VERSION,
  });
  const parsed = parseEnvelope(input.envelope.trim());
  if (!parsed.ok) return invalid(parsed.code);
  const r = parsed.envelope.body;
  if (r.provider_receipt_key_id !== receiptKeyId(input.providerPublicKey)) return invalid("wrong_key");
  if (!verifySignature(parsed.envelope, input.providerPublicKey)) return invalid("bad_signature");
  // An observe-mode receipt for an uncatalogued model names no catalog: it never certifies a model.
  if (r.catalog_id === "" || r.expected_catalog_model_hash === "") return invalid("model_hash_not_in_catalog");
  if (r.model_hash !== r.expected_catalog_model_hash) return invalid("expected_hash_mismatch");
  const catalog = input.history.find((c) => c.catalog_id === r.catalog_id);
  if (catalog === undefined) {
    return { result: "inconclusive", reason: "catalog_not_in_history", verifier_version: VERIFIER_VERSION };
  }
  if (catalog.body_digest !== r.catalog_body_digest) return invalid("catalog_digest_mismatch");
  // "At issue time": the receipt cannot rely on a catalog issued after it (same tolerance as the gateway's window).
  if (catalog.issued_at_ms > r.issued_at_unix_ms + ISSUED_AT_TOLERANCE_MS) return invalid("catalog_after_receipt");
  if (!catalog.models.some((m) => m.model_id === r.model_id && m.model_hash === r.model_hash)) {
    return invalid("model_hash_not_in_catalog");
  }
  return { result: "valid", reason: null, verifier_version: VERIFIER_VERSION };
}
