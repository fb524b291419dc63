// The replay cache's cluster backend (docs/scale-out.md): finished results and in-flight claims in
// Redis, so a retry that lands on another node is replayed, and a key in flight on one node is
// refused (409) on every other one. A claim names its node: one whose node died is free again, as
// that run can never finish.
import type { ReplayBackend, SharedEntry, StoredResult } from "../store/replayBackend.ts";
import type { ClusterRedis } from "./redis.ts";

interface Stored {
  s: "in_flight" | "succeeded";
  fp: string;
  node?: string;
  /** The claiming process's incarnation of `node`: a node restarted under its id does not own it. */
  inc?: string;
  status?: number;
  headers?: string[];
  body?: string;
}

const CLAIM = `
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`;

const keyEntry = (keyId: string) => `gw:replay:k:${Buffer.from(keyId).toString("base64url")}`;
const bodyEntry = (fingerprint: string) => `gw:replay:b:${Buffer.from(fingerprint).toString("base64url")}`;

export interface RedisReplayOptions {
  nodeId: string;
  /** This process's incarnation of `nodeId` (a node restarted under its id gets a new one). */
  incarnation: string;
  windowMs: number;
  /** The longest a run can be in flight (the request deadline): a claim outlives no run. */
  inFlightMs: number;
  /** Whether a node still holds its membership lease — held by that incarnation of it, when given. */
  nodeAlive: (nodeId: string, incarnation?: string) => Promise<boolean>;
}

export function redisReplays(redis: ClusterRedis, options: RedisReplayOptions): ReplayBackend {
  const decode = (text: string | null): Stored | null => {
    if (!text) return null;
    try {
      return JSON.parse(text) as Stored;
    } catch {
      return null;
    }
  };
  const toEntry = (stored: Stored): SharedEntry =>
    stored.s === "in_flight"
      ? { state: "in_flight", fingerprint: stored.fp }
      : {
          state: "succeeded",
          fingerprint: stored.fp,
          status: stored.status ?? 200,
          headers: stored.headers ?? [],
          body: new Uint8Array(Buffer.from(stored.body ?? "", "base64")).buffer,
        };
  const claimText = (fingerprint: string) => JSON.stringify({ s: "in_flight", fp: fingerprint, node: options.nodeId, inc: options.incarnation } satisfies Stored);
  const resultText = (result: StoredResult) =>
    JSON.stringify({ s: "succeeded", fp: result.fingerprint, status: result.status, headers: result.headers, body: Buffer.from(result.body).toString("base64") } satisfies Stored);

  /**
   * A stored claim of a dead node counts as nothing — nor does one of a node's earlier process, this
   * node's included, when it was restarted under its id: that run can never finish, and a retry
   * waiting for it would wait out REMOTE_WAIT_MS (found by the cluster crash chaos).
   */
  const current = async (stored: Stored | null): Promise<Stored | null> => {
    if (stored?.s !== "in_flight" || !stored.node) return stored;
    const alive = stored.node === options.nodeId ? stored.inc === undefined || stored.inc === options.incarnation : await options.nodeAlive(stored.node, stored.inc);
    return alive ? stored : null;
  };

  return {
    async claim(keyId, fingerprint) {
      const key = keyEntry(keyId);
      const result = await redis.call<string | null>("EVAL", [CLAIM, 1, key, claimText(fingerprint), options.inFlightMs]);
      if (!result.ok) return "unavailable";
      const held = await current(decode(result.value));
      if (held) return toEntry(held);
      if (result.value) {
        // A dead node's claim: taken over.
        const set = await redis.call("SET", [key, claimText(fingerprint), "PX", options.inFlightMs]);
        if (!set.ok) return "unavailable";
      }
      return null;
    },
    async latest(fingerprint) {
      const result = await redis.call<string | null>("GET", [bodyEntry(fingerprint)]);
      if (!result.ok) return "unavailable";
      const held = await current(decode(result.value));
      return held ? toEntry(held) : null;
    },
    started(fingerprint) {
      redis.fire("SET", [bodyEntry(fingerprint), claimText(fingerprint), "PX", options.inFlightMs]);
    },
    finished(keyId, fingerprint, result) {
      if (result === null) {
        if (keyId !== null) redis.fire("DEL", [keyEntry(keyId)]);
        redis.fire("DEL", [bodyEntry(fingerprint)]);
        return;
      }
      const text = resultText(result);
      const kept = [redis.call("SET", [bodyEntry(fingerprint), text, "PX", options.windowMs])];
      if (keyId !== null) kept.push(redis.call("SET", [keyEntry(keyId), text, "PX", options.windowMs]));
      // Answered (or failed: Redis is then down, and buyers are refused anyway): the charge may follow.
      return Promise.all(kept).then(() => {});
    },
  };
}
