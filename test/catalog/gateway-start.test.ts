// What `gateway serve` gets from startCatalog: key and empty signed catalog on an empty data dir, the
// demo's models added when asked, the same catalog kept on restart, and no silent key rotation.
import { expect, test } from "bun:test";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { expectedModelHash } from "../../src/catalog/state.ts";
import { startCatalog } from "../../src/catalog/operations.ts";
import { openStore } from "../../src/store/index.ts";
import { asyncStore } from "../../src/store/asyncStore.ts";
import { T0, model, tempDir, testRandom } from "./support.ts";

const root = tempDir("gw-catalog-start-");

test("an empty data dir gets a 0600 operator key and an empty signed catalog in force", async () => {
  const dataDir = join(root, "empty");
  const store = asyncStore(openStore(join(dataDir, "gateway.db")));
  const started = await startCatalog({ dataDir, store, now: () => T0, random: testRandom });
  expect(started.ok).toBe(true);
  if (!started.ok) return;
  expect(started.keyCreated).toBe(true);
  expect(statSync(join(dataDir, "catalog-operator.key")).mode & 0o777).toBe(0o600);
  expect(started.live.current()?.body.models).toEqual([]);
  expect(started.live.health(T0 + 1)).toMatchObject({ status: "ok" });
  expect(statSync(join(dataDir, "catalog.json")).isFile()).toBe(true);
  await store.close();
});

test("demo models are added once; a restart keeps the same catalog", async () => {
  const dataDir = join(root, "demo");
  const demo = [model("demo-chat"), model("demo-chat-fast")];
  const store = asyncStore(openStore(join(dataDir, "gateway.db")));
  const first = await startCatalog({ dataDir, store, now: () => T0, random: testRandom, models: demo });
  expect(first.ok).toBe(true);
  if (!first.ok) return;
  expect(expectedModelHash(first.live.current(), "demo-chat")).toBe(demo[0]!.model_hash);
  const again = await startCatalog({ dataDir, store, now: () => T0 + 5000, random: testRandom, models: demo });
  expect(again.ok && again.live.current()?.catalog_id).toBe(first.live.current()!.catalog_id);
  const plain = await startCatalog({ dataDir, store, now: () => T0 + 9000, random: testRandom });
  expect(plain.ok && plain.live.current()?.catalog_id).toBe(first.live.current()!.catalog_id);
  expect(await store.latestCatalogSeq()).toBe(1);
  await store.close();
});

test("a lost key with an existing history is refused, never silently replaced", async () => {
  const dataDir = join(root, "lost");
  const store = asyncStore(openStore(join(dataDir, "gateway.db")));
  expect((await startCatalog({ dataDir, store, now: () => T0, random: testRandom })).ok).toBe(true);
  rmSync(join(dataDir, "catalog-operator.key"));
  expect(await startCatalog({ dataDir, store, now: () => T0, random: testRandom })).toMatchObject({ ok: false, code: "key_lost" });
  await store.close();
});
