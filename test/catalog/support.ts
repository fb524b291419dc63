// Helpers for the catalog tests: temp dirs, operator keys and signed feeds built from plain values.
import { afterAll } from "bun:test";
import { generateKeyPairSync, type KeyObject } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildCatalogBody, encodeCatalogBody, signCatalogBody } from "../../src/catalog/feed.ts";
import type { CatalogBody, CatalogModel } from "../../src/catalog/schema.ts";
import { rawPublicKey } from "../../src/wire/handshake.ts";

export function tempDir(prefix = "gw-catalog-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

export interface TestKey {
  privateKey: KeyObject;
  publicKeyRaw: Uint8Array;
}

export function newKey(): TestKey {
  const { privateKey } = generateKeyPairSync("ed25519");
  return { privateKey, publicKeyRaw: rawPublicKey(privateKey) };
}

let counter = 0;
/** Deterministic "randomness" so ids differ between calls but tests stay reproducible. */
export const testRandom = (n: number) => {
  counter++;
  return new Uint8Array(n).map((_, i) => (counter * 31 + i) & 0xff);
};

export const DAY = 24 * 60 * 60 * 1000;
export const T0 = Date.UTC(2026, 0, 15, 12, 0, 0);

export function model(model_id: string, hashSeed = model_id, extra: Partial<CatalogModel> = {}): CatalogModel {
  const model_hash = new Bun.CryptoHasher("sha256").update(`weights:${hashSeed}`).digest("hex");
  return {
    model_id,
    model_hash,
    hash_scope: "gguf-file-v1",
    min_ram_gb: 8,
    rate_card_row: "default",
    capabilities: { tools: false, structured_output: false },
    ...extra,
  };
}

export interface SignedFeed {
  body: CatalogBody;
  bytes: Uint8Array;
  signature: string;
}

export function signedFeed(key: TestKey, models: CatalogModel[], issued_at_ms = T0, valid_for_ms = 30 * DAY): SignedFeed {
  const body = buildCatalogBody({ models, issued_at_ms, valid_for_ms, random: testRandom });
  const bytes = encodeCatalogBody(body);
  return { body, bytes, signature: signCatalogBody(bytes, key.privateKey) };
}

/** Signs arbitrary bytes (e.g. a body that breaks the schema) with the test key. */
export function signRaw(key: TestKey, text: string): { bytes: Uint8Array; signature: string } {
  const bytes = new TextEncoder().encode(text);
  return { bytes, signature: signCatalogBody(bytes, key.privateKey) };
}
