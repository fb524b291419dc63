// `gateway serve`: configuration, the gateway, the optional demo providers, and signal handling.
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { configUsage, loadConfig, type GatewayConfig } from "./config/index.ts";
import { inspectorUrlProblem, startInspector } from "./inspect.ts";
import { createLog, type Log, type LogFields } from "./log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "./compositionRoot.ts";
import { loadOrCreateProviderKey } from "./provider/keys.ts";
import { startProviderWithCatalogFeed, type CatalogProvider } from "./provider/withCatalogFeed.ts";
import { createSyntheticEngine } from "./provider/synthetic.ts";
import type { AsyncStore as Store } from "./store/asyncStore.ts";
import type { CatalogModel } from "./catalog/index.ts";
import { connectRedis, type ClusterRedis } from "./cluster/redis.ts";

/** The demo's models: synthetic engines, with stand-in hashes derived from their names. */
export const DEMO_MODELS = ["demo-chat", "demo-chat-fast"].map((model_id) => ({
  model_id,
  model_hash: createHash("sha256").update(`synthetic-weights:${model_id}`).digest("hex"),
  max_context_tokens: 8192,
}));

/** The demo's models as signed catalog entries, so they route and settle in enforce mode. */
const DEMO_CATALOG_MODELS: CatalogModel[] = DEMO_MODELS.map((m) => ({
  model_id: m.model_id,
  model_hash: m.model_hash,
  hash_scope: "gguf-file-v1",
  min_ram_gb: 0,
  rate_card_row: "default",
  capabilities: { tools: true, structured_output: true },
}));

const DEMO_KEY_LABEL = "demo-dev-key";
/** The demo's dev key in plain text, so a restart on the same data folder prints the same key. */
const DEMO_KEY_FILE = "demo-dev-key";

/**
 * The demo account's dev key: the one saved in the data folder while it still works, else a new one
 * (saved 0600; earlier demo keys are revoked so only the printed one works). Demo data only: a real
 * gateway never keeps a key in plain text.
 */
async function demoApiKey(store: Store, dataDir: string): Promise<string> {
  const file = join(dataDir, DEMO_KEY_FILE);
  const saved = existsSync(file) ? readFileSync(file, "utf8").trim() : "";
  if (saved !== "" && (await store.authenticateApiKey(saved))?.tier === "free") return saved;
  let account = (await store.listAccounts()).find((a) => a.name === "demo-dev");
  account ??= { ...(await store.createAccount({ name: "demo-dev", tier: "free" })), name: "demo-dev", tier: "free", created_at_ms: 0 };
  for (const key of await store.listApiKeys(account.account_id)) {
    if (key.label === DEMO_KEY_LABEL && key.revoked_at_ms === null) await store.revokeApiKey(key.key_id);
  }
  const apiKey = (await store.createApiKey({ account_id: account.account_id, label: DEMO_KEY_LABEL })).api_key;
  writeFileSync(file, `${apiKey}\n`, { mode: 0o600 });
  return apiKey;
}

/**
 * Demo providers: real runtimes over real loopback WebSockets, inside this process, behind the same
 * catalog-feed path as `gateway provider` (fetch, verify, pin on first use, advertise what it lists).
 */
async function startDemoProviders(config: GatewayConfig, gateway: RunningGateway, log: Log): Promise<CatalogProvider[]> {
  const providers: CatalogProvider[] = [];
  for (let i = 1; i <= config.demoProviders; i++) {
    const providerId = `demo-provider-${i}`;
    const keyFile = join(config.dataDir, "demo-providers", `${providerId}.key`);
    const key = await loadOrCreateProviderKey(keyFile);
    providers.push(
      await startProviderWithCatalogFeed(
        {
          gatewayUrl: `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`,
          providerId,
          key,
          engine: createSyntheticEngine({ ttftMs: 150, tokensPerSecond: 40 }),
          models: DEMO_MODELS,
          maxConcurrency: 4,
          hardware: { ram_gb: 16, chip: "synthetic" },
          log: (event, fields) => demoLog(log, event, { provider_id: providerId, ...fields }),
        },
        { keyFile },
      ),
    );
  }
  return providers;
}

