// The catalog in force: lookups routing will use, health (expired → degraded, kept in force), and live
// reload from the store when another process (here: another connection to the same file) appends.
import { Database } from "bun:sqlite";
import { expect, test } from "bun:test";
import { join } from "node:path";
import { createCatalogLive, pollCatalog, type PollTimers } from "../../src/catalog/live.ts";
import {
  addModel,
  catalogHealth,
  catalogStateFromEntry,
  eligibleModelIds,
  expectedModelHash,
  hasCapability,
  lookupModel,
  removeModel,
  routeCatalogFields,
  upsertModels,
} from "../../src/catalog/state.ts";
import { openStore } from "../../src/store/index.ts";
import { asyncStore } from "../../src/store/asyncStore.ts";
import { DAY, T0, model, newKey, signedFeed, tempDir } from "./support.ts";

const dir = tempDir();
const key = newKey();
let n = 0;
const dbPath = () => join(dir, `live-${n++}.db`);

const chat = model("chat", "chat", { capabilities: { tools: true, structured_output: false }, rate_card_row: "small" });
const embed = model("embed");

function append(path: string, models = [chat, embed], issued = T0, validFor = 30 * DAY) {
  const store = openStore(path, { now: () => issued });
  const feed = signedFeed(key, models, issued, validFor);
  const result = store.appendCatalog({ body: feed.bytes, signature: feed.signature, public_key: key.publicKeyRaw });
  store.close();
  if (!result.ok) throw new Error(result.message);
  return feed;
}

test("lookups: expected hash, capabilities, eligible list and the route fields of a listed model", async () => {
  const path = dbPath();
  const feed = append(path);
  const store = asyncStore(openStore(path));
  const loaded = catalogStateFromEntry((await store.latestCatalog())!, key.publicKeyRaw);
  await store.close();
  expect(loaded.ok).toBe(true);
  if (!loaded.ok) return;
  const state = loaded.state;
  expect(eligibleModelIds(state)).toEqual(["chat", "embed"]);
  expect(expectedModelHash(state, "chat")).toBe(chat.model_hash);
  expect(lookupModel(state, "chat")?.rate_card_row).toBe("small");
  expect(hasCapability(state, "chat", "tools")).toBe(true);
  expect(hasCapability(state, "chat", "structured_output")).toBe(false);
  expect(hasCapability(state, "unknown", "tools")).toBe(false);
  expect(expectedModelHash(state, "unknown")).toBeNull();
  expect(routeCatalogFields(state, "chat")).toEqual({
    catalog_id: feed.body.catalog_id,
    catalog_body_digest: new Bun.CryptoHasher("sha256").update(feed.bytes).digest("hex"),
    expected_catalog_model_hash: chat.model_hash,
  });
  expect(routeCatalogFields(state, "unknown")).toBeNull();
  expect(routeCatalogFields(null, "chat")).toBeNull();
  // Loading under another key is refused: the data dir's key is the trust anchor.
  const storeAgain = asyncStore(openStore(path));
  expect(catalogStateFromEntry((await storeAgain.latestCatalog())!, newKey().publicKeyRaw)).toMatchObject({ ok: false, code: "key_mismatch" });
  await storeAgain.close();
});

test("model list edits: identical add is no change, a different entry needs replace, remove retires", async () => {
  expect(addModel([chat], chat)).toEqual({ ok: true, models: [chat], changed: false });
  const rehashed = { ...chat, model_hash: "f".repeat(64) };
  expect(addModel([chat], rehashed)).toMatchObject({ ok: false, code: "already_listed" });
  expect(addModel([chat], rehashed, true)).toEqual({ ok: true, models: [rehashed], changed: true });
  expect(removeModel([chat, embed], "chat")).toEqual({ ok: true, models: [embed], changed: true });
  expect(removeModel([embed], "chat")).toMatchObject({ ok: false, code: "not_listed" });
  expect(upsertModels([chat], [chat, embed])).toEqual({ ok: true, models: [chat, embed], changed: true });
  expect(upsertModels([chat, embed], [embed])).toMatchObject({ ok: true, changed: false });
});

