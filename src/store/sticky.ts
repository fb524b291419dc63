// The sticky-routing map (conversation key → provider id), behind an interface so that several gateway
// nodes can share it (a Redis backing, docs/routing.md). Keys are HMACs: raw conversation tags never
// reach it. Entries expire after an idle TTL; the account id is kept so an account can purge its own.

export interface StickyMap {
  /** The pinned provider of a live entry, refreshing its idle TTL; null when none. */
  get(key: string, now: number): Promise<string | null>;
  /** Pins (or re-pins) the conversation to a provider; its idle TTL starts again. */
  set(key: string, accountId: string, providerId: string, now: number): Promise<void>;
  /** Drops every entry of the account; how many live ones there were. */
  purgeAccount(accountId: string, now: number): Promise<number>;
}

interface Entry {
  providerId: string;
  accountId: string;
  expiresAt: number;
}

/**
 * One node's map in memory. A Map's insertion order is its touch order (a touch re-inserts), and every
 * entry has the same TTL, so expired entries are always at the front: sweeping costs only what expired.
 * At `maxEntries` the least recently used entry goes first.
 */
export function createMemoryStickyMap(options: { idleTtlMs: number; maxEntries?: number }): StickyMap & { size(): number } {
  const entries = new Map<string, Entry>();
  const byAccount = new Map<string, Set<string>>();
  const maxEntries = options.maxEntries ?? 100_000;

  const drop = (key: string, entry: Entry) => {
    entries.delete(key);
    const keys = byAccount.get(entry.accountId);
    keys?.delete(key);
    if (keys?.size === 0) byAccount.delete(entry.accountId);
  };
  const sweep = (now: number) => {
    for (const [key, entry] of entries) {
      if (entry.expiresAt > now && entries.size <= maxEntries) break;
      drop(key, entry);
    }
  };

  return {
    async get(key, now) {
      sweep(now);
      const entry = entries.get(key);
      if (!entry) return null;
      entries.delete(key);
      entry.expiresAt = now + options.idleTtlMs;
      entries.set(key, entry);
      return entry.providerId;
    },
    async set(key, accountId, providerId, now) {
      const old = entries.get(key);
      if (old) drop(key, old);
      entries.set(key, { providerId, accountId, expiresAt: now + options.idleTtlMs });
      let keys = byAccount.get(accountId);
      if (!keys) byAccount.set(accountId, (keys = new Set()));
      keys.add(key);
      sweep(now);
    },
    async purgeAccount(accountId, now) {
      sweep(now);
      const keys = byAccount.get(accountId);
      if (!keys) return 0;
      const n = keys.size;
      for (const key of [...keys]) drop(key, entries.get(key)!);
      return n;
    },
    size: () => entries.size,
  };
}
