// One cluster node, in the test's process, for tests that probe the order of its writes against its
// Redis commands with no timing in them: a fresh PostgreSQL database with the test's own connection to
// it (`probe`: triggers and marks), a private Redis whose every command the node sends passes through
// the test's `wrap` (which may act before the command goes or before the node hears the answer), a
// paid account with credits, and one provider runtime connected.
import { SQL } from "bun";
import { rmSync } from "node:fs";
import { loadConfig } from "../../src/config/index.ts";
import { connectRedis, type ClusterRedis, type RedisResult } from "../../src/cluster/redis.ts";
import { silentLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { spawnProvider, tempDir, type TestGateway } from "./harness.ts";
import { sharedPostgres } from "./postgres.ts";
import { startRedis } from "./redis.ts";

/** Sends one of the node's Redis commands: `send` forwards it and gives Redis's answer. */
export type RedisCallProbe = (command: string, args: (string | number)[], send: () => Promise<RedisResult<unknown>>) => Promise<RedisResult<unknown>>;

export interface ProbedNode {
  gateway: RunningGateway;
  probe: SQL;
  /** The node's Redis client as it is, unwrapped (for the test's own reads). */
  client: ClusterRedis;
  apiKey: string;
  /** A non-streaming chat completion with this user message. */
  ask(content: string, headers?: Record<string, string>): Promise<Response>;
}

export async function probedClusterNode(o: {
  name: string;
  /** Pushed on in start order; the caller runs them in reverse. */
  cleanup: (() => Promise<void> | void)[];
  /** SQL run through `probe` on the migrated database before the node starts. */
  schema: string;
  wrap: (probe: SQL) => RedisCallProbe;
}): Promise<ProbedNode> {
  const { cleanup } = o;
  const redis = await startRedis();
  cleanup.push(() => redis.stop());
  const dataDir = tempDir(`gw-probed-${o.name}-`);
  cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
  const databaseUrl = await (await sharedPostgres()).freshDatabase();
  const probe = new SQL(databaseUrl);
  cleanup.push(() => probe.close());
  await probe.unsafe(o.schema);

  const client = await connectRedis({ url: redis.url, log: silentLog });
  const around = o.wrap(probe);
  const wrapped: ClusterRedis = Object.assign(Object.create(client) as ClusterRedis, {
    call: <T>(command: string, args: (string | number)[]) => around(command, args, () => client.call(command, args)) as Promise<RedisResult<T>>,
    // A fired command goes through the probe too (the client's own `fire` would bypass it).
    fire: (command: string, args: (string | number)[]) => void wrapped.call(command, args),
  });
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  const gateway = await startGateway(
    { ...loaded.config, port: 0, dataDir, logLevel: "error", settlementMode: "observe", databaseUrl, redisUrl: redis.url },
    { log: silentLog, redis: wrapped },
  );
  cleanup.push(() => gateway.stop());
  await gateway.cluster!.ready;
  const { account_id } = await gateway.store.createAccount({ name: o.name, tier: "paid" });
  if (!(await gateway.store.grantCredits(account_id, 100_000)).ok) throw new Error("grant refused");
  const { api_key } = await gateway.store.createApiKey({ account_id });
  const provider = spawnProvider({ wsUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`, dataDir } as TestGateway, { id: `${o.name}-prov` });
  cleanup.push(() => provider.kill());
  await provider.waitForEvent("welcome", () => true, 30_000);
  return {
    gateway,
    probe,
    client,
    apiKey: api_key,
    ask: (content, headers = {}) =>
      fetch(`${gateway.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${api_key}`, "content-type": "application/json", ...headers },
        body: JSON.stringify({ model: "test-model", max_tokens: 4, messages: [{ role: "user", content }] }),
      }),
  };
}
