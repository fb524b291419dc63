// The signed feed itself (docs/catalog.md): body bytes, digest, Ed25519 detached signature, ids, expiry.
// All cryptography is node:crypto; nothing here is hand-rolled. Expected failures are values.
import { createHash, sign, verify, type KeyObject } from "node:crypto";
import { publicKeyFromRaw } from "../wire/handshake.ts";
import {
  CATALOG_VERSION,
  MAX_CATALOG_BODY_BYTES,
  catalogBodyChecker,
  type CatalogBody,
  type CatalogModel,
} from "./schema.ts";

/** How long a freshly signed feed stays valid unless the operator says otherwise. */
export const DEFAULT_VALIDITY_MS = 30 * 24 * 60 * 60 * 1000;

export type RandomBytes = (length: number) => Uint8Array;

export type FeedErrorCode =
  | "body_too_large"
  | "bad_signature_encoding"
  | "bad_public_key"
  | "bad_signature"
  | "not_json"
  | "bad_schema"
  | "bad_timestamps"
  | "duplicate_model"
  | "expired";

export type FeedError = { ok: false; code: FeedErrorCode; message: string };

/** A feed whose signature verified and whose body passed every check. */
export interface VerifiedFeed {
  body: CatalogBody;
  /** The exact signed bytes (what catalog.json holds and GET /v1/catalog serves). */
  bytes: Uint8Array;
  /** Standard padded base64 of the 64-byte signature (what catalog.json.sig holds). */
  signature: string;
  /** catalog_body_digest: sha256 hex of `bytes`. */
  digest: string;
  issued_at_ms: number;
  expires_at_ms: number;
}

export type FeedResult = { ok: true; feed: VerifiedFeed } | FeedError;

const fail = (code: FeedErrorCode, message: string): FeedError => ({ ok: false, code, message });

/**
 * The bytes written to catalog.json: two-space indented JSON with a final newline, keys in schema
 * order. Readable by an operator; the signature covers these bytes as they are, so no
 * canonicalisation is ever needed to verify.
 */
export function encodeCatalogBody(body: CatalogBody): Uint8Array {
  const ordered: CatalogBody = {
    version: body.version,
    catalog_id: body.catalog_id,
    issued_at: body.issued_at,
    expires_at: body.expires_at,
    models: body.models.map((m) => ({
      model_id: m.model_id,
      model_hash: m.model_hash,
      hash_scope: m.hash_scope,
      min_ram_gb: m.min_ram_gb,
      rate_card_row: m.rate_card_row,
      capabilities: { tools: m.capabilities.tools, structured_output: m.capabilities.structured_output },
    })),
  };
  return new TextEncoder().encode(`${JSON.stringify(ordered, null, 2)}\n`);
}

