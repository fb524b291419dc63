// GET /v1/catalog, /v1/catalog.sig and /v1/catalog/pubkey: what a provider runtime fetches and
// verifies. The three answers together must verify with plain node:crypto.
import { expect, test } from "bun:test";
import { verify } from "node:crypto";
import { handleCatalog, handleCatalogPublicKey, handleCatalogSignature, type CatalogHttpSource } from "../../src/catalog/http.ts";
import { verifyCatalogFeed } from "../../src/catalog/feed.ts";
import { catalogStateFromFeed } from "../../src/catalog/state.ts";
import { publicKeyFromRaw } from "../../src/wire/handshake.ts";
import { model, newKey, signedFeed } from "./support.ts";

const key = newKey();
const feed = signedFeed(key, [model("m")]);
const verified = verifyCatalogFeed(feed.bytes, feed.signature, key.publicKeyRaw);
if (!verified.ok) throw new Error("fixture feed does not verify");
const source: CatalogHttpSource = { current: () => catalogStateFromFeed(verified.feed, 1), publicKeyRaw: key.publicKeyRaw };
const get = (path: string, headers: Record<string, string> = {}) => new Request(`http://gw${path}`, { headers });

test("the three endpoints serve bytes that verify together under the served key", async () => {
  const body = handleCatalog(source, get("/v1/catalog"), "req_1");
  expect(body.status).toBe(200);
  expect(body.headers.get("content-type")).toBe("application/json");
  expect(body.headers.get("x-request-id")).toBe("req_1");
  const bytes = new Uint8Array(await body.arrayBuffer());
  expect(Buffer.from(bytes).equals(Buffer.from(feed.bytes))).toBe(true);

  const sig = handleCatalogSignature(source, get("/v1/catalog.sig"), "req_2");
  expect(sig.status).toBe(200);
  expect(sig.headers.get("x-catalog-id")).toBe(body.headers.get("x-catalog-id"));
  const sigText = await sig.text();
  expect(sigText).toBe(feed.signature);

  const pub = handleCatalogPublicKey(source, get("/v1/catalog/pubkey"), "req_3");
  const pubText = await pub.text();
  expect(pubText).toMatch(/^[A-Za-z0-9+/]{43}=$/);
  const raw = Buffer.from(pubText, "base64");
  expect(raw.length).toBe(32);
  expect(verify(null, bytes, publicKeyFromRaw(raw), Buffer.from(sigText, "base64"))).toBe(true);
});

test("the ETag is the body digest; If-None-Match gets 304 with no body", async () => {
  const first = handleCatalog(source, get("/v1/catalog"), "r");
  const etag = first.headers.get("etag")!;
  expect(etag).toBe(`"${new Bun.CryptoHasher("sha256").update(feed.bytes).digest("hex")}"`);
  expect(first.headers.get("x-catalog-body-digest")).toBe(etag.slice(1, -1));
  const again = handleCatalog(source, get("/v1/catalog", { "if-none-match": etag }), "r");
  expect(again.status).toBe(304);
  expect(await again.text()).toBe("");
  expect(handleCatalog(source, get("/v1/catalog", { "if-none-match": '"other"' }), "r").status).toBe(200);
});

test("before any catalog exists, the feed endpoints answer 404 with the error envelope", async () => {
  const empty: CatalogHttpSource = { current: () => null, publicKeyRaw: key.publicKeyRaw };
  for (const res of [handleCatalog(empty, get("/v1/catalog"), "r"), handleCatalogSignature(empty, get("/v1/catalog.sig"), "r")]) {
    expect(res.status).toBe(404);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("not_found");
  }
  expect(handleCatalogPublicKey(empty, get("/v1/catalog/pubkey"), "r").status).toBe(200);
});
