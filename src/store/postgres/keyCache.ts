// Cached API-key lookups on PostgreSQL (docs/scale-out.md, "Changes reach every node"): a hit answers a
// buyer request without a round trip. What invalidates it is the database's own change feed: a trigger
// NOTIFYs `gateway_keys` whenever a key is revoked or deleted or an account's tier changes
// (postgres/migrations.ts, version 4), whichever process or node made the change, and every store
// LISTENs. Nothing polls. The cache answers only while that feed is known to be heard:
// - from the moment the LISTEN is acknowledged (again after each reconnect of its connection), never
//   before, and everything cached is dropped at that moment (notifications may have been missed);
// - never while the database is unreachable; entries cached before an outage are dropped with it;
// - a lookup that was in flight when a change arrived is not cached (it may have read the old row).
// This process's own revocations and tier changes drop it at once, before the feed brings them back.
// Entries are keyed by the key's SHA-256 (never the raw key); last use is still written once a minute.
import type { AuthenticatedKey } from "../accountTypes.ts";
import { LAST_USED_RESOLUTION_MS } from "../accounts.ts";

/** The channel the key-change trigger notifies. */
export const KEY_CHANGES_CHANNEL = "gateway_keys";

const CACHE_LIMIT = 10_000;

export interface PgKeyCache {
  /** The cached key for this hash, when the cache may answer and the last use needs no write. */
  hit(hash_b64: string, now_ms: number): AuthenticatedKey | undefined;
  /** A ticket for a lookup about to start: `keep` caches its answer only if nothing changed meanwhile. */
  ticket(): number;
  /** The lookup's answer, with the key's last use as now stored (the entry lapses a minute after it). */
  keep(ticket: number, hash_b64: string, key: AuthenticatedKey | null, last_used_at_ms: number): void;
  /** Something may have changed: drop everything, and let no lookup in flight be kept. */
  forget(): void;
  /** Whether the change feed is heard (LISTEN acknowledged, database up). */
  hearing(heard: boolean): void;
}

export function pgKeyCache(): PgKeyCache {
  const cache = new Map<string, { key: AuthenticatedKey; lastUsedAt: number }>();
  let generation = 0;
  let heard = false;
  const forget = () => {
    generation++;
    cache.clear();
  };
  return {
    hit(hash_b64, now_ms) {
      if (!heard) return undefined;
      const entry = cache.get(hash_b64);
      return entry !== undefined && now_ms - entry.lastUsedAt < LAST_USED_RESOLUTION_MS ? entry.key : undefined;
    },
    ticket: () => generation,
    keep(ticket, hash_b64, key, last_used_at_ms) {
      if (key === null) {
        cache.delete(hash_b64);
        return;
      }
      if (!heard || ticket !== generation) return;
      if (cache.size >= CACHE_LIMIT) cache.clear();
      cache.set(hash_b64, { key, lastUsedAt: last_used_at_ms });
    },
    forget,
    hearing(value) {
      forget();
      heard = value;
    },
  };
}