/** catalog_body_digest (docs/catalog.md): sha256 hex of the exact body bytes. */
export function catalogBodyDigest(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** Detached Ed25519 signature over `bytes`, standard padded base64 (88 characters). */
export function signCatalogBody(bytes: Uint8Array, privateKey: KeyObject): string {
  return sign(null, bytes, privateKey).toString("base64");
}

/**
 * The 64 signature bytes from catalog.json.sig's text, or null. Surrounding ASCII whitespace (a
 * trailing newline added by an editor or `echo`) is tolerated; anything else must be canonical base64.
 */
export function decodeSignature(text: string): Uint8Array | null {
  const b64 = text.replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
  if (!/^[A-Za-z0-9+/]{86}==$/.test(b64)) return null;
  const bytes = Buffer.from(b64, "base64");
  if (bytes.length !== 64 || bytes.toString("base64") !== b64) return null;
  return new Uint8Array(bytes);
}

/** Milliseconds of an IsoInstant, or null for an impossible date (e.g. Feb 30) or another form. */
export function parseInstant(text: string): number | null {
  const ms = Date.parse(text);
  if (!Number.isFinite(ms)) return null;
  return new Date(ms).toISOString() === text ? ms : null;
}

export const formatInstant = (ms: number): string => new Date(ms).toISOString();

/** True once `now_ms` has reached the body's `expires_at` (the instant itself counts as expired). */
export function isExpiredAt(expires_at_ms: number, now_ms: number): boolean {
  return now_ms >= expires_at_ms;
}

/**
 * Verifies a feed: signature first (nothing unauthenticated is interpreted beyond its size), then the
 * body's JSON, schema, timestamps and unique model ids. With `now_ms`, a feed at or past its
 * `expires_at` is refused (`expired`): use it when deciding whether to newly accept a feed. Without
 * it, expiry is not judged (re-reading history that was accepted while fresh).
 */
export function verifyCatalogFeed(
  bytes: Uint8Array,
  signatureText: string,
  publicKeyRaw: Uint8Array,
  options: { now_ms?: number } = {},
): FeedResult {
  if (bytes.byteLength > MAX_CATALOG_BODY_BYTES) {
    return fail("body_too_large", `catalog body is larger than ${MAX_CATALOG_BODY_BYTES} bytes`);
  }
  const signature = decodeSignature(signatureText);
  if (signature === null) return fail("bad_signature_encoding", "signature is not base64 of 64 bytes");
  let publicKey: KeyObject;
  try {
    publicKey = publicKeyFromRaw(publicKeyRaw);
  } catch {
    return fail("bad_public_key", "operator public key is not a raw 32-byte Ed25519 key");
  }
  let good = false;
  try {
    good = verify(null, bytes, publicKey, signature);
  } catch {
    good = false;
  }
  if (!good) return fail("bad_signature", "catalog signature does not verify under the operator key");

  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes));
  } catch {
    return fail("not_json", "catalog body is not UTF-8 JSON");
  }
  if (!catalogBodyChecker.Check(parsed)) {
    const first = catalogBodyChecker.Errors(parsed).First();
    return fail("bad_schema", `catalog body fails its schema${first ? ` at ${first.path || "/"}: ${first.message}` : ""}`);
  }
  const body = parsed;
  const issued_at_ms = parseInstant(body.issued_at);
  const expires_at_ms = parseInstant(body.expires_at);
  if (issued_at_ms === null || expires_at_ms === null || expires_at_ms <= issued_at_ms) {
    return fail("bad_timestamps", "issued_at and expires_at must be real instants with expires_at later");
  }
  const seen = new Set<string>();
  for (const m of body.models) {
    if (seen.has(m.model_id)) return fail("duplicate_model", `model ${m.model_id} appears twice`);
    seen.add(m.model_id);
  }
  if (options.now_ms !== undefined && isExpiredAt(expires_at_ms, options.now_ms)) {
    return fail("expired", `catalog ${body.catalog_id} expired at ${body.expires_at}`);
  }
  return {
    ok: true,
    feed: { body, bytes, signature: Buffer.from(signature).toString("base64"), digest: catalogBodyDigest(bytes), issued_at_ms, expires_at_ms },
  };
}

/**
 * A new catalog id: `cat_` + the UTC issue time to the second + `_` + 12 random hex characters.
 * The time makes ids sort and read in order in receipts and logs; 48 random bits keep two feeds signed
 * in the same second distinct.
 */
export function newCatalogId(issued_at_ms: number, random: RandomBytes): string {
  const stamp = formatInstant(issued_at_ms).replace(/[-:T]/g, "").slice(0, 14);
  return `cat_${stamp}_${Buffer.from(random(6)).toString("hex")}`;
}

/** Bytewise order of UTF-8, so every implementation sorts model ids (and paths) the same way. */
export function compareUtf8(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** A new body with a fresh id and validity window; models sorted by id so equal sets print alike. */
export function buildCatalogBody(input: {
  models: readonly CatalogModel[];
  issued_at_ms: number;
  valid_for_ms?: number;
  random: RandomBytes;
}): CatalogBody {
  const validFor = input.valid_for_ms ?? DEFAULT_VALIDITY_MS;
  return {
    version: CATALOG_VERSION,
    catalog_id: newCatalogId(input.issued_at_ms, input.random),
    issued_at: formatInstant(input.issued_at_ms),
    expires_at: formatInstant(input.issued_at_ms + validFor),
    models: [...input.models].sort((a, b) => compareUtf8(a.model_id, b.model_id)),
  };
}
