// Changing the catalog: read the feed in force, edit its model list, sign a new body and append it to
// the history, then publish the files. Shared by `gateway catalog …` and `gateway serve` (which creates
// an empty catalog on an empty data dir and, with --demo, adds the demo models).
import type { AsyncStore } from "../store/asyncStore.ts";
import { buildCatalogBody, encodeCatalogBody, signCatalogBody, type RandomBytes } from "./feed.ts";
import { publishCatalogFiles } from "./files.ts";
import { createCatalogLive, type CatalogLive } from "./live.ts";
import { loadOperatorKey, loadOrCreateOperatorKey, operatorKeyPath, type OperatorKey } from "./keys.ts";
import type { CatalogModel } from "./schema.ts";
import { catalogStateFromEntry, upsertModels, type CatalogState, type ModelsEdit } from "./state.ts";

export interface CatalogWriter {
  store: Pick<AsyncStore, "latestCatalog" | "appendCatalog">;
  key: OperatorKey;
  dataDir: string;
  now: () => number;
  random: RandomBytes;
}

export type CatalogChangeErrorCode =
  | "key_mismatch"
  | "invalid_history"
  | "already_listed"
  | "not_listed"
  | "conflict"
  | "refused";

export type CatalogChangeResult =
  | { ok: true; state: CatalogState; changed: boolean }
  | { ok: false; code: CatalogChangeErrorCode; message: string };

/** How often a change is retried when another process appended in between (optimistic concurrency). */
const MAX_ATTEMPTS = 5;

/** The catalog in force, checked against the writer's key; null state when the history is empty. */
async function current(writer: CatalogWriter): Promise<{ ok: true; state: CatalogState | null; seq: number } | Extract<CatalogChangeResult, { ok: false }>> {
  const entry = await writer.store.latestCatalog();
  if (entry === null) return { ok: true, state: null, seq: 0 };
  const loaded = catalogStateFromEntry(entry, writer.key.publicKeyRaw);
  if (loaded.ok) return { ok: true, state: loaded.state, seq: entry.seq };
  if (loaded.code === "key_mismatch") {
    return {
      ok: false,
      code: "key_mismatch",
      message: `the catalog history was signed by ${Buffer.from(entry.public_key).toString("base64")}, not by this data dir's operator key ${writer.key.publicKeyBase64}`,
    };
  }
  return { ok: false, code: "invalid_history", message: `the latest catalog in the history does not verify: ${loaded.message}` };
}

/**
 * Applies `edit` to the model list in force and signs the result as a new feed (fresh catalog_id,
 * issued_at = now, expires_at = now + valid_for_ms). `force` signs even when the edit changed
 * nothing (`catalog sign`); otherwise an unchanged list appends nothing and returns the feed in force.
 * Retries when another writer appended first, re-reading its result, so no change is lost.
 */
export async function changeCatalog(
  writer: CatalogWriter,
  edit: (models: readonly CatalogModel[]) => ModelsEdit,
  options: { valid_for_ms?: number; force?: boolean } = {},
): Promise<CatalogChangeResult> {
  for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
    const now = await current(writer);
    if (!now.ok) return now;
    const edited = edit(now.state?.body.models ?? []);
    if (!edited.ok) return edited;
    if (now.state !== null && !edited.changed && options.force !== true) {
      publishCatalogFiles(writer.dataDir, { body: now.state.bytes, signature: now.state.signature, body_digest: now.state.body_digest });
      return { ok: true, state: now.state, changed: false };
    }
    const body = buildCatalogBody({
      models: edited.models,
      issued_at_ms: writer.now(),
      valid_for_ms: options.valid_for_ms,
      random: writer.random,
    });
    const bytes = encodeCatalogBody(body);
    const appended = await writer.store.appendCatalog(
      { body: bytes, signature: signCatalogBody(bytes, writer.key.privateKey), public_key: writer.key.publicKeyRaw, expect_latest_seq: now.seq },
      writer.now(),
    );
    if (!appended.ok && appended.code === "conflict") continue;
    if (!appended.ok) return { ok: false, code: "refused", message: `the store refused the new catalog: ${appended.message}` };
    const loaded = catalogStateFromEntry(appended.entry, writer.key.publicKeyRaw);
    // The store just verified this very feed under this key; failing here would be a bug.
    if (!loaded.ok) throw new Error(`freshly appended catalog does not load: ${loaded.message}`);
    publishCatalogFiles(writer.dataDir, appended.entry);
    return { ok: true, state: loaded.state, changed: true };
  }
  return { ok: false, code: "conflict", message: "the catalog kept changing concurrently; try again" };
}

/**
 * Makes sure a catalog exists: on an empty history, signs one holding `models` (default none);
 * otherwise keeps the feed in force (expired or not — renewing is the operator's `catalog sign`).
 * Also republishes the files, repairing them after a crash between append and publish.
 */
export function ensureCatalog(
  writer: CatalogWriter,
  options: { models?: readonly CatalogModel[]; valid_for_ms?: number } = {},
): Promise<CatalogChangeResult> {
  const models = [...(options.models ?? [])];
  // changed: false makes changeCatalog a no-op when a feed is in force; with an empty history it
  // always signs (there is nothing to keep), here with `models`.
  return changeCatalog(writer, () => ({ ok: true, models, changed: false }), { valid_for_ms: options.valid_for_ms });
}

export type OperatorKeySetup =
  | { ok: true; key: OperatorKey; created: boolean }
  | { ok: false; code: "key_lost" | "missing" | "unreadable" | "not_ed25519"; message: string };

/**
 * The operator key for a data dir, created when missing — unless the history already holds feeds:
 * then the key was lost or moved, and a new key would sign feeds that no provider which pinned the
 * old one accepts, so it is refused (`key_lost`) rather than silently rotated.
 */
export async function setUpOperatorKey(dataDir: string, store: Pick<AsyncStore, "latestCatalogSeq">): Promise<OperatorKeySetup> {
  const existing = loadOperatorKey(dataDir);
  if (existing.ok) return existing;
  if (existing.code !== "missing") return existing;
  if ((await store.latestCatalogSeq()) > 0) {
    return { ok: false, code: "key_lost", message: `the catalog history exists but ${operatorKeyPath(dataDir)} is missing; restore the operator key file` };
  }
  return loadOrCreateOperatorKey(dataDir);
}

/**
 * What `gateway serve` does at start (docs/operator.md): the operator key and an empty signed catalog on an
 * empty data dir; with `models` (the demo's), those are added or updated in the catalog; then the
 * live handle the gateway routes by (poll it with pollCatalog, reload it on SIGHUP).
 */
export async function startCatalog(deps: {
  dataDir: string;
  store: Pick<AsyncStore, "latestCatalog" | "latestCatalogSeq" | "appendCatalog">;
  now: () => number;
  random: RandomBytes;
  models?: readonly CatalogModel[];
}): Promise<{ ok: true; live: CatalogLive; key: OperatorKey; keyCreated: boolean } | { ok: false; code: string; message: string }> {
  const key = await setUpOperatorKey(deps.dataDir, deps.store);
  if (!key.ok) return key;
  const writer: CatalogWriter = { store: deps.store, key: key.key, dataDir: deps.dataDir, now: deps.now, random: deps.random };
  const wanted = deps.models ?? [];
  const ensured = wanted.length === 0 ? await ensureCatalog(writer) : await changeCatalog(writer, (models) => upsertModels(models, wanted));
  if (!ensured.ok) return ensured;
  const live = await createCatalogLive({ store: deps.store, publicKeyRaw: key.key.publicKeyRaw });
  return { ok: true, live, key: key.key, keyCreated: key.created };
}
