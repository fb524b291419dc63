// `gateway provider …` (docs/operator.md): flag parsing and wiring of key, engine and runtime.
// Exit codes: 0 ok, 1 runtime failure (e.g. unreadable key file), 64 usage error.
import { totalmem } from "node:os";
import { basename, dirname, extname, join } from "node:path";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { hashWeights } from "../catalog/weights.ts";
import type { ModelEntry } from "../wire/frames.ts";
import { DEFAULT_CATALOG_REFRESH_MS, parsePublicKey } from "./catalogFeed.ts";
import { startProviderWithCatalogFeed } from "./withCatalogFeed.ts";
import { createEarningsLog, earningsPathFor, formatEarnings, readEarnings, summarizeEarnings } from "./earnings.ts";
import type { Engine } from "./engine.ts";
import type { LogFn } from "./events.ts";
import { loadOrCreateProviderKey } from "./keys.ts";
import { ReceiptOutbox } from "./outbox.ts";
import { DEFAULT_WATCHDOG } from "./runtime.ts";
import { createSyntheticEngine, parseSyntheticFault } from "./synthetic.ts";
import { chatCompletionsUrl, createOpenAIEngine, DEFAULT_FIRST_TOKEN_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS } from "./openai/index.ts";
import pkg from "../../package.json";
import { stdoutAtEndOfTurn } from "../log.ts";
import { providerLogLevel } from "./logLevels.ts";
import { resolveUpstreamKey } from "./upstreamKey.ts";
import { checkUpstream, type UpstreamCheck } from "./openai/upstreamCheck.ts";

export const PROVIDER_USAGE = `usage:
  gateway provider --gateway ws(s)://HOST:PORT/v1/provider/connect [--gateway URL2 …] --id ID --key-file F
                   --engine synthetic|openai --model SERVE_ID=HASH_OR_PATH [--model ...]
                   [--max-concurrency N] [--ram-gb N] [--max-context-tokens N]
                   [--synthetic-ttft-ms N] [--synthetic-tokens-per-second N]
                   [--synthetic-fault none|decline|exit-before-first-chunk|stall|exit-after:N|error-after:N|stall-after:N]
                   [--backoff-min-ms N] [--backoff-max-ms N] [--ping-interval-ms N] [--ping-timeout-ms N]
                   [--upstream URL] [--upstream-key-file F | env GATEWAY_UPSTREAM_KEY | --upstream-key KEY]
                   [--upstream-model SERVE_ID=NAME]...
                   [--upstream-first-token-timeout-ms N] [--upstream-idle-timeout-ms N]
                   [--catalog-url URL] [--catalog-pubkey B64] [--catalog-refresh-ms N] [--advertise-uncatalogued]
  gateway provider keygen --key-file F
  gateway provider earnings --key-file F [--json]`;

export interface CommandIo {
  stdout(line: string): void;
  stderr(line: string): void;
  /** Resolves when the runtime should stop; default: the first SIGINT or SIGTERM. */
  until?: Promise<unknown>;
  /** Environment (GATEWAY_UPSTREAM_KEY); default process.env. */
  env?: Record<string, string | undefined>;
}

const processIo: CommandIo = {
  // Lines of one turn in one write: a write per line costs the runtime CPU (docs/benchmarks.md).
  stdout: stdoutAtEndOfTurn,
  stderr: (line) => void process.stderr.write(`${line}\n`),
};

class UsageError extends Error {}
/** A start-up failure that is not a usage error (exit 1), e.g. an unreadable upstream key file. */
class StartupError extends Error {}

