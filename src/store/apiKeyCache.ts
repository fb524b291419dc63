// Cached API-key lookups for the gateway's own store. authenticateApiKey (SHA-256 + an indexed join)
// runs on every buyer request; a hit here costs one `PRAGMA data_version` instead. Revocation still
// takes effect at once:
// - in this process, any store call that may revoke a key or change a tier calls `forget` first
//   (src/store/groupCommit.ts does, for every call but the hot ledger writes and in-memory counters);
// - in other processes (the operator CLI: `gateway keys revoke`), any commit changes this connection's
//   `data_version`, which empties the cache before the next lookup is answered.
// Entries are keyed by the key's SHA-256 (never the raw key); last use is still written once a minute.
import type { Database } from "bun:sqlite";
import { LAST_USED_RESOLUTION_MS } from "./accounts.ts";
import type { ApiKeyLookup, AuthenticatedKey } from "./accountTypes.ts";
import { hashApiKey } from "./ids.ts";

const CACHE_LIMIT = 10_000;

interface CachedKey {
  key: AuthenticatedKey;
  /** When this process last wrote last_used_at_ms for it (or found it written). */
  lastUsedAt: number;
}

/** `lookup` behind a cache; `forget` empties it. */
export function cacheApiKeyLookups(
  lookup: ApiKeyLookup["authenticateApiKey"],
  db: Database,
  keyPrefix: string,
  clock: () => number,
): ApiKeyLookup & { forget(): void } {
  const cache = new Map<string, CachedKey>();
  let seenVersion = -1;
  const versionQuery = db.query("PRAGMA data_version");
  const authenticateApiKey = (api_key: string, now_ms = clock()): AuthenticatedKey | null => {
    if (!api_key.startsWith(`${keyPrefix}_`)) return null;
    // Another connection committed since the last lookup (e.g. `gateway keys revoke`): forget all.
    const version = (versionQuery.get() as { data_version: number }).data_version;
    if (version !== seenVersion) {
      cache.clear();
      seenVersion = version;
    }
    const id = Buffer.from(hashApiKey(api_key)).toString("base64");
    const hit = cache.get(id);
    if (hit && now_ms - hit.lastUsedAt < LAST_USED_RESOLUTION_MS) return hit.key;
    const key = lookup(api_key, now_ms);
    if (key === null) {
      cache.delete(id);
      return null;
    }
    if (cache.size >= CACHE_LIMIT) cache.clear();
    cache.set(id, { key, lastUsedAt: now_ms });
    return key;
  };
  return { authenticateApiKey, forget: () => cache.clear() };
}