/** Demo runtimes log at debug, except what an operator must see: a catalog feed they refused. */
const DEMO_WARNINGS = new Set(["catalog_refused", "catalog_rollback_refused", "catalog_key_mismatch", "catalog_highest_unreadable", "catalog_highest_write_failed"]);
function demoLog(log: Log, event: string, fields: Record<string, unknown>): void {
  const line = fields as LogFields; // the gateway log writes arrays and objects as JSON too
  if (DEMO_WARNINGS.has(event)) log.warn(`demo_provider.${event}`, line);
  else log.debug(`demo_provider.${event}`, line);
}

export async function runServe(argv: string[]): Promise<number> {
  const loaded = loadConfig(argv);
  if (!loaded.ok) {
    console.error(`gateway serve: ${loaded.message}\n\n${configUsage()}`);
    return 64;
  }
  const config = loaded.config;
  const log = createLog(config.logLevel);
  const inspectProblem = config.inspect === undefined ? null : inspectorUrlProblem(config.inspect, config);
  if (inspectProblem) {
    console.error(`gateway serve: ${inspectProblem}`);
    return 64;
  }
  const inspector = config.inspect === undefined ? null : startInspector(config.inspect, { log });
  // A cluster node starts even while Redis is unreachable: it answers 503 until Redis is back.
  const redis: ClusterRedis | undefined = config.redisUrl ? await connectRedis({ url: config.redisUrl, log }) : undefined;
  let gateway: RunningGateway;
  try {
    gateway = await startGateway(config, { log, inspect: inspector?.inspect, catalogModels: config.demo ? DEMO_CATALOG_MODELS : undefined, redis });
  } catch (error) {
    console.error(`gateway serve: ${(error as Error).message}`);
    inspector?.stop();
    redis?.close();
    return 1;
  }
  await gateway.cluster?.ready.catch((error) => log.warn("cluster_join_failed", { error: String(error) }));
  // After gateway_listening, the first line: every line of the log is one JSON object of one format.
  if (inspector) log.info("inspector_attached", { url: config.inspect!, relay: "bun run inspect:relay (docs/inspector.md)" });
  const demo: CatalogProvider[] = [];
  // Signal handlers before anything is printed: a SIGTERM right after the banner must drain, not kill.
  const done = new Promise<number>((resolve) => {
    let stopping = false;
    const shutdown = async (signal: string) => {
      if (stopping) return;
      stopping = true;
      log.info("gateway_draining", { signal });
      await gateway.drain();
      await Promise.all(demo.map((r) => r.stop()));
      await gateway.stop();
      inspector?.stop();
      log.info("gateway_stopped", {});
      resolve(0);
    };
    process.on("SIGTERM", () => void shutdown("SIGTERM"));
    process.on("SIGINT", () => void shutdown("SIGINT"));
  });
  if (config.demo) {
    demo.push(...(await startDemoProviders(config, gateway, log)));
    const apiKey = await demoApiKey(gateway.store, config.dataDir);
    const base = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${gateway.port}`;
    console.error(
      [
        "",
        `Demo gateway ready on ${base}  (models: ${DEMO_MODELS.map((m) => m.model_id).join(", ")}; synthetic text, not a real model)`,
        `Data: ${resolve(config.dataDir)}  (database, keys, catalog; the same folder keeps the same dev key; delete it to start over)`,
        `Dev API key: ${apiKey}`,
        "For the SDK examples in the README:",
        `  export GATEWAY_API_KEY=${apiKey}`,
        `  export OPENAI_BASE_URL=${base}/v1`,
        "Try:",
        `  curl -s ${base}/v1/chat/completions -H "Authorization: Bearer ${apiKey}" -H "Content-Type: application/json" \\`,
        `    -d '{"model":"demo-chat","messages":[{"role":"user","content":"Hello!"}],"stream":true}'`,
        `Browser demo: ${base}/demo   API reference: ${base}/docs`,
        "",
      ].join("\n"),
    );
  }
  return done;
}