const PROVIDER_OPTIONS = {
  gateway: { type: "string", multiple: true },
  id: { type: "string" },
  "key-file": { type: "string" },
  engine: { type: "string" },
  model: { type: "string", multiple: true },
  "max-concurrency": { type: "string" },
  "ram-gb": { type: "string" },
  "max-context-tokens": { type: "string" },
  "synthetic-ttft-ms": { type: "string" },
  "synthetic-tokens-per-second": { type: "string" },
  "synthetic-fault": { type: "string" },
  "backoff-min-ms": { type: "string" },
  "backoff-max-ms": { type: "string" },
  "ping-interval-ms": { type: "string" },
  "ping-timeout-ms": { type: "string" },
  upstream: { type: "string" },
  "upstream-key": { type: "string" },
  "upstream-key-file": { type: "string" },
  "upstream-model": { type: "string", multiple: true },
  "upstream-first-token-timeout-ms": { type: "string" },
  "upstream-idle-timeout-ms": { type: "string" },
  "catalog-url": { type: "string" },
  "catalog-pubkey": { type: "string" },
  "catalog-refresh-ms": { type: "string" },
  "advertise-uncatalogued": { type: "boolean" },
  help: { type: "boolean" },
} as const;

function parse<const O extends NonNullable<ParseArgsConfig["options"]>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options, strict: true as const, allowPositionals: false as const });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

function required(value: string | undefined, flag: string): string {
  if (value === undefined || value === "") throw new UsageError(`--${flag} is required`);
  return value;
}

function numberFlag(
  value: string | undefined,
  flag: string,
  fallback: number,
  min: number,
  max: number,
  integer = true,
): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min || n > max) {
    throw new UsageError(`--${flag} must be ${integer ? "an integer" : "a number"} in ${min}..${max}`);
  }
  return n;
}

/** One `--model`: a hash given as is, or a weights path to hash (docs/catalog.md). */
interface ModelSpec {
  model_id: string;
  hash: string | null;
  path: string | null;
}

/**
 * `SERVE_ID=HASH_OR_PATH`, split on the first `=` because model names may hold `:` and `=`. 64 hex
 * characters are a hash; anything else is a weights path (`./` in front of a file named like a hash).
 */
function parseModels(values: string[] | undefined): ModelSpec[] {
  if (!values || values.length === 0) throw new UsageError("at least one --model SERVE_ID=HASH_OR_PATH is required");
  const specs: ModelSpec[] = [];
  for (const value of values) {
    const at = value.indexOf("=");
    const modelId = at > 0 ? value.slice(0, at) : "";
    const target = at > 0 ? value.slice(at + 1) : "";
    if (modelId === "" || modelId.length > 256 || target === "") {
      throw new UsageError(`--model ${JSON.stringify(value)}: expected SERVE_ID=HASH_OR_PATH`);
    }
    if (specs.some((m) => m.model_id === modelId)) throw new UsageError(`--model ${modelId} given twice`);
    const isHash = /^[0-9a-fA-F]{64}$/.test(target);
    specs.push({ model_id: modelId, hash: isHash ? target.toLowerCase() : null, path: isHash ? null : target });
  }
  return specs;
}

/**
 * The model entries, hashing weights paths with src/catalog's hashWeights (the very code `gateway
 * catalog add --weights` uses, so both sides agree): a directory → snapshot-manifest-v1, a single
 * GGUF file → gguf-file-v1. Weights are streamed, never read whole. Returns an error message or entries.
 */
async function resolveModels(specs: readonly ModelSpec[], maxContextTokens: number, log: LogFn): Promise<ModelEntry[] | string> {
  const models: ModelEntry[] = [];
  for (const spec of specs) {
    let hash = spec.hash;
    if (spec.path !== null) {
      const started = performance.now();
      const result = await hashWeights(spec.path);
      if (!result.ok) return `--model ${spec.model_id}: cannot hash ${spec.path}: ${result.message} (${result.code})`;
      hash = result.model_hash;
      log("model_hashed", {
        model_id: spec.model_id,
        path: spec.path,
        hash_scope: result.hash_scope,
        model_hash: hash,
        files: result.files,
        bytes: result.bytes,
        ms: Math.round(performance.now() - started),
      });
    }
    models.push({ model_id: spec.model_id, model_hash: hash!, max_context_tokens: maxContextTokens });
  }
  return models;
}

