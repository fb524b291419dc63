// The catalog history, on both store backends: only validly signed, unexpired feeds get in; nothing ever leaves or
// changes; a retired model's hash stays findable for receipts issued while it was listed.
import { expect, test } from "bun:test";
import { signCatalogBody } from "../../src/catalog/feed.ts";
import { historyLine, parseHistoryLine } from "../../src/catalog/history.ts";
import { eachBackend } from "../store/backends.ts";
import { DAY, T0, model, newKey, signedFeed } from "./support.ts";

eachBackend((b) => {
const freshStore = async () => {
  const { store, location } = await b.fresh({ now: () => T0 + 1000 });
  return { path: location, store };
};
const key = newKey();

test("a validly signed feed is appended with its exact bytes, signature, digest and key", async () => {
  const { store } = await freshStore();
  expect(await store.latestCatalogSeq()).toBe(0);
  expect(await store.latestCatalog()).toBeNull();
  const feed = signedFeed(key, [model("m")]);
  const result = await store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw });
  expect(result).toMatchObject({ ok: true, duplicate: false });
  const latest = (await store.latestCatalog())!;
  expect(latest.seq).toBe(1);
  expect(latest.catalog_id).toBe(feed.body.catalog_id);
  expect(Buffer.from(latest.body).equals(Buffer.from(feed.bytes))).toBe(true);
  expect(latest.signature).toBe(feed.signature);
  expect(latest.body_digest).toBe(new Bun.CryptoHasher("sha256").update(feed.bytes).digest("hex"));
  expect(Buffer.from(latest.public_key).equals(Buffer.from(key.publicKeyRaw))).toBe(true);
  expect(latest.accepted_at_ms).toBe(T0 + 1000);
  expect(await store.latestCatalogSeq()).toBe(1);
  await store.close();
});

test("a feed with a bad signature, another signer or past its expiry is never appended", async () => {
  const { store } = await freshStore();
  const feed = signedFeed(key, [model("m")]);
  const tampered = feed.bytes.map((b, i) => (i === 30 ? b ^ 1 : b));
  expect(await store.appendCatalog({ body: tampered, signature: feed.signature, public_key: key.publicKeyRaw })).toMatchObject({ ok: false, code: "bad_signature" });
  expect(await store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: newKey().publicKeyRaw })).toMatchObject({ ok: false, code: "bad_signature" });
  const shortLived = signedFeed(key, [model("m")], T0, DAY);
  expect(await store.appendCatalog({ body: shortLived.bytes, signature: shortLived.signature, public_key: key.publicKeyRaw }, T0 + DAY)).toMatchObject({ ok: false, code: "expired" });
  expect(await store.listCatalogHistory()).toEqual([]);
  await store.close();
});

test("history is append-only: the database refuses UPDATE and DELETE of catalog rows", async () => {
  const { path, store } = await freshStore();
  const feed = signedFeed(key, [model("m")]);
  expect((await store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw })).ok).toBe(true);
  await store.close();
  await expect(b.exec(path, "UPDATE catalog_history SET signature = 'x'")).rejects.toThrow(/append-only/);
  await expect(b.exec(path, "DELETE FROM catalog_history")).rejects.toThrow(/append-only/);
  expect(Number((await b.exec(path, "SELECT COUNT(*) AS n FROM catalog_history"))[0]!.n)).toBe(1);
});

