// Per-account concurrency slots shared by every node (docs/scale-out.md): one Redis sorted set per
// account, member = request id, score = the lease's expiry on Redis's own clock (TIME), so nodes'
// clocks never matter. A node refreshes the leases of the slots it holds every fifth of the lease; a
// node that dies stops refreshing, and its slots drop out of the count within one lease.
import type { AcquireSlotResult } from "../store/index.ts";
import type { ClusterRedis } from "./redis.ts";

export type SharedSlotResult = AcquireSlotResult | { ok: false; code: "engine_unavailable"; in_use: 0 };

// ARGV: request id, limit, lease ms, deadline (Redis ms, or empty). Expired members go first; taking a
// held slot again is a no-op. Past its deadline the node has answered the buyer 503 already: the slot
// is not taken (-1), or a command held in a silent connection and delivered late would count a slot
// nobody holds for a whole lease (docs/scale-out.md, "When Redis is unreachable").
// KEYS[2], when given: the node's owned set, which gets the request (`r:` + id) with its slot, so it
// is recorded before anything of the request is written (its reservation comes next), and ARGV[5],
// the node's writer member (`w:` + incarnation, src/cluster/node.ts).
const ACQUIRE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] ~= '' and now > tonumber(ARGV[4]) then return {-1, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, redis.call('ZCARD', KEYS[1])} end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then return {0, n} end
if KEYS[2] then redis.call('SADD', KEYS[2], 'r:' .. ARGV[1], ARGV[5]) end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return {1, n + 1}`;

// KEYS: account sets; ARGV[1]: lease ms, then one request id per key. Only members still held move.
const REFRESH = `
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', expiry, ARGV[i + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
end
return #KEYS`;

// The members whose lease has not expired (a dead node's slots stop counting, as in ACQUIRE).
const IN_USE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')`;

export interface SharedSlots {
  acquire(account_id: string, request_id: string, limit: number): Promise<SharedSlotResult>;
  release(request_id: string): void;
  /** Slots this node holds (metrics, tests). */
  held(): number;
  /** Slots the account holds on every node, as Redis counts them now. */
  inUse(account_id: string): Promise<number>;
  stop(): void;
}

const slotKey = (account_id: string) => `gw:slots:${account_id}`;

/**
 * `owner`: the node's set of what it owns (src/cluster/node.ts), which each request joins with its
 * slot (together with the node's writer member); `owned` hears each request that joined it.
 */
export function sharedSlots(
  redis: ClusterRedis,
  leaseMs: number,
  owner?: { key: string; writerMember: string; owned?: (requestId: string) => void },
): SharedSlots {
  const ownedKey = owner?.key;
  const accountOf = new Map<string, string>();
  // Acquires whose answer never came: each may have run in Redis before the node gave up on it (its
  // answer lost on the way back), so its slot is removed once Redis answers again.
  const abandoned = new Map<string, string>();
  const removeAbandoned = () => {
    for (const [request, account] of abandoned) {
      // On one connection, in order: once the ZREM is acknowledged, the SREM before it has run.
      if (ownedKey !== undefined) redis.fire("SREM", [ownedKey, `r:${request}`]);
      void redis.call("ZREM", [slotKey(account), request]).then((result) => {
        if (result.ok) abandoned.delete(request);
      });
    }
  };
  redis.onChange((up) => {
    if (up) removeAbandoned();
  });
  const refresh = setInterval(() => {
    if (abandoned.size > 0 && redis.up) removeAbandoned();
    if (accountOf.size === 0) return;
    const keys: string[] = [];
    const members: string[] = [];
    for (const [request, account] of accountOf) {
      keys.push(slotKey(account));
      members.push(request);
    }
    redis.fire("EVAL", [REFRESH, keys.length, ...keys, leaseMs, ...members]);
  }, Math.max(50, Math.floor(leaseMs / 5)));
  refresh.unref?.();
  return {
    async acquire(account_id, request_id, limit) {
      const keys = ownedKey === undefined ? [slotKey(account_id)] : [slotKey(account_id), ownedKey];
      const deadline = redis.commandDeadline() ?? "";
      const writer = owner === undefined ? [] : [owner.writerMember];
      const result = await redis.call<[number, number]>("EVAL", [ACQUIRE, keys.length, ...keys, request_id, limit, leaseMs, deadline, ...writer]);
      if (!result.ok) {
        abandoned.set(request_id, account_id);
        return { ok: false, code: "engine_unavailable", in_use: 0 };
      }
      const [taken, inUse] = result.value;
      if (taken === -1) return { ok: false, code: "engine_unavailable", in_use: 0 };
      if (taken !== 1) return { ok: false, code: "concurrency_exhausted", in_use: inUse };
      accountOf.set(request_id, account_id);
      owner?.owned?.(request_id);
      return { ok: true, in_use: inUse };
    },
    release(request_id) {
      const account = accountOf.get(request_id);
      if (account === undefined) return;
      accountOf.delete(request_id);
      // If Redis is down now, the lease frees the slot when it expires.
      redis.fire("ZREM", [slotKey(account), request_id]);
    },
    held: () => accountOf.size,
    async inUse(account_id) {
      const result = await redis.call<number>("EVAL", [IN_USE, 1, slotKey(account_id)]);
      return result.ok ? result.value : 0;
    },
    stop: () => clearInterval(refresh),
  };
}