function jsonLogger(io: CommandIo): LogFn {
  return (event, fields) => io.stdout(JSON.stringify({ ts: new Date().toISOString(), level: providerLogLevel(event), event, ...fields }));
}

async function keygen(args: string[], io: CommandIo): Promise<number> {
  const { values } = parse(args, { "key-file": { type: "string" } });
  const keyFile = required(values["key-file"], "key-file");
  let key;
  try {
    key = await loadOrCreateProviderKey(keyFile);
  } catch (error) {
    io.stderr(`gateway provider keygen: cannot load key file: ${(error as Error).message}`);
    return 1;
  }
  if (key.insecureMode) io.stderr("warning: the key file is readable by group or others (chmod 600 it)");
  io.stdout(JSON.stringify({ public_key: key.publicKeyBase64 }));
  return 0;
}

/** `gateway provider earnings --key-file F [--json]`: totals of the local earnings log. */
async function earnings(args: string[], io: CommandIo): Promise<number> {
  const { values } = parse(args, { "key-file": { type: "string" }, json: { type: "boolean" } });
  const file = earningsPathFor(required(values["key-file"], "key-file"));
  let read;
  try {
    read = await readEarnings(file);
  } catch (error) {
    io.stderr(`gateway provider earnings: cannot read ${file}: ${(error as NodeJS.ErrnoException).code ?? "error"}`);
    return 1;
  }
  if (read.insecureMode) io.stderr("warning: the earnings log is readable by group or others (chmod 600 it)");
  if (read.malformed > 0) io.stderr(`warning: ${read.malformed} unreadable line(s) in ${file} were skipped`);
  const summary = summarizeEarnings(read.records);
  if (values.json) io.stdout(JSON.stringify({ earnings_file: file, ...summary }));
  else for (const line of formatEarnings(summary, file)) io.stdout(line);
  return 0;
}

type ProviderValues = ReturnType<typeof parse<typeof PROVIDER_OPTIONS>>["values"];

const UPSTREAM_FLAGS = [
  "upstream",
  "upstream-key",
  "upstream-key-file",
  "upstream-model",
  "upstream-first-token-timeout-ms",
  "upstream-idle-timeout-ms",
] as const;
const SYNTHETIC_FLAGS = ["synthetic-ttft-ms", "synthetic-tokens-per-second", "synthetic-fault"] as const;

/** `--upstream-model SERVE_ID=NAME`, split on the first `=` (names hold `:`); every id must be a served model. */
function parseUpstreamModels(values: string[] | undefined, models: readonly ModelEntry[]): Record<string, string> {
  const names: Record<string, string> = {};
  for (const value of values ?? []) {
    const at = value.indexOf("=");
    const serveId = at > 0 ? value.slice(0, at) : "";
    const name = at > 0 ? value.slice(at + 1) : "";
    if (serveId === "" || name === "") throw new UsageError(`--upstream-model ${JSON.stringify(value)}: expected SERVE_ID=NAME`);
    if (!models.some((m) => m.model_id === serveId)) throw new UsageError(`--upstream-model ${serveId}: no --model with that serve id`);
    if (Object.hasOwn(names, serveId)) throw new UsageError(`--upstream-model ${serveId} given twice`);
    names[serveId] = name;
  }
  return names;
}

/** An engine, and for engines in front of a server, the start-up check of that server. */
interface BuiltEngine {
  engine: Engine;
  checkUpstream?: () => Promise<UpstreamCheck>;
}