test("health: ok while fresh; an expired catalog stays in force and reports degraded", async () => {
  const path = dbPath();
  append(path, [chat], T0, DAY);
  const store = asyncStore(openStore(path));
  const live = await createCatalogLive({ store, publicKeyRaw: key.publicKeyRaw });
  expect(catalogHealth(null, T0)).toEqual({ status: "degraded", reason: "catalog_missing" });
  expect(live.health(T0 + 1000)).toMatchObject({ status: "ok" });
  expect(live.health(T0 + DAY)).toMatchObject({ status: "degraded", reason: "catalog_expired" });
  // Still in force: routing keeps using it rather than dropping every model.
  expect(expectedModelHash(live.current(), "chat")).toBe(chat.model_hash);
  await store.close();
});

test("live reload: an append by another connection is picked up; no change means no reload", async () => {
  const path = dbPath();
  const gatewayStore = asyncStore(openStore(path));
  const live = await createCatalogLive({ store: gatewayStore, publicKeyRaw: key.publicKeyRaw });
  expect(live.current()).toBeNull();
  expect(await live.reload()).toEqual({ ok: true, changed: false });

  const first = append(path, [chat, embed], T0);
  const r1 = await live.reload();
  expect(r1).toMatchObject({ ok: true, changed: true });
  expect(live.current()?.catalog_id).toBe(first.body.catalog_id);
  expect(await live.reload()).toEqual({ ok: true, changed: false });

  // `catalog remove embed` in another process: embed is retired, chat stays.
  const second = append(path, [chat], T0 + 60_000);
  const r2 = await live.reload();
  expect(r2.ok && r2.changed && r2.previous?.catalog_id).toBe(first.body.catalog_id);
  expect(live.current()?.catalog_id).toBe(second.body.catalog_id);
  expect(lookupModel(live.current(), "embed")).toBeNull();
  expect(eligibleModelIds(live.current())).toEqual(["chat"]);
  gatewayStore.close();
});

test("a latest row that does not verify is not used: the previous catalog stays, health says why", async () => {
  const path = dbPath();
  const good = append(path, [chat]);
  const gatewayStore = asyncStore(openStore(path));
  const live = await createCatalogLive({ store: gatewayStore, publicKeyRaw: key.publicKeyRaw });
  expect(live.current()?.catalog_id).toBe(good.body.catalog_id);

  // Someone edits the database directly (the store API would refuse this row).
  const forged = signedFeed(newKey(), [model("evil")], T0 + 1);
  const raw = new Database(path);
  raw.query(
    "INSERT INTO catalog_history (catalog_id, body, signature, body_digest, public_key, issued_at_ms, expires_at_ms, accepted_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
  ).run(forged.body.catalog_id, forged.bytes, forged.signature, "0".repeat(64), key.publicKeyRaw, T0 + 1, T0 + DAY, T0 + 1);
  raw.close();

  expect(await live.reload()).toMatchObject({ ok: false, code: "bad_signature" });
  expect(live.current()?.catalog_id).toBe(good.body.catalog_id);
  expect(live.health(T0 + 1000)).toMatchObject({ status: "degraded", reason: "catalog_invalid" });
  // Reported once, not re-verified on every poll.
  expect(await live.reload()).toEqual({ ok: true, changed: false });
  gatewayStore.close();
});

/** Lets a tick's reload (a promise, already answered by the SQLite store) deliver its result. */
const settled = () => new Promise((resolve) => setImmediate(resolve));

test("pollCatalog reloads on each tick and reports only changes", async () => {
  const path = dbPath();
  const gatewayStore = asyncStore(openStore(path));
  const live = await createCatalogLive({ store: gatewayStore, publicKeyRaw: key.publicKeyRaw });
  let tick: (() => void) | null = null;
  let cleared = false;
  const timers: PollTimers = { setInterval: (fn, ms) => ((tick = fn), expect(ms).toBe(500), 1), clearInterval: () => (cleared = true) };
  const reports: unknown[] = [];
  const stop = pollCatalog(live, (r) => reports.push(r), { intervalMs: 500, timers });
  tick!();
  await settled();
  expect(reports).toHaveLength(0);
  append(path, [chat]);
  tick!();
  await settled();
  expect(reports).toHaveLength(1);
  tick!();
  await settled();
  expect(reports).toHaveLength(1);
  stop();
  expect(cleared).toBe(true);
  gatewayStore.close();
});
