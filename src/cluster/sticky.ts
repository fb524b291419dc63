// The sticky-routing map of a cluster (docs/routing.md, docs/scale-out.md): every node sees the same
// pins. One Redis string per conversation key (its pinned provider id) with the idle TTL as its
// expiry, refreshed on each use, and one set per account naming its keys, so an account can purge its
// own. Expiry runs on Redis's clock: the `now` the interface passes is the embedded map's concern.
import type { StickyMap } from "../store/sticky.ts";
import type { ClusterRedis } from "./redis.ts";

const entryKey = (key: string) => `gw:sticky:${key}`;
const accountKey = (accountId: string) => `gw:sticky-account:${accountId}`;

// KEYS[1]: the entry; ARGV[1]: idle TTL ms. A hit starts its idle TTL again.
const GET = `
local v = redis.call('GET', KEYS[1])
if v then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1])) end
return v`;

// KEYS: the entry, the account's set; ARGV: provider id, idle TTL ms, the entry's key name.
const SET = `
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
return 1`;

// KEYS[1]: the account's set. Counts the entries still live, drops them all, and the set.
const PURGE = `
local n = 0
for _, k in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  n = n + redis.call('DEL', k)
end
redis.call('DEL', KEYS[1])
return n`;

export function redisStickyMap(redis: ClusterRedis, options: { idleTtlMs: number }): StickyMap {
  return {
    async get(key) {
      const result = await redis.call<string | null>("EVAL", [GET, 1, entryKey(key), options.idleTtlMs]);
      // Stickiness never fails a request: an unreachable Redis reads as "no pin".
      return result.ok && typeof result.value === "string" ? result.value : null;
    },
    async set(key, accountId, providerId) {
      const result = await redis.call("EVAL", [SET, 2, entryKey(key), accountKey(accountId), providerId, options.idleTtlMs, entryKey(key)]);
      if (!result.ok) throw new Error(`sticky pin not written: ${result.error}`);
    },
    async purgeAccount(accountId) {
      const result = await redis.call<number>("EVAL", [PURGE, 1, accountKey(accountId)]);
      if (!result.ok) throw new Error(`sticky purge failed: ${result.error}`);
      return result.value;
    },
  };
}