function buildOpenAIEngine(values: ProviderValues, models: readonly ModelEntry[], log: LogFn, io: CommandIo): BuiltEngine {
  for (const flag of SYNTHETIC_FLAGS) {
    if (values[flag] !== undefined) throw new UsageError(`--${flag} applies to --engine synthetic only`);
  }
  const upstream = required(values.upstream, "upstream");
  if (chatCompletionsUrl(upstream) === null) {
    throw new UsageError("--upstream must be an http:// or https:// URL (the server root, e.g. http://127.0.0.1:8080)");
  }
  const upstreamKey = resolveUpstreamKey(values["upstream-key"], values["upstream-key-file"], io.env ?? process.env);
  if (!upstreamKey.ok) {
    if (upstreamKey.usage) throw new UsageError(upstreamKey.message);
    throw new StartupError(upstreamKey.message);
  }
  if (upstreamKey.insecureFile) {
    const file = values["upstream-key-file"]!;
    log("upstream_key_file_insecure_mode", { key_file: file, fix: `chmod 600 ${file}` });
  }
  if (upstreamKey.source === "flag") {
    log("upstream_key_on_command_line", { hint: "other local users can read --upstream-key in ps; use --upstream-key-file or GATEWAY_UPSTREAM_KEY" });
  }
  const modelNames = parseUpstreamModels(values["upstream-model"], models);
  const engine = createOpenAIEngine({
    upstream,
    apiKey: upstreamKey.key,
    modelNames,
    firstTokenTimeoutMs: numberFlag(
      values["upstream-first-token-timeout-ms"],
      "upstream-first-token-timeout-ms",
      DEFAULT_FIRST_TOKEN_TIMEOUT_MS,
      1,
      3_600_000,
    ),
    idleTimeoutMs: numberFlag(values["upstream-idle-timeout-ms"], "upstream-idle-timeout-ms", DEFAULT_IDLE_TIMEOUT_MS, 1, 3_600_000),
    log,
  });
  const names = models.map((m) => modelNames[m.model_id] ?? m.model_id);
  return { engine, checkUpstream: () => checkUpstream({ upstream, apiKey: upstreamKey.key, modelNames: names }) };
}

function buildEngine(values: ProviderValues, models: readonly ModelEntry[], log: LogFn, io: CommandIo): BuiltEngine {
  const kind = required(values.engine, "engine");
  if (kind === "openai") return buildOpenAIEngine(values, models, log, io);
  if (kind !== "synthetic") {
    throw new UsageError(`--engine must be synthetic or openai, not ${JSON.stringify(kind)}`);
  }
  for (const flag of UPSTREAM_FLAGS) {
    if (values[flag] !== undefined) throw new UsageError(`--${flag} applies to --engine openai only`);
  }
  const faultSpec = values["synthetic-fault"] ?? "none";
  const fault = parseSyntheticFault(faultSpec);
  if (!fault) throw new UsageError(`--synthetic-fault ${JSON.stringify(faultSpec)} is not a known fault`);
  const engine = createSyntheticEngine({
    ttftMs: numberFlag(values["synthetic-ttft-ms"], "synthetic-ttft-ms", 0, 0, 3_600_000),
    tokensPerSecond: numberFlag(
      values["synthetic-tokens-per-second"],
      "synthetic-tokens-per-second",
      200,
      0,
      1e6,
      false,
    ),
    fault,
  });
  return { engine };
}

