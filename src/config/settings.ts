// Every gateway setting, once: its config-file key, flag, env name, kind and default (docs/operator.md).
// docs/configuration.md is the reference for operators; a test checks it lists every row here.

export type SettingKind = "string" | "integer" | "boolean" | "enum";

export interface SettingSpec {
  key: string;
  flag: string;
  env: string;
  kind: SettingKind;
  default: string | number | boolean | undefined;
  values?: readonly string[];
  min?: number;
  help: string;
}

const s = (
  key: string,
  kind: SettingKind,
  def: SettingSpec["default"],
  help: string,
  extra: Partial<SettingSpec> = {},
): SettingSpec => ({
  key,
  flag: "--" + key.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase()),
  env: "GATEWAY_" + key.replace(/[A-Z]/g, (c) => "_" + c).toUpperCase(),
  kind,
  default: def,
  help,
  ...extra,
});

export const settingSpecs = [
  s("port", "integer", 8080, "TCP port of the buyer API and the provider WebSocket endpoint (0 = any free port).", { min: 0 }),
  s("host", "string", "127.0.0.1", "Address to listen on."),
  s("dataDir", "string", "./data", "Folder holding the SQLite file, generated keys and the catalog."),
  s("databaseUrl", "string", undefined, "PostgreSQL URL (postgres://USER@HOST:PORT/DB) of a cluster's durable state instead of the SQLite file; needs --redis-url too (docs/postgres-store.md). Prefer the env or config file when it holds a password: flags show in ps."),
  s("demo", "boolean", false, "Start built-in demo providers in-process and print a ready dev API key."),
  s("demoProviders", "integer", 2, "How many demo providers --demo starts.", { min: 1 }),
  s("messagesFacade", "boolean", false, "Serve POST /v1/messages and /v1/messages/count_tokens (off: they answer 404 endpoint_disabled)."),
  s("responsesFacade", "boolean", false, "Serve POST /v1/responses (off: it answers 404 endpoint_disabled)."),
  s("settlementMode", "enum", "enforce", "Settlement mode.", { values: ["observe", "enforce"] }),
  s("keyPrefix", "string", "gw", "Service prefix of API keys (keys look like <prefix>_...)."),
  s("maxBodyBytes", "integer", 512 * 1024, "Largest accepted buyer request body in bytes.", { min: 1024 }),
  s("requestTokenCap", "integer", 4096, "Largest max_tokens one free-tier request may ask for (an absent max_tokens reserves up to it).", { min: 1 }),
  s("maxAttempts", "integer", 3, "Provider attempts per request before giving up (failover before the first byte).", { min: 1 }),
  s("firstByteTimeoutMs", "integer", 30_000, "How long an attempt may take to its first content delta before failover.", { min: 1 }),
  s("streamIdleTimeoutMs", "integer", 60_000, "Silence after a chunk of a running attempt before it counts as failed; checked every half of it, so a stall is detected after more than this and at most 1.5 times this.", { min: 1 }),
  s("requestDeadlineMs", "integer", 300_000, "Longest a whole request may run; sent to providers as deadline_ms.", { min: 1 }),
  s("heartbeatIntervalMs", "integer", 10_000, "Heartbeat interval given to providers; 3 missed intervals evict.", { min: 10 }),
  s("handshakeTimeoutMs", "integer", 10_000, "Time a provider has to complete the handshake.", { min: 10 }),
  s("provisionalAdmissionsPerHour", "integer", 10, "First admissions of never-seen provider ids per hour.", { min: 0 }),
  s("provisionalMaxSessions", "integer", 100, "Provisional provider sessions connected at once.", { min: 0 }),
  s("drainGraceMs", "integer", 30_000, "On SIGTERM, how long in-flight streams may run before the process exits.", { min: 0 }),
  s("inspect", "string", undefined, "Attach the XState inspector at this WebSocket URL (flag without value: ws://127.0.0.1:8090)."),
  s("logLevel", "enum", "info", "Least severe log level written.", { values: ["debug", "info", "warn", "error"] }),
  s("metricsToken", "string", undefined, "When set, GET /metrics needs the header 'Authorization: Bearer TOKEN' with this value (set it by env or config file: flags show in ps)."),
  s("consoleToken", "string", undefined, "The operator console's token (/console; docs/console.md). Default: one generated once and kept in the database, printed by 'gateway console token'. Prefer the env or config file: flags show in ps."),
  s("publicBaseUrl", "string", undefined, "Public base URL buyers' browsers reach the gateway at (https://gw.example.com); sign-up redirect URIs are this + /auth/<idp>/callback. Default http://<host>:<port>."),
  s("oidcProviders", "string", undefined, "Sign-up identity providers: a JSON array of {name, issuer, clientId, clientSecret} (see docs/signup.md). Prefer the env or config file: flags show in ps."),
  s("trustedProxies", "string", undefined, "Comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For names the client (default: none; the socket address is the client)."),
  s("demoSessionsPerHour", "integer", 10, "Browser demo sessions issued per client IP (/32 or /64) per hour.", { min: 0 }),
  s("pendingDeadlineMs", "integer", 300_000, "How long an ended attempt waits for its provider's receipt before it is quarantined (no_receipt).", { min: 1 }),
  s("replayCacheEntries", "integer", 16_384, "Finished results the retry-replay copy keeps in memory at most, besides its 32 MiB of bodies; the oldest go first (docs/quotas.md).", { min: 1 }),
  s("rateCard", "string", undefined, "Rate-card rows besides `default`: a JSON array of {slug, prompt_credits_per_million, completion_credits_per_million} (see docs/ledger.md)."),
  s("freeDailyTokens", "integer", 100_000, "Tokens a free-tier account may use per UTC day (reserved at admission: prompt bound + max_tokens).", { min: 0 }),
  s("demoDailyTokens", "integer", 1_000, "Tokens one demo client IP (/32 or /64) may use per UTC day.", { min: 0 }),
  s("excludedEntrypoints", "string", undefined, "Comma-separated addresses that reach providers outside this gateway's settlement (legacy or direct endpoints), named as excluded in /v1/models' tier1_disclosure."),
  s("freeConcurrentRequests", "integer", 2, "Requests one free-tier account may have running at once (a slot is held until the response ends).", { min: 1 }),
  s("paidDailyTokens", "integer", 0, "Tokens a paid account may use per UTC day; 0 = no daily token limit (the credit balance is the limit).", { min: 0 }),
  s("paidRequestTokenCap", "integer", 4096, "Largest max_tokens one paid-tier request may ask for (an absent max_tokens reserves up to it).", { min: 1 }),
  s("paidConcurrentRequests", "integer", 2, "Requests one paid account may have running at once.", { min: 1 }),
  s("demoRequestTokenCap", "integer", 512, "Largest max_tokens one demo request may ask for (an absent max_tokens reserves up to it).", { min: 1 }),
  s("demoConcurrentRequests", "integer", 2, "Requests one demo client IP (/32 or /64) may have running at once.", { min: 1 }),
  s("feedbackPerHour", "integer", 60, "POST /v1/feedback submissions accepted per client IP (/32 or /64) per hour.", { min: 0 }),
  s("routingPolicy", "enum", "consolidate", "How a provider is chosen among those that can serve: consolidate (the busiest one keeping up, so idle machines can sleep) or shortest_wait (the lowest expected time to first token); docs/routing.md.", { values: ["consolidate", "shortest_wait"] }),
  s("routingSpreadFactor", "integer", 2, "A provider may take at most this multiple of its capacity share of a model's recent dispatches while others can serve (docs/routing.md).", { min: 1 }),
  s("cooldownBaseMs", "integer", 5_000, "Cooldown of a (provider, model) pair after its first failure; doubles with each further failure in a row.", { min: 1 }),
  s("cooldownMaxMs", "integer", 300_000, "Longest cooldown of a (provider, model) pair.", { min: 1 }),
  s("queueWaitMs", "integer", 5_000, "How long a request may wait for a free provider slot before 503 coordinator_unavailable (0 = answer at once).", { min: 0 }),
  s("queueMaxDepth", "integer", 1_000, "Requests that may wait for a slot at once; beyond, 503 coordinator_unavailable at once.", { min: 0 }),
  s("admissionsPerTurn", "integer", 32, "New inference requests whose admission work (auth, reservation, routing, job) may start in one event-loop turn; the rest wait for the next turns, so a burst of new requests does not hold up the frames of live streams (docs/architecture.md). 0 = no limit.", { min: 0 }),
  s("admissionQueueMs", "integer", 0, "Longest a new inference request may wait for its admission turn: past it, it is refused with 503 coordinator_unavailable (retryable), and so is every new one at once while the oldest waiting one is past it (docs/reliability.md); 0 = requests wait as long as it takes.", { min: 0 }),
  s("stickyRouting", "boolean", false, "Route requests tagged with X-Conversation-ID to the provider that served the conversation before, when it can (docs/routing.md)."),
  s("stickyTtlMs", "integer", 600_000, "How long a sticky conversation entry lives without use.", { min: 1_000 }),
  s("hedgeAfterMs", "integer", 0, "Send a hedge (a second attempt to another provider) when an attempt has no first byte after this many ms; 0 = off. With hedgeAdaptive: the earliest a hedge may go.", { min: 0 }),
  s("hedgeAdaptive", "boolean", false, "Hedge at the model's observed p95 time to first byte (once it has 20 samples)."),
  s("hedgeMaxPercent", "integer", 5, "Hedges may be at most this percentage of requests.", { min: 0 }),
  s("redisUrl", "string", undefined, "Redis URL (redis://HOST:PORT) of a cluster: concurrency slots, retry results, the provider registry and node-to-node forwarding live there (docs/scale-out.md)."),
  s("nodeId", "string", undefined, "This node's name in a cluster (default: a random one per process start)."),
  s("clusterLinkHost", "string", "127.0.0.1", "Address of this cluster node's link server, bound and announced to the other nodes: give each node its own address that the others reach (docs/scale-out.md, \"Node links\"). \"off\": no links; frames between nodes go over Redis pub/sub."),
  s("clusterLinkPort", "integer", 0, "TCP port of this cluster node's link server (0 = any free port).", { min: 0 }),
  s("clusterLinkAnnounce", "string", undefined, "Address (host:port) the other cluster nodes dial for this node's link server, when it is not the bound one: a NAT, a container's published port, a TCP proxy. Default: clusterLinkHost and the bound port."),
  s("clusterLeaseMs", "integer", 10_000, "How long a dead cluster node's slots, registry entries and membership outlive it; its buyers' and providers' work is let go within it. A node link on which nothing arrives for this long (pings go every fifth of it) is dropped as broken.", { min: 100 }),
  s("requestBodyTimeoutMs", "integer", 30_000, "Longest a buyer may take to send a request body (after valid credentials) before 408 request_timeout.", { min: 1 }),
  s("streamBufferBytes", "integer", 1024 * 1024, "Bytes of a stream's output that may wait unsent for a buyer that does not read; past it the attempt is cancelled (see docs/reliability.md).", { min: 1024 }),
  s("streamStallMs", "integer", 30_000, "How long a stream's output may wait unsent for a buyer that does not read before the attempt is cancelled.", { min: 1 }),
  s("maxChunkBytesPerToken", "integer", 1024, "Largest content and tool-call bytes a provider chunk may carry per token it claims (a chunk of 0 tokens counts as 1); a bigger chunk closes the session (1008).", { min: 16 }),
  s("receiptFramesPerSecond", "integer", 200, "Receipt frames that settle nothing (duplicates, after the final outcome, unknown attempts) a provider session may send per second on average; past the burst the session is closed (1008).", { min: 1 }),
  s("receiptFrameBurst", "integer", 2000, "Receipt frames that settle nothing a provider session may send at once (an outbox re-sent after a reconnect) before the per-second rate applies.", { min: 1 }),
] as const satisfies readonly SettingSpec[];

