// What `gateway serve` gets from startCatalog: key and empty signed catalog on an empty data dir, the
// demo's models added when asked, the same catalog kept on restart, and no silent key rotation.
import { expect, test } from "bun:test";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { expectedModelHash } from "../../src/catalog/state.ts";
import { startCatalog } from "../../src/catalog/operations.ts";
import { openStore } from "../../src/store/index.ts";
import { T0, model, tempDir, testRandom } from "./support.ts";

const root = tempDir("gw-catalog-start-");

test("an empty data dir gets a 0600 operator key and an empty signed catalog in force", () => {
  const dataDir = join(root, "empty");
  const store = openStore(join(dataDir, "gateway.db"));
  const started = startCatalog({ dataDir, store, now: () => T0, random: testRandom });
  expect(started.ok).toBe(true);
  if (!started.ok) return;
  expect(started.keyCreated).toBe(true);
  expect(statSync(join(dataDir, "catalog-operator.key")).mode & 0o777).toBe(0o600);
  expect(started.live.current()?.body.models).toEqual([]);
  expect(started.live.health(T0 + 1)).toMatchObject({ status: "ok" });
  expect(statSync(join(dataDir, "catalog.json")).isFile()).toBe(true);
  store.close();
});

test("demo models are added once; a restart keeps the same catalog", () => {
  const dataDir = join(root, "demo");
  const demo = [model("demo-chat"), model("demo-chat-fast")];
  const store = openStore(join(dataDir, "gateway.db"));
  const first = startCatalog({ dataDir, store, now: () => T0, random: testRandom, models: demo });
  expect(first.ok).toBe(true);
  if (!first.ok) return;
  expect(expectedModelHash(first.live.current(), "demo-chat")).toBe(demo[0]!.model_hash);
  const again = startCatalog({ dataDir, store, now: () => T0 + 5000, random: testRandom, models: demo });
  expect(again.ok && again.live.current()?.catalog_id).toBe(first.live.current()!.catalog_id);
  const plain = startCatalog({ dataDir, store, now: () => T0 + 9000, random: testRandom });
  expect(plain.ok && plain.live.current()?.catalog_id).toBe(first.live.current()!.catalog_id);
  expect(store.latestCatalogSeq()).toBe(1);
  store.close();
});

test("a lost key with an existing history is refused, never silently replaced", () => {
  const dataDir = join(root, "lost");
  const store = openStore(join(dataDir, "gateway.db"));
  expect(startCatalog({ dataDir, store, now: () => T0, random: testRandom }).ok).toBe(true);
  rmSync(join(dataDir, "catalog-operator.key"));
  expect(startCatalog({ dataDir, store, now: () => T0, random: testRandom })).toMatchObject({ ok: false, code: "key_lost" });
  store.close();
});
