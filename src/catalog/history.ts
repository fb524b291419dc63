// The exported form of the catalog history (`gateway catalog history --json`, docs/operator.md): one JSON
// object per line and accepted feed, oldest first. It is also the `--catalog-history FILE` input of
// `gateway verify-receipt`, so it carries everything needed to check a feed offline.
// `body` is the catalog.json text exactly as signed (a JSON string holding the bytes, not a parsed
// object): re-serialising a parsed body could change bytes and break the signature.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { catalogBodyDigest, formatInstant, verifyCatalogFeed, type FeedError, type VerifiedFeed } from "./feed.ts";
import { CatalogId, IsoInstant, Sha256Hex } from "./schema.ts";
import type { CatalogHistoryEntry } from "../store/types.ts";

export const CatalogHistoryLine = Type.Object(
  {
    seq: Type.Integer({ minimum: 1 }),
    catalog_id: CatalogId,
    catalog_body_digest: Sha256Hex,
    issued_at: IsoInstant,
    expires_at: IsoInstant,
    accepted_at: IsoInstant,
    /** Standard base64 of the raw 32-byte operator key the feed verified under when accepted. */
    public_key: Type.String({ pattern: "^[A-Za-z0-9+/]{43}=$" }),
    /** Standard base64 of the 64-byte Ed25519 signature (catalog.json.sig). */
    signature: Type.String({ pattern: "^[A-Za-z0-9+/]{86}==$" }),
    /** catalog.json exactly as signed. */
    body: Type.String(),
  },
  { additionalProperties: false },
);
export type CatalogHistoryLine = Static<typeof CatalogHistoryLine>;
const lineChecker = TypeCompiler.Compile(CatalogHistoryLine);

/** A stored history entry, as the store returns it. */
export type ExportableCatalogEntry = CatalogHistoryEntry;

export function historyLine(entry: ExportableCatalogEntry): CatalogHistoryLine {
  return {
    seq: entry.seq,
    catalog_id: entry.catalog_id,
    catalog_body_digest: entry.body_digest,
    issued_at: formatInstant(entry.issued_at_ms),
    expires_at: formatInstant(entry.expires_at_ms),
    accepted_at: formatInstant(entry.accepted_at_ms),
    public_key: Buffer.from(entry.public_key).toString("base64"),
    signature: entry.signature,
    // Bodies are accepted only as strict UTF-8 without a BOM (verifyCatalogFeed refuses one), so
    // this decoding is lossless; ignoreBOM keeps the decoder from silently dropping a leading U+FEFF.
    body: new TextDecoder("utf-8", { ignoreBOM: true }).decode(entry.body),
  };
}

export type HistoryLineResult =
  | { ok: true; line: CatalogHistoryLine; feed: VerifiedFeed }
  | FeedError
  | { ok: false; code: "bad_line" | "digest_mismatch" | "id_mismatch" | "key_not_trusted"; message: string };

/**
 * Parses and checks one history line: its shape, the signature over `body`, that the line's digest
 * and id match the body, and — when `trustedKeys` is given — that the line's key is one of them.
 * Expiry is not judged: history holds feeds that were fresh when accepted.
 */
export function parseHistoryLine(text: string, trustedKeys?: readonly Uint8Array[]): HistoryLineResult {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false, code: "bad_line", message: "history line is not JSON" };
  }
  if (!lineChecker.Check(value)) return { ok: false, code: "bad_line", message: "history line fails its schema" };
  const line = value;
  const key = new Uint8Array(Buffer.from(line.public_key, "base64"));
  if (trustedKeys !== undefined && !trustedKeys.some((k) => Buffer.from(k).equals(Buffer.from(key)))) {
    return { ok: false, code: "key_not_trusted", message: `catalog ${line.catalog_id} is signed by a key that is not trusted` };
  }
  const bytes = new TextEncoder().encode(line.body);
  const verified = verifyCatalogFeed(bytes, line.signature, key);
  if (!verified.ok) return verified;
  if (catalogBodyDigest(bytes) !== line.catalog_body_digest) {
    return { ok: false, code: "digest_mismatch", message: `catalog ${line.catalog_id}: digest does not match its body` };
  }
  if (verified.feed.body.catalog_id !== line.catalog_id) {
    return { ok: false, code: "id_mismatch", message: `catalog ${line.catalog_id}: id does not match its body` };
  }
  return { ok: true, line, feed: verified.feed };
}
