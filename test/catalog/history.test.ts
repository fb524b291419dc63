// The catalog history in SQLite: only validly signed, unexpired feeds get in; nothing ever leaves or
// changes; a retired model's hash stays findable for receipts issued while it was listed.
import { Database } from "bun:sqlite";
import { expect, test } from "bun:test";
import { join } from "node:path";
import { signCatalogBody } from "../../src/catalog/feed.ts";
import { historyLine, parseHistoryLine } from "../../src/catalog/history.ts";
import { openStore } from "../../src/store/index.ts";
import { DAY, T0, model, newKey, signedFeed, tempDir } from "./support.ts";

const dir = tempDir();
let n = 0;
const freshStore = () => {
  const path = join(dir, `history-${n++}.db`);
  return { path, store: openStore(path, { now: () => T0 + 1000 }) };
};
const key = newKey();

test("a validly signed feed is appended with its exact bytes, signature, digest and key", () => {
  const { store } = freshStore();
  expect(store.latestCatalogSeq()).toBe(0);
  expect(store.latestCatalog()).toBeNull();
  const feed = signedFeed(key, [model("m")]);
  const result = store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw });
  expect(result).toMatchObject({ ok: true, duplicate: false });
  const latest = store.latestCatalog()!;
  expect(latest.seq).toBe(1);
  expect(latest.catalog_id).toBe(feed.body.catalog_id);
  expect(Buffer.from(latest.body).equals(Buffer.from(feed.bytes))).toBe(true);
  expect(latest.signature).toBe(feed.signature);
  expect(latest.body_digest).toBe(new Bun.CryptoHasher("sha256").update(feed.bytes).digest("hex"));
  expect(Buffer.from(latest.public_key).equals(Buffer.from(key.publicKeyRaw))).toBe(true);
  expect(latest.accepted_at_ms).toBe(T0 + 1000);
  expect(store.latestCatalogSeq()).toBe(1);
  store.close();
});

test("a feed with a bad signature, another signer or past its expiry is never appended", () => {
  const { store } = freshStore();
  const feed = signedFeed(key, [model("m")]);
  const tampered = feed.bytes.map((b, i) => (i === 30 ? b ^ 1 : b));
  expect(store.appendCatalog({ body: tampered, signature: feed.signature, public_key: key.publicKeyRaw })).toMatchObject({ ok: false, code: "bad_signature" });
  expect(store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: newKey().publicKeyRaw })).toMatchObject({ ok: false, code: "bad_signature" });
  const shortLived = signedFeed(key, [model("m")], T0, DAY);
  expect(store.appendCatalog({ body: shortLived.bytes, signature: shortLived.signature, public_key: key.publicKeyRaw }, T0 + DAY)).toMatchObject({ ok: false, code: "expired" });
  expect(store.listCatalogHistory()).toEqual([]);
  store.close();
});

test("history is append-only: the database refuses UPDATE and DELETE of catalog rows", () => {
  const { path, store } = freshStore();
  const feed = signedFeed(key, [model("m")]);
  expect(store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw }).ok).toBe(true);
  store.close();
  const raw = new Database(path);
  expect(() => raw.run("UPDATE catalog_history SET signature = 'x'")).toThrow(/append-only/);
  expect(() => raw.run("DELETE FROM catalog_history")).toThrow(/append-only/);
  expect((raw.query("SELECT COUNT(*) AS n FROM catalog_history").get() as { n: number }).n).toBe(1);
  raw.close();
});

