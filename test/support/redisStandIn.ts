// A ClusterRedis stand-in for one node's unit tests (no server): `answer` decides each command's reply,
// and each subscription's listener is handed to the test, which plays the messages other nodes publish.
import type { ClusterRedis, RedisResult } from "../../src/cluster/redis.ts";

export function redisStandIn(answer: (command: string, args: (string | number)[]) => Promise<RedisResult<unknown>> | RedisResult<unknown>) {
  const listeners = new Map<string, (message: string) => void>();
  const redis: ClusterRedis = {
    channel: (name) => name,
    up: true,
    call: async <T>(command: string, args: (string | number)[]) => (await answer(command, args)) as RedisResult<T>,
    fire() {},
    async subscribe(channel, listener) {
      listeners.set(channel, listener);
    },
    onChange() {},
    commandDeadline: () => null,
    close() {},
  };
  return { redis, listeners };
}
