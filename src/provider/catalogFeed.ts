// The provider's view of the signed catalog (docs/catalog.md): fetched from the gateway at start and every
// refresh interval, verified under the operator key, and used to decide which of this machine's
// models to advertise. The gateway routes only catalog models whose hash matches (enforce mode), so
// advertising anything else would only draw jobs it must refuse.
//
// Trust: `--catalog-pubkey`, or else the key the gateway served at the first successful check,
// pinned in a file beside the provider key (trust on first use). A later feed under another key is
// refused and the pinned key stays; the operator resolves it (new pin file or the flag).
// Rollback: a feed older than the highest one ever accepted is refused, also after a restart — that
// feed's issue time, id and digest are kept in a file beside the provider key (`highestFile`).
// Signature checks are src/catalog's verifyCatalogFeed (node:crypto); nothing is hand-rolled.
import { mkdir, open, readFile, rename } from "node:fs/promises";
import { dirname, join } from "node:path";
import { verifyCatalogFeed } from "../catalog/feed.ts";
import { catalogStateFromFeed, type CatalogState } from "../catalog/state.ts";
import type { ModelEntry } from "../wire/frames.ts";
import type { LogFn } from "./events.ts";
import type { Timers } from "./runtime.ts";

export const CATALOG_PIN_FILE = "catalog-operator.pub";
/** The highest feed this machine ever accepted (rollback protection across restarts). */
export const CATALOG_HIGHEST_FILE = "catalog-highest.json";
export const DEFAULT_CATALOG_REFRESH_MS = 60_000;
const FETCH_TIMEOUT_MS = 5_000;

export const catalogPinPathFor = (keyFile: string): string => join(dirname(keyFile), CATALOG_PIN_FILE);
export const catalogHighestPathFor = (keyFile: string): string => join(dirname(keyFile), CATALOG_HIGHEST_FILE);

/**
 * The feed a provider's rollback check measures against: the highest one accepted, by `issued_at`
 * (the feed body's only monotone field; docs/catalog.md gives it no other sequence number).
 */
interface HighestFeed {
  issued_at_ms: number;
  issued_at: string;
  catalog_id: string;
  body_digest: string;
}

export interface CatalogUrls {
  feed: string;
  signature: string;
  pubkey: string;
}

/**
 * The catalog URLs: from `--catalog-url` (the feed's URL; `.sig` and `/pubkey` beside it, as the
 * gateway serves them) or derived from the gateway's ws(s) URL (same host and port, http(s)).
 */
export function catalogUrlsFor(gatewayUrl: string, catalogUrl?: string): CatalogUrls {
  const feed = catalogUrl !== undefined ? new URL(catalogUrl) : new URL("/v1/catalog", gatewayUrl);
  if (catalogUrl === undefined) feed.protocol = feed.protocol === "wss:" ? "https:" : "http:";
  feed.search = "";
  feed.hash = "";
  const base = feed.toString();
  return { feed: base, signature: `${base}.sig`, pubkey: `${base}/pubkey` };
}

/** Why a configured model is not advertised. */
export type Exclusion =
  | { model_id: string; why: "not_in_catalog" | "retired" }
  | { model_id: string; why: "hash_mismatch"; catalog_hash: string };

/**
 * Pure: the configured models the catalog lets this machine advertise (listed, same hash) and why
 * each other one is left out. `allowUncatalogued` (for gateways in observe mode) keeps models no
 * accepted feed ever listed; a model in `retired` (listed by an earlier accepted feed, absent now)
 * or listed with another hash never is.
 */
export function catalogModels(
  configured: readonly ModelEntry[],
  state: CatalogState,
  allowUncatalogued = false,
  retired: ReadonlySet<string> = new Set(),
): { models: ModelEntry[]; excluded: Exclusion[] } {
  const models: ModelEntry[] = [];
  const excluded: Exclusion[] = [];
  for (const m of configured) {
    const listed = state.models.get(m.model_id);
    if (listed === undefined) {
      if (retired.has(m.model_id)) excluded.push({ model_id: m.model_id, why: "retired" });
      else if (allowUncatalogued) models.push(m);
      else excluded.push({ model_id: m.model_id, why: "not_in_catalog" });
    } else if (listed.model_hash !== m.model_hash) {
      excluded.push({ model_id: m.model_id, why: "hash_mismatch", catalog_hash: listed.model_hash });
    } else {
      models.push(m);
    }
  }
  return { models, excluded };
}

