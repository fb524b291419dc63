// The feed is accepted only with a valid Ed25519 signature over its exact bytes, a well-formed body
// and (when acceptance is being decided) an expires_at still in the future.
import { expect, test } from "bun:test";
import { verify } from "node:crypto";
import { catalogBodyDigest, decodeSignature, encodeCatalogBody, verifyCatalogFeed } from "../../src/catalog/feed.ts";
import { publicKeyFromRaw } from "../../src/wire/handshake.ts";
import { DAY, T0, model, newKey, signRaw, signedFeed } from "./support.ts";

const key = newKey();

test("a signed feed verifies, and its signature is plain Ed25519 over the exact body bytes", () => {
  const feed = signedFeed(key, [model("b-model"), model("a-model")]);
  const result = verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw, { now_ms: T0 + DAY });
  expect(result.ok).toBe(true);
  if (!result.ok) return;
  expect(result.feed.body.models.map((m) => m.model_id)).toEqual(["a-model", "b-model"]);
  expect(result.feed.body.version).toBe(1);
  expect(result.feed.body.catalog_id).toMatch(/^cat_20260115120000_[0-9a-f]{12}$/);
  expect(result.feed.body.issued_at).toBe("2026-01-15T12:00:00.000Z");
  expect(result.feed.body.expires_at).toBe("2026-02-14T12:00:00.000Z");
  // Independent check: node:crypto's verify directly on the file bytes and the decoded signature,
  // exactly what an outside verifier of catalog.json + catalog.json.sig does.
  expect(verify(null, feed.bytes, publicKeyFromRaw(key.publicKeyRaw), Buffer.from(feed.signature, "base64"))).toBe(true);
  expect(feed.signature).toMatch(/^[A-Za-z0-9+/]{86}==$/);
});

test("catalog_body_digest is the sha256 hex of the body bytes (checked with Bun's own hasher)", () => {
  const feed = signedFeed(key, [model("m")]);
  const expected = new Bun.CryptoHasher("sha256").update(feed.bytes).digest("hex");
  expect(catalogBodyDigest(feed.bytes)).toBe(expected);
  const result = verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw);
  expect(result.ok && result.feed.digest).toBe(expected);
});

test("the body bytes are stable: encoding the verified body again gives the same bytes", () => {
  const feed = signedFeed(key, [model("x", "x", { capabilities: { tools: true, structured_output: true } })]);
  const result = verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw);
  expect(result.ok).toBe(true);
  if (result.ok) expect(Buffer.from(encodeCatalogBody(result.feed.body)).equals(Buffer.from(feed.bytes))).toBe(true);
});

test.each([
  ["one flipped byte in the body", (b: Uint8Array) => b.map((x, i) => (i === 40 ? x ^ 1 : x))],
  ["a trailing space after the JSON", (b: Uint8Array) => new Uint8Array([...b, 0x20])],
  ["a model hash changed by one hex digit", (b: Uint8Array) => new TextEncoder().encode(new TextDecoder().decode(b).replace(/"model_hash": "(.)/, (_m, c) => `"model_hash": "${c === "0" ? "1" : "0"}`))],
])("a tampered body is refused: %s", (_name, tamper) => {
  const feed = signedFeed(key, [model("m")]);
  const tampered = tamper(feed.bytes);
  expect(Buffer.from(tampered).equals(Buffer.from(feed.bytes))).toBe(false);
  expect(verifyCatalogFeed(tampered, feed.signature, key.publicKeyRaw)).toMatchObject({ ok: false, code: "bad_signature" });
});

test("a tampered or foreign signature is refused", () => {
  const feed = signedFeed(key, [model("m")]);
  const sig = Buffer.from(feed.signature, "base64");
  sig[10] = sig[10]! ^ 0x80;
  expect(verifyCatalogFeed(feed.bytes, sig.toString("base64"), key.publicKeyRaw)).toMatchObject({ ok: false, code: "bad_signature" });
  // Signed by another key: valid Ed25519, wrong signer.
  const other = signedFeed(newKey(), [model("m")]);
  expect(verifyCatalogFeed(other.bytes, other.signature, key.publicKeyRaw)).toMatchObject({ ok: false, code: "bad_signature" });
  // Not base64 of 64 bytes at all.
  expect(verifyCatalogFeed(feed.bytes, "abc", key.publicKeyRaw)).toMatchObject({ ok: false, code: "bad_signature_encoding" });
  expect(verifyCatalogFeed(feed.bytes, feed.signature.slice(0, 80), key.publicKeyRaw)).toMatchObject({ ok: false, code: "bad_signature_encoding" });
  expect(verifyCatalogFeed(feed.bytes, feed.signature, new Uint8Array(31))).toMatchObject({ ok: false, code: "bad_public_key" });
});

test("a trailing newline after the signature text is tolerated (editors add one)", () => {
  const feed = signedFeed(key, [model("m")]);
  expect(decodeSignature(`${feed.signature}\n`)).not.toBeNull();
  expect(verifyCatalogFeed(feed.bytes, `${feed.signature}\n`, key.publicKeyRaw).ok).toBe(true);
});

test("an expired feed is refused when acceptance is decided, at and after expires_at", () => {
  const feed = signedFeed(key, [model("m")], T0, DAY);
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw, { now_ms: T0 + DAY - 1 }).ok).toBe(true);
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw, { now_ms: T0 + DAY })).toMatchObject({ ok: false, code: "expired" });
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw, { now_ms: T0 + 400 * DAY })).toMatchObject({ ok: false, code: "expired" });
  // Re-reading history (no now_ms) does not judge expiry: the feed was accepted while fresh.
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw).ok).toBe(true);
});

const validBody = (overrides: Record<string, unknown> = {}, modelOverrides: Record<string, unknown> = {}) =>
  JSON.stringify({
    version: 1,
    catalog_id: "cat_test_1",
    issued_at: "2026-01-15T12:00:00.000Z",
    expires_at: "2026-02-15T12:00:00.000Z",
    models: [{ ...model("m"), ...modelOverrides }],
    ...overrides,
  });

test.each([
  ["not JSON", "{not json", "not_json"],
  ["a UTF-8 byte-order mark before the JSON", `\uFEFF${validBody()}`, "not_json"],
  ["an unknown top-level field", validBody({ extra: 1 }), "bad_schema"],
  ["version 2", validBody({ version: 2 }), "bad_schema"],
  ["an unknown hash scope", validBody({}, { hash_scope: "sha512-v9" }), "bad_schema"],
  ["an uppercase model hash", validBody({}, { model_hash: "A".repeat(64) }), "bad_schema"],
  ["a missing capabilities object", validBody({}, { capabilities: undefined }), "bad_schema"],
  ["an issued_at without milliseconds", validBody({ issued_at: "2026-01-15T12:00:00Z" }), "bad_schema"],
  ["an impossible date", validBody({ expires_at: "2026-02-30T12:00:00.000Z" }), "bad_timestamps"],
  ["expires_at before issued_at", validBody({ expires_at: "2026-01-01T12:00:00.000Z" }), "bad_timestamps"],
  ["the same model id twice", validBody({ models: [model("m"), model("m", "other")] }), "duplicate_model"],
])("a correctly signed but malformed body is refused: %s", (_name, text, code) => {
  const feed = signRaw(key, text);
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw)).toMatchObject({ ok: false, code });
});

test("the hand-written valid body used above does verify (the table's baseline)", () => {
  const feed = signRaw(key, validBody());
  expect(verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw).ok).toBe(true);
});