test("every accepted catalog stays: a retired model's hash is still found in the feed that listed it", () => {
  const { store } = freshStore();
  const retired = model("old-model", "old-weights");
  const first = signedFeed(key, [retired, model("kept")], T0);
  const second = signedFeed(key, [model("kept")], T0 + 60_000);
  store.appendCatalog({ body: first.bytes, signature: first.signature, public_key: key.publicKeyRaw });
  store.appendCatalog({ body: second.bytes, signature: second.signature, public_key: key.publicKeyRaw });

  const history = store.listCatalogHistory();
  expect(history.map((e) => e.catalog_id)).toEqual([first.body.catalog_id, second.body.catalog_id]);
  expect(history.map((e) => e.seq)).toEqual([1, 2]);
  expect(store.latestCatalog()!.catalog_id).toBe(second.body.catalog_id);
  expect(store.listCatalogHistory(1).map((e) => e.seq)).toEqual([2]);

  // A receipt names catalog_id and model_hash: look the old catalog up and find the hash in it.
  const old = store.getCatalog(first.body.catalog_id)!;
  const oldBody = JSON.parse(new TextDecoder().decode(old.body)) as { models: { model_id: string; model_hash: string }[] };
  expect(oldBody.models.find((m) => m.model_id === "old-model")?.model_hash).toBe(retired.model_hash);
  const current = JSON.parse(new TextDecoder().decode(store.latestCatalog()!.body)) as { models: { model_id: string }[] };
  expect(current.models.map((m) => m.model_id)).toEqual(["kept"]);
  store.close();
});

test("appending the same feed twice is a no-op; another body under a taken catalog_id is refused", () => {
  const { store } = freshStore();
  const feed = signedFeed(key, [model("m")]);
  const input = { body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw };
  expect(store.appendCatalog(input)).toMatchObject({ ok: true, duplicate: false });
  expect(store.appendCatalog(input)).toMatchObject({ ok: true, duplicate: true });
  expect(store.listCatalogHistory()).toHaveLength(1);

  const text = new TextDecoder().decode(feed.bytes).replace('"min_ram_gb": 8', '"min_ram_gb": 16');
  const bytes = new TextEncoder().encode(text);
  expect(store.appendCatalog({ body: bytes, signature: signCatalogBody(bytes, key.privateKey), public_key: key.publicKeyRaw })).toMatchObject({
    ok: false,
    code: "catalog_id_taken",
  });
  store.close();
});

test("expect_latest_seq refuses a write based on a stale read (no lost concurrent change)", () => {
  const { store } = freshStore();
  const a = signedFeed(key, [model("a")]);
  const b = signedFeed(key, [model("b")]);
  expect(store.appendCatalog({ body: a.bytes, signature: a.signature, public_key: key.publicKeyRaw, expect_latest_seq: 0 }).ok).toBe(true);
  expect(store.appendCatalog({ body: b.bytes, signature: b.signature, public_key: key.publicKeyRaw, expect_latest_seq: 0 })).toMatchObject({ ok: false, code: "conflict" });
  expect(store.appendCatalog({ body: b.bytes, signature: b.signature, public_key: key.publicKeyRaw, expect_latest_seq: 1 }).ok).toBe(true);
  store.close();
});

test("history lines carry the exact body text and verify offline; a tampered line is refused", () => {
  const { store } = freshStore();
  const feed = signedFeed(key, [model("org/model@rev:1b")]);
  expect(store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw }).ok).toBe(true);
  const text = JSON.stringify(historyLine(store.latestCatalog()!));
  const parsed = parseHistoryLine(text, [key.publicKeyRaw]);
  expect(parsed.ok).toBe(true);
  if (parsed.ok) expect(parsed.feed.body.catalog_id).toBe(feed.body.catalog_id);

  const line = JSON.parse(text) as { body: string; catalog_body_digest: string };
  expect(parseHistoryLine(JSON.stringify({ ...line, body: line.body.replace('"min_ram_gb": 8', '"min_ram_gb": 9') }))).toMatchObject({ ok: false, code: "bad_signature" });
  expect(parseHistoryLine(JSON.stringify({ ...line, catalog_body_digest: "0".repeat(64) }))).toMatchObject({ ok: false, code: "digest_mismatch" });
  expect(parseHistoryLine(text, [newKey().publicKeyRaw])).toMatchObject({ ok: false, code: "key_not_trusted" });
  expect(parseHistoryLine("{}")).toMatchObject({ ok: false, code: "bad_line" });
  store.close();
});