async function serve(args: string[], io: CommandIo): Promise<number> {
  const { values } = parse(args, PROVIDER_OPTIONS);
  if (values.help) {
    io.stdout(PROVIDER_USAGE);
    return 0;
  }
  // Several --gateway URLs: nodes of one cluster, tried in turn after a dropped connection.
  const gatewayUrls = values.gateway ?? [];
  const gatewayUrl = required(gatewayUrls[0], "gateway");
  for (const url of gatewayUrls) {
    if (!URL.canParse(url) || !/^wss?:$/.test(new URL(url).protocol)) throw new UsageError("--gateway must be a ws:// or wss:// URL");
  }
  const providerId = required(values.id, "id");
  if (!/^[A-Za-z0-9._-]{1,64}$/.test(providerId)) throw new UsageError("--id must match [A-Za-z0-9._-]{1,64}");
  const keyFile = required(values["key-file"], "key-file");
  const maxContextTokens = numberFlag(values["max-context-tokens"], "max-context-tokens", 8192, 1, 1e9);
  const specs = parseModels(values.model);
  // Engines only look at serve ids here (e.g. --upstream-model names); hashes are resolved below.
  const provisional: ModelEntry[] = specs.map((s) => ({ model_id: s.model_id, model_hash: "0".repeat(64), max_context_tokens: maxContextTokens }));
  const log = jsonLogger(io);
  const { engine, checkUpstream: upstreamCheck } = buildEngine(values, provisional, log, io);
  const maxConcurrency = numberFlag(values["max-concurrency"], "max-concurrency", 1, 1, 1024);
  const defaultRamGb = Math.round((totalmem() / 2 ** 30) * 10) / 10;
  const ramGb = numberFlag(values["ram-gb"], "ram-gb", defaultRamGb, 0, 1e6, false);
  const minMs = numberFlag(values["backoff-min-ms"], "backoff-min-ms", 250, 1, 3_600_000);
  const maxMs = numberFlag(values["backoff-max-ms"], "backoff-max-ms", Math.max(30_000, minMs), minMs, 3_600_000);
  const pingIntervalMs = numberFlag(values["ping-interval-ms"], "ping-interval-ms", DEFAULT_WATCHDOG.pingIntervalMs, 10, 600_000);
  const pingTimeoutMs = numberFlag(values["ping-timeout-ms"], "ping-timeout-ms", Math.max(DEFAULT_WATCHDOG.timeoutMs, 3 * pingIntervalMs), pingIntervalMs + 1, 3_600_000);
  const catalogPubkey = values["catalog-pubkey"] !== undefined ? parsePublicKey(values["catalog-pubkey"]) : undefined;
  if (catalogPubkey === null) {
    throw new UsageError("--catalog-pubkey must be the standard base64 of a raw 32-byte Ed25519 key");
  }
  const catalogUrl = values["catalog-url"];
  if (catalogUrl !== undefined && (!URL.canParse(catalogUrl) || !/^https?:$/.test(new URL(catalogUrl).protocol))) {
    throw new UsageError("--catalog-url must be an http:// or https:// URL (the feed, e.g. https://HOST/v1/catalog)");
  }
  const catalogRefreshMs = numberFlag(values["catalog-refresh-ms"], "catalog-refresh-ms", DEFAULT_CATALOG_REFRESH_MS, 10, 86_400_000);

  let key;
  try {
    key = await loadOrCreateProviderKey(keyFile);
  } catch (error) {
    io.stderr(`gateway provider: cannot load key file: ${(error as Error).message}`);
    return 1;
  }
  if (key.created) log("key_created", { key_file: keyFile, public_key: key.publicKeyBase64 });
  if (key.insecureMode) {
    // Reported, not repaired (as for the operator's catalog key): the owner decides, and sees it.
    log("key_file_insecure_mode", { key_file: keyFile, fix: `chmod 600 ${keyFile}` });
    io.stderr("warning: the key file is readable by group or others (chmod 600 it)");
  }

  const resolved = await resolveModels(specs, maxContextTokens, log);
  if (typeof resolved === "string") {
    io.stderr(`gateway provider: ${resolved}`);
    return 1;
  }
  const models = resolved;

  // State kept beside the key file (docs/provider-machines.md). The outbox's snapshot is replaced whole,
  // so it is named after the key file: two identities sharing a folder must not overwrite each other's.
  const outboxFile = join(dirname(keyFile), `${basename(keyFile, extname(keyFile))}.receipts-outbox.json`);
  const outbox = await ReceiptOutbox.load({ file: outboxFile, log });
  const earningsLog = createEarningsLog({ file: earningsPathFor(keyFile), providerId, log });
  const until = io.until ?? firstSignal();
  // The gateway hears of this provider only once its upstream server answers as configured
  // (docs/openai-engine.md, "Start-up check"): until then nothing is advertised.
  if (upstreamCheck) {
    const stopChecking = new AbortController();
    void until.then(() => stopChecking.abort());
    const ready = await untilUpstreamReady(upstreamCheck, { minMs, maxMs }, log, stopChecking.signal);
    if (!ready) {
      log("stopping", { signal: null, before: "upstream_ready" });
      await earningsLog.flushed();
      return 0;
    }
  }
  const provider = await startProviderWithCatalogFeed(
    {
      gatewayUrl,
      moreGatewayUrls: gatewayUrls.slice(1),
      providerId,
      key,
      engine,
      models,
      outbox,
      maxConcurrency,
      hardware: { ram_gb: ramGb },
      runtime: { name: "gateway-provider", version: pkg.version },
      backoff: { minMs, maxMs },
      watchdog: { pingIntervalMs, timeoutMs: pingTimeoutMs },
      log,
      die: () => process.exit(1), // exit faults: the whole provider process dies, as a crash would
    },
    {
      keyFile,
      ...(catalogUrl !== undefined ? { catalogUrl } : {}),
      ...(catalogPubkey !== undefined ? { publicKey: catalogPubkey } : {}),
      allowUncatalogued: values["advertise-uncatalogued"] === true,
      refreshMs: catalogRefreshMs,
    },
  );
  provider.runtime.on("settled", (frame) => void earningsLog.append(frame));
  const modelIds = models.map((m) => m.model_id);
  log("started", { provider_id: providerId, engine: engine.name, models: modelIds, max_concurrency: maxConcurrency });
  const signal = await until;
  log("stopping", { signal: typeof signal === "string" ? signal : null });
  await provider.stop();
  await earningsLog.flushed();
  return 0;
}