test("every accepted catalog stays: a retired model's hash is still found in the feed that listed it", async () => {
  const { store } = await freshStore();
  const retired = model("old-model", "old-weights");
  const first = signedFeed(key, [retired, model("kept")], T0);
  const second = signedFeed(key, [model("kept")], T0 + 60_000);
  await store.appendCatalog({ body: first.bytes, signature: first.signature, public_key: key.publicKeyRaw });
  await store.appendCatalog({ body: second.bytes, signature: second.signature, public_key: key.publicKeyRaw });

  const history = await store.listCatalogHistory();
  expect(history.map((e) => e.catalog_id)).toEqual([first.body.catalog_id, second.body.catalog_id]);
  expect(history.map((e) => e.seq)).toEqual([1, 2]);
  expect((await store.latestCatalog())!.catalog_id).toBe(second.body.catalog_id);
  expect((await store.listCatalogHistory(1)).map((e) => e.seq)).toEqual([2]);

  // A receipt names catalog_id and model_hash: look the old catalog up and find the hash in it.
  const old = (await store.getCatalog(first.body.catalog_id))!;
  const oldBody = JSON.parse(new TextDecoder().decode(old.body)) as { models: { model_id: string; model_hash: string }[] };
  expect(oldBody.models.find((m) => m.model_id === "old-model")?.model_hash).toBe(retired.model_hash);
  const current = JSON.parse(new TextDecoder().decode((await store.latestCatalog())!.body)) as { models: { model_id: string }[] };
  expect(current.models.map((m) => m.model_id)).toEqual(["kept"]);
  await store.close();
});

test("appending the same feed twice is a no-op; another body under a taken catalog_id is refused", async () => {
  const { store } = await freshStore();
  const feed = signedFeed(key, [model("m")]);
  const input = { body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw };
  expect(await store.appendCatalog(input)).toMatchObject({ ok: true, duplicate: false });
  expect(await store.appendCatalog(input)).toMatchObject({ ok: true, duplicate: true });
  expect(await store.listCatalogHistory()).toHaveLength(1);

  const text = new TextDecoder().decode(feed.bytes).replace('"min_ram_gb": 8', '"min_ram_gb": 16');
  const bytes = new TextEncoder().encode(text);
  expect(await store.appendCatalog({ body: bytes, signature: signCatalogBody(bytes, key.privateKey), public_key: key.publicKeyRaw })).toMatchObject({
    ok: false,
    code: "catalog_id_taken",
  });
  await store.close();
});

test("expect_latest_seq refuses a write based on a stale read (no lost concurrent change)", async () => {
  const { store } = await freshStore();
  const a = signedFeed(key, [model("a")]);
  const b = signedFeed(key, [model("b")]);
  expect((await store.appendCatalog({ body: a.bytes, signature: a.signature, public_key: key.publicKeyRaw, expect_latest_seq: 0 })).ok).toBe(true);
  expect(await store.appendCatalog({ body: b.bytes, signature: b.signature, public_key: key.publicKeyRaw, expect_latest_seq: 0 })).toMatchObject({ ok: false, code: "conflict" });
  expect((await store.appendCatalog({ body: b.bytes, signature: b.signature, public_key: key.publicKeyRaw, expect_latest_seq: 1 })).ok).toBe(true);
  await store.close();
});

test("history lines carry the exact body text and verify offline; a tampered line is refused", async () => {
  const { store } = await freshStore();
  const feed = signedFeed(key, [model("org/model@rev:1b")]);
  expect((await store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw })).ok).toBe(true);
  const text = JSON.stringify(historyLine((await store.latestCatalog())!));
  const parsed = parseHistoryLine(text, [key.publicKeyRaw]);
  expect(parsed.ok).toBe(true);
  if (parsed.ok) expect(parsed.feed.body.catalog_id).toBe(feed.body.catalog_id);

  const line = JSON.parse(text) as { body: string; catalog_body_digest: string };
  expect(parseHistoryLine(JSON.stringify({ ...line, body: line.body.replace('"min_ram_gb": 8', '"min_ram_gb": 9') }))).toMatchObject({ ok: false, code: "bad_signature" });
  expect(parseHistoryLine(JSON.stringify({ ...line, catalog_body_digest: "0".repeat(64) }))).toMatchObject({ ok: false, code: "digest_mismatch" });
  expect(parseHistoryLine(text, [newKey().publicKeyRaw])).toMatchObject({ ok: false, code: "key_not_trusted" });
  expect(parseHistoryLine("{}")).toMatchObject({ ok: false, code: "bad_line" });
  await store.close();
});
});