export interface GatewayConfig {
  port: number;
  host: string;
  dataDir: string;
  databaseUrl: string | undefined;
  demo: boolean;
  demoProviders: number;
  messagesFacade: boolean;
  responsesFacade: boolean;
  settlementMode: "observe" | "enforce";
  keyPrefix: string;
  maxBodyBytes: number;
  requestTokenCap: number;
  maxAttempts: number;
  firstByteTimeoutMs: number;
  streamIdleTimeoutMs: number;
  requestDeadlineMs: number;
  heartbeatIntervalMs: number;
  handshakeTimeoutMs: number;
  provisionalAdmissionsPerHour: number;
  provisionalMaxSessions: number;
  drainGraceMs: number;
  inspect: string | undefined;
  logLevel: "debug" | "info" | "warn" | "error";
  metricsToken: string | undefined;
  consoleToken: string | undefined;
  publicBaseUrl: string | undefined;
  oidcProviders: string | undefined;
  trustedProxies: string | undefined;
  demoSessionsPerHour: number;
  pendingDeadlineMs: number;
  replayCacheEntries: number;
  rateCard: string | undefined;
  freeDailyTokens: number;
  demoDailyTokens: number;
  excludedEntrypoints: string | undefined;
  freeConcurrentRequests: number;
  paidDailyTokens: number;
  paidRequestTokenCap: number;
  paidConcurrentRequests: number;
  demoRequestTokenCap: number;
  demoConcurrentRequests: number;
  feedbackPerHour: number;
  routingPolicy: "consolidate" | "shortest_wait";
  routingSpreadFactor: number;
  cooldownBaseMs: number;
  cooldownMaxMs: number;
  queueWaitMs: number;
  queueMaxDepth: number;
  admissionsPerTurn: number;
  admissionQueueMs: number;
  stickyRouting: boolean;
  stickyTtlMs: number;
  hedgeAfterMs: number;
  hedgeAdaptive: boolean;
  hedgeMaxPercent: number;
  redisUrl: string | undefined;
  nodeId: string | undefined;
  clusterLinkHost: string;
  clusterLinkPort: number;
  clusterLinkAnnounce?: string;
  clusterLeaseMs: number;
  requestBodyTimeoutMs: number;
  streamBufferBytes: number;
  streamStallMs: number;
  maxChunkBytesPerToken: number;
  receiptFramesPerSecond: number;
  receiptFrameBurst: number;
}

export const DEFAULT_INSPECT_URL = "ws://127.0.0.1:8090";