/**
 * Checks the upstream until it passes (true) or `stop` fires (false): each failure is logged with what
 * is wrong, and retried after a backoff that doubles from minMs to maxMs. The runtime never exits over it.
 */
async function untilUpstreamReady(check: () => Promise<UpstreamCheck>, backoff: { minMs: number; maxMs: number }, log: LogFn, stop: AbortSignal): Promise<boolean> {
  let delay = backoff.minMs;
  for (let attempt = 1; !stop.aborted; attempt++) {
    const result = await check();
    if (stop.aborted) return false;
    if (result.ok) {
      if (result.lenient.length > 0) log("upstream_model_name_differs", { listed: result.listed.join(", "), sent_as: result.lenient.join(", ") });
      log("upstream_ready", { models_listed: result.listed.length, attempts: attempt });
      return true;
    }
    log("upstream_check_failed", { problem: result.problem, message: result.message, attempt, retry_ms: delay, advertising: "nothing until this passes" });
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, delay);
      stop.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
    });
    delay = Math.min(delay * 2, backoff.maxMs);
  }
  return false;
}

function firstSignal(): Promise<string> {
  return new Promise((resolve) => {
    const on = (signal: string) => {
      process.off("SIGINT", on);
      process.off("SIGTERM", on);
      resolve(signal);
    };
    process.on("SIGINT", on);
    process.on("SIGTERM", on);
  });
}

/** Runs `gateway provider …` (argv after the word `provider`); resolves to the exit code. */
export async function runProviderCommand(argv: string[], io: CommandIo = processIo): Promise<number> {
  try {
    if (argv[0] === "keygen") return await keygen(argv.slice(1), io);
    if (argv[0] === "earnings") return await earnings(argv.slice(1), io);
    return await serve(argv, io);
  } catch (error) {
    if (error instanceof StartupError) {
      io.stderr(`gateway provider: ${error.message}`);
      return 1;
    }
    if (!(error instanceof UsageError)) throw error;
    io.stderr(`gateway provider: ${error.message}`);
    io.stderr(PROVIDER_USAGE);
    return 64;
  }
}