/**
 * Where the watcher stands:
 * - `verified`: a feed is in force; only its matching models are advertised.
 * - `missing`: the gateway has no catalog (404) and none was ever verified: the configured models are
 *   advertised with a warning (the provider cannot know the gateway's mode; in enforce mode the
 *   gateway routes nothing uncatalogued anyway, in observe mode it may).
 * - `unreachable`: no answer yet: same as missing; the gateway's own checks decide.
 * - `refused`: the only feeds seen failed verification (bad signature, another key): nothing is
 *   advertised — a feed that does not verify is evidence of a wrong gateway or tampering.
 */
export type CatalogStatus = "verified" | "missing" | "unreachable" | "refused";

export type RefreshOutcome =
  | "accepted"
  | "unchanged"
  | "missing"
  | "unreachable"
  | "rollback"
  | "key_mismatch"
  | "invalid";

export interface CatalogWatcherOptions {
  urls: CatalogUrls;
  /** This machine's models with their measured hashes. */
  models: readonly ModelEntry[];
  /** Raw operator key from `--catalog-pubkey`: used as given, never pinned or replaced. */
  publicKey?: Uint8Array;
  /** Trust-on-first-use pin file (used when `publicKey` is absent). */
  pinFile?: string;
  /** Where the highest accepted feed is kept, so a restart does not forget it (catalogHighestPathFor). */
  highestFile?: string;
  /** Keep models the catalog does not list (observe-mode gateways). */
  allowUncatalogued?: boolean;
  fetch?: typeof fetch;
  now?: () => number;
  log?: LogFn;
  timers?: Pick<Timers, "setInterval" | "clearInterval">;
  fetchTimeoutMs?: number;
}

export interface CatalogWatcher {
  readonly status: CatalogStatus;
  /** The feed in force, if any. */
  readonly state: CatalogState | null;
  /** The models to advertise now. */
  advertised(): ModelEntry[];
  /** Fetches and verifies once; never throws. */
  refresh(): Promise<RefreshOutcome>;
  /** Calls `fn` whenever the advertised list changes. */
  onChange(fn: () => void): () => void;
  /** Refreshes every `intervalMs` until stop(). */
  start(intervalMs: number): void;
  stop(): void;
}

type Fetched = { kind: "ok"; bytes: Uint8Array; text: string; catalogId: string | null; etag: string | null } | { kind: "not_modified" } | { kind: "not_found" } | { kind: "failed"; status: number | null };

const b64 = (raw: Uint8Array) => Buffer.from(raw).toString("base64");

/** A raw 32-byte key from standard base64 text, or null. */
export function parsePublicKey(text: string): Uint8Array | null {
  const trimmed = text.trim();
  if (!/^[A-Za-z0-9+/]{43}=$/.test(trimmed)) return null;
  const raw = Buffer.from(trimmed, "base64");
  return raw.byteLength === 32 && raw.toString("base64") === trimmed ? new Uint8Array(raw) : null;
}

