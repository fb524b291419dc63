// PostgreSQL rows to the store's types (the ledger's rows are mapped for both databases in
// ../rowMapping.ts). Bun.SQL returns bytea as Buffer; the store's bytes are plain Uint8Arrays.
import type { CatalogHistoryEntry, ProviderBinding } from "../types.ts";
import { num, numOrNull } from "../rowMapping.ts";

export { num, numOrNull, toReservation, toSettlement } from "../rowMapping.ts";

type Row = Record<string, unknown>;

export const bytes = (v: unknown): Uint8Array => new Uint8Array(v as Uint8Array);
export const bytesOrNull = (v: unknown): Uint8Array | null => (v === null || v === undefined ? null : bytes(v));

export const toBinding = (r: Row): ProviderBinding => ({
  provider_id: r.provider_id as string,
  public_key: bytesOrNull(r.public_key),
  pinned: r.pinned as boolean,
  banned: r.banned as boolean,
  first_admitted_at_ms: numOrNull(r.first_admitted_at_ms),
  updated_at_ms: num(r.updated_at_ms),
});

export const toCatalogEntry = (r: Row): CatalogHistoryEntry => ({
  seq: num(r.seq),
  catalog_id: r.catalog_id as string,
  body: bytes(r.body),
  signature: r.signature as string,
  body_digest: r.body_digest as string,
  public_key: bytes(r.public_key),
  issued_at_ms: num(r.issued_at_ms),
  expires_at_ms: num(r.expires_at_ms),
  accepted_at_ms: num(r.accepted_at_ms),
});