export function createCatalogWatcher(options: CatalogWatcherOptions): CatalogWatcher {
  const fetchFn = options.fetch ?? fetch;
  const log = options.log ?? (() => {});
  const timeoutMs = options.fetchTimeoutMs ?? FETCH_TIMEOUT_MS;
  const listeners = new Set<() => void>();
  let status: CatalogStatus = "unreachable";
  let state: CatalogState | null = null;
  let etag: string | null = null;
  let pinned: Uint8Array | null = options.publicKey ?? null;
  let pinLoaded = options.publicKey !== undefined;
  let advertised: ModelEntry[] = [...options.models];
  // Model ids listed by any feed accepted so far: one missing from the feed in force was retired.
  const everListed = new Set<string>();
  let interval: unknown = null;
  let inFlight: Promise<RefreshOutcome> | null = null;
  const timers = options.timers ?? {
    setInterval: (fn: () => void, ms: number): unknown => setInterval(fn, ms),
    clearInterval: (h: unknown) => clearInterval(h as ReturnType<typeof setInterval>),
  };
  // Log lines that would repeat every refresh are written when something changes, not every time.
  const said = new Set<string>();
  const once = (key: string, event: string, fields: Record<string, unknown>) => {
    if (said.has(key)) return;
    said.add(key);
    log(event, fields);
  };

  async function get(url: string, headers: Record<string, string> = {}): Promise<Fetched> {
    let response: Response;
    try {
      response = await fetchFn(url, { headers, signal: AbortSignal.timeout(timeoutMs), redirect: "error" });
    } catch {
      return { kind: "failed", status: null };
    }
    if (response.status === 304) return { kind: "not_modified" };
    if (response.status === 404) return { kind: "not_found" };
    if (response.status !== 200) return { kind: "failed", status: response.status };
    const bytes = new Uint8Array(await response.arrayBuffer());
    return {
      kind: "ok",
      bytes,
      text: new TextDecoder().decode(bytes),
      catalogId: response.headers.get("x-catalog-id"),
      etag: response.headers.get("etag"),
    };
  }

  // The highest feed accepted by an earlier run of this machine (read once, at the first refresh).
  let highest: HighestFeed | null = null;
  let highestLoaded = options.highestFile === undefined;

  async function loadHighest(): Promise<void> {
    if (highestLoaded || options.highestFile === undefined) return;
    highestLoaded = true;
    let text: string;
    try {
      text = await readFile(options.highestFile, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") log("catalog_highest_unreadable", { file: options.highestFile });
      return;
    }
    try {
      const h = JSON.parse(text) as Partial<HighestFeed>;
      if (typeof h.issued_at_ms === "number" && typeof h.issued_at === "string" && typeof h.catalog_id === "string" && typeof h.body_digest === "string") {
        highest = { issued_at_ms: h.issued_at_ms, issued_at: h.issued_at, catalog_id: h.catalog_id, body_digest: h.body_digest };
        return;
      }
    } catch {}
    // Unreadable: rollback protection falls back to this run's memory, and the owner is told.
    log("catalog_highest_unreadable", { file: options.highestFile });
  }

  /** Replaces the file whole (temporary file + rename), so a crash leaves the old or the new one. */
  async function writeHighest(next: HighestFeed): Promise<void> {
    highest = next;
    if (options.highestFile === undefined) return;
    const temporary = `${options.highestFile}.tmp`;
    try {
      await mkdir(dirname(options.highestFile), { recursive: true, mode: 0o700 });
      const handle = await open(temporary, "w", 0o600);
      try {
        await handle.writeFile(`${JSON.stringify(next)}\n`, "utf8");
        await handle.sync();
      } finally {
        await handle.close();
      }
      await rename(temporary, options.highestFile);
    } catch (error) {
      log("catalog_highest_write_failed", { file: options.highestFile, error: (error as NodeJS.ErrnoException).code ?? "error" });
    }
  }

  async function loadPin(): Promise<void> {
    if (pinLoaded || options.pinFile === undefined) return;
    try {
      const key = parsePublicKey(await readFile(options.pinFile, "utf8"));
      if (key === null) log("catalog_pin_unreadable", { file: options.pinFile });
      pinned = key;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") log("catalog_pin_unreadable", { file: options.pinFile });
    }
    pinLoaded = true;
  }

  async function writePin(key: Uint8Array): Promise<void> {
    if (options.pinFile === undefined) return;
    try {
      await mkdir(dirname(options.pinFile), { recursive: true, mode: 0o700 });
      // "wx": a pin is written once; a racing writer's pin wins and is re-read on the next refresh.
      const handle = await open(options.pinFile, "wx", 0o600);
      try {
        await handle.writeFile(`${b64(key)}\n`, "utf8");
      } finally {
        await handle.close();
      }
      log("catalog_key_pinned", { public_key: b64(key), file: options.pinFile });
    } catch (error) {
      log("catalog_pin_write_failed", { file: options.pinFile, error: (error as NodeJS.ErrnoException).code ?? "error" });
      if ((error as NodeJS.ErrnoException).code === "EEXIST") pinLoaded = false;
    }
  }

  function recompute(): void {
    let next: ModelEntry[];
    if (state !== null) {
      const retired = new Set([...everListed].filter((id) => !state!.models.has(id)));
      const { models, excluded } = catalogModels(options.models, state, options.allowUncatalogued, retired);
      for (const e of excluded) {
        const catalogHash = e.why === "hash_mismatch" ? e.catalog_hash : null;
        once(`excluded:${e.model_id}:${e.why}:${catalogHash}`, "model_not_advertised", {
          model_id: e.model_id,
          why: e.why,
          catalog_id: state.catalog_id,
          ...(e.why === "hash_mismatch" ? { local_hash: options.models.find((m) => m.model_id === e.model_id)?.model_hash, catalog_hash: e.catalog_hash } : {}),
        });
      }
      next = models;
    } else if (status === "refused") {
      next = [];
    } else {
      next = [...options.models];
    }
    const same = next.length === advertised.length && next.every((m, i) => m === advertised[i]);
    if (same) return;
    const before = new Set(advertised.map((m) => m.model_id));
    advertised = next;
    log("models_advertised", {
      models: next.map((m) => m.model_id),
      withdrawn: [...before].filter((id) => !next.some((m) => m.model_id === id)),
      catalog_id: state?.catalog_id ?? null,
    });
    for (const fn of [...listeners]) {
      try {
        fn();
      } catch {
        log("listener_error", { hook: "catalog_change" });
      }
    }
  }

  function setStatus(next: CatalogStatus): void {
    if (state !== null) return; // a verified feed stays in force whatever later fetches say
    // A refusal stands until a feed verifies: a 404 or a timeout afterwards proves nothing.
    if (status === "refused" && next !== "refused") return;
    status = next;
  }

  /** The served operator key differs from the trusted one: say so once per served key. */
  async function explainKey(): Promise<boolean> {
    const served = await get(options.urls.pubkey);
    if (served.kind !== "ok") return false;
    const key = parsePublicKey(served.text);
    if (key === null || pinned === null || Buffer.from(key).equals(Buffer.from(pinned))) return false;
    const source = options.publicKey !== undefined ? "--catalog-pubkey" : `pin file ${options.pinFile ?? ""}`;
    once(`key_mismatch:${b64(key)}`, "catalog_key_mismatch", {
      trusted_key: b64(pinned),
      served_key: b64(key),
      trusted_from: source,
      action: "feed refused; if the operator really changed the catalog key, replace the pin file (or pass --catalog-pubkey)",
    });
    return true;
  }

  async function refreshOnce(): Promise<RefreshOutcome> {
    await loadPin();
    await loadHighest();
    const feed = await get(options.urls.feed, etag !== null && state !== null ? { "if-none-match": etag } : {});
    if (feed.kind === "not_modified") return "unchanged";
    if (feed.kind === "not_found") {
      setStatus("missing");
      once("missing", "catalog_missing", { url: options.urls.feed, advertising: state === null ? "configured models" : "catalog in force" });
      return "missing";
    }
    if (feed.kind === "failed") {
      setStatus("unreachable");
      log("catalog_fetch_failed", { url: options.urls.feed, status: feed.status });
      return "unreachable";
    }
    const sig = await get(options.urls.signature);
    if (sig.kind !== "ok") {
      log("catalog_fetch_failed", { url: options.urls.signature, status: sig.kind === "failed" ? sig.status : null });
      return "unreachable";
    }
    // Body and signature are two requests: a catalog change between them makes a pair that cannot
    // verify. The next refresh fetches both again.
    if (feed.catalogId !== null && sig.catalogId !== null && feed.catalogId !== sig.catalogId) {
      log("catalog_changed_while_fetching", {});
      return "unreachable";
    }

    let key = pinned;
    let firstUse = false;
    if (key === null) {
      const served = await get(options.urls.pubkey);
      key = served.kind === "ok" ? parsePublicKey(served.text) : null;
      if (key === null) {
        log("catalog_fetch_failed", { url: options.urls.pubkey, status: served.kind === "failed" ? served.status : null });
        return "unreachable";
      }
      firstUse = true;
    }

    const verified = verifyCatalogFeed(feed.bytes, sig.text, key);
    if (!verified.ok) {
      // A stale signature after a change is the common harmless case; another key is not.
      const mismatch = !firstUse && verified.code === "bad_signature" && (await explainKey());
      if (!mismatch) log("catalog_refused", { code: verified.code, message: verified.message });
      setStatus("refused");
      recompute();
      return mismatch ? "key_mismatch" : "invalid";
    }
    const next = verified.feed;
    if (state !== null && next.digest === state.body_digest) {
      etag = feed.etag;
      return "unchanged";
    }
    // Rollback: an older (or equally old, different) feed than the one in force is refused, so a
    // replayed feed cannot bring back a retired model.
    if (state !== null && next.issued_at_ms <= state.issued_at_ms) {
      once(`rollback:${next.digest}`, "catalog_rollback_refused", {
        offered_catalog_id: next.body.catalog_id,
        offered_issued_at: next.body.issued_at,
        in_force_catalog_id: state.catalog_id,
        in_force_issued_at: state.body.issued_at,
      });
      return "rollback";
    }
    // After a restart nothing is in force yet: the highest feed an earlier run accepted is the floor.
    // The very feed it accepted is still welcome (the gateway serves it until the next change).
    if (state === null && highest !== null && next.digest !== highest.body_digest && next.issued_at_ms <= highest.issued_at_ms) {
      once(`rollback:${next.digest}`, "catalog_rollback_refused", {
        offered_catalog_id: next.body.catalog_id,
        offered_issued_at: next.body.issued_at,
        highest_accepted_catalog_id: highest.catalog_id,
        highest_accepted_issued_at: highest.issued_at,
        highest_from: options.highestFile,
        action: "nothing is advertised until the gateway serves this feed or a newer one",
      });
      setStatus("refused");
      recompute();
      return "rollback";
    }
    if (firstUse) {
      pinned = key;
      if (options.pinFile !== undefined) await writePin(key);
    }
    state = catalogStateFromFeed(next);
    for (const id of state.models.keys()) everListed.add(id);
    if (highest === null || next.issued_at_ms > highest.issued_at_ms) {
      await writeHighest({ issued_at_ms: next.issued_at_ms, issued_at: next.body.issued_at, catalog_id: next.body.catalog_id, body_digest: next.digest });
    }
    status = "verified";
    etag = feed.etag;
    const now = (options.now ?? Date.now)();
    log("catalog_accepted", { catalog_id: state.catalog_id, issued_at: state.body.issued_at, models: state.body.models.length });
    // docs/catalog.md: an expired catalog stays in force (the gateway reports itself degraded); providers
    // keep serving what it lists.
    if (now >= next.expires_at_ms) log("catalog_expired", { catalog_id: state.catalog_id, expires_at: state.body.expires_at });
    recompute();
    return "accepted";
  }

  const watcher: CatalogWatcher = {
    get status() {
      return status;
    },
    get state() {
      return state;
    },
    advertised: () => advertised,
    refresh() {
      // One at a time: overlapping refreshes could accept feeds out of order.
      inFlight ??= refreshOnce()
        .catch((error: unknown): RefreshOutcome => {
          log("catalog_refresh_error", { error: error instanceof Error ? error.name : typeof error });
          return "unreachable";
        })
        .finally(() => {
          inFlight = null;
          recompute();
        });
      return inFlight;
    },
    onChange(fn) {
      listeners.add(fn);
      return () => listeners.delete(fn);
    },
    start(intervalMs) {
      if (interval !== null) timers.clearInterval(interval);
      interval = timers.setInterval(() => void watcher.refresh(), intervalMs);
    },
    stop() {
      if (interval !== null) timers.clearInterval(interval);
      interval = null;
    },
  };
  return watcher;
}
