// Gateway configuration: defaults < --config FILE (JSON or JSONC) < environment < flags (docs/operator.md).
// The only module that reads process.env for the gateway.
import { readFileSync } from "node:fs";
import { DEFAULT_INSPECT_URL, settingSpecs, type GatewayConfig, type SettingSpec } from "./settings.ts";

export { settingSpecs, DEFAULT_INSPECT_URL, type GatewayConfig } from "./settings.ts";

export type ConfigResult = { ok: true; config: GatewayConfig } | { ok: false; message: string };

type Raw = Record<string, unknown>;

function coerce(spec: SettingSpec, value: unknown, source: string): { ok: true; value: unknown } | { ok: false; message: string } {
  const bad = (why: string) => ({ ok: false as const, message: `${source}: ${why}` });
  switch (spec.kind) {
    case "boolean":
      if (typeof value === "boolean") return { ok: true, value };
      if (value === "true" || value === "1") return { ok: true, value: true };
      if (value === "false" || value === "0") return { ok: true, value: false };
      return bad("expected true or false");
    case "integer": {
      const n = typeof value === "number" ? value : typeof value === "string" && /^-?\d+$/.test(value) ? Number(value) : NaN;
      if (!Number.isSafeInteger(n)) return bad("expected an integer");
      if (spec.min !== undefined && n < spec.min) return bad(`must be at least ${spec.min}`);
      return { ok: true, value: n };
    }
    case "enum":
      if (typeof value === "string" && spec.values?.includes(value)) return { ok: true, value };
      return bad(`expected one of ${spec.values?.join(", ")}`);
    case "string":
      if (typeof value === "string" && value.length > 0) return { ok: true, value };
      return bad("expected a non-empty string");
  }
}

/** Splits `serve` argv into setting values by flag; `--config` is returned separately. */
function parseFlags(argv: readonly string[]): { ok: true; flags: Raw; configFile?: string } | { ok: false; message: string } {
  const byFlag = new Map<string, SettingSpec>(settingSpecs.map((spec) => [spec.flag, spec]));
  const flags: Raw = {};
  let configFile: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf("=");
    const name = eq >= 0 ? arg.slice(0, eq) : arg;
    const inline = eq >= 0 ? arg.slice(eq + 1) : undefined;
    if (name === "--config") {
      configFile = inline ?? argv[++i];
      if (!configFile) return { ok: false, message: "--config needs a file" };
      continue;
    }
    const spec = byFlag.get(name);
    if (!spec) return { ok: false, message: `unknown option ${name}` };
    if (spec.kind === "boolean") flags[spec.key] = inline ?? true;
    else if (spec.key === "inspect" && inline === undefined && (argv[i + 1] ?? "--").startsWith("--")) flags[spec.key] = DEFAULT_INSPECT_URL;
    else {
      const value = inline ?? argv[++i];
      if (value === undefined) return { ok: false, message: `${name} needs a value` };
      flags[spec.key] = value;
    }
  }
  return { ok: true, flags, configFile };
}

/** Resolves the configuration of `gateway serve` from its argv, the environment and an optional JSON file. */
export function loadConfig(argv: readonly string[], env: Record<string, string | undefined> = process.env): ConfigResult {
  const parsed = parseFlags(argv);
  if (!parsed.ok) return parsed;
  const configFile = parsed.configFile ?? env.GATEWAY_CONFIG;
  let fileValues: Raw = {};
  if (configFile) {
    try {
      // JSONC: plain JSON, or JSON with comments and trailing commas (deploy/gateway.jsonc).
      const json: unknown = Bun.JSONC.parse(readFileSync(configFile, "utf8"));
      if (typeof json !== "object" || json === null || Array.isArray(json)) return { ok: false, message: `${configFile}: expected a JSON object` };
      fileValues = json as Raw;
    } catch (e) {
      return { ok: false, message: `${configFile}: ${(e as Error).message}` };
    }
    const known = new Set<string>(settingSpecs.map((spec) => spec.key));
    const unknown = Object.keys(fileValues).find((k) => !known.has(k));
    if (unknown) return { ok: false, message: `${configFile}: unknown setting ${unknown}` };
  }
  const config: Raw = {};
  for (const spec of settingSpecs) {
    let value: unknown = spec.default;
    const layers: [unknown, string][] = [
      [fileValues[spec.key], `${configFile} ${spec.key}`],
      [env[spec.env] === "" ? undefined : env[spec.env], spec.env],
      [parsed.flags[spec.key], spec.flag],
    ];
    for (const [raw, source] of layers) {
      if (raw === undefined) continue;
      const c = coerce(spec, raw, source);
      if (!c.ok) return c;
      value = c.value;
    }
    config[spec.key] = value;
  }
  const backends = backendProblem(config.databaseUrl as string | undefined, config.redisUrl as string | undefined);
  if (backends !== null) return { ok: false, message: backends };
  return { ok: true, config: config as unknown as GatewayConfig };
}

/**
 * A cluster node needs both engines: PostgreSQL for what is durable, Redis for what is shared and live
 * (docs/postgres-store.md). Neither is the embedded single node; one alone is a configuration error.
 */
export function backendProblem(databaseUrl: string | undefined, redisUrl: string | undefined): string | null {
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    return "--database-url must be a postgres:// or postgresql:// URL";
  }
  if (redisUrl !== undefined && !/^rediss?:\/\//.test(redisUrl)) return "--redis-url must be a redis:// or rediss:// URL";
  if ((databaseUrl === undefined) !== (redisUrl === undefined)) {
    const given = databaseUrl === undefined ? "--redis-url (GATEWAY_REDIS_URL)" : "--database-url (GATEWAY_DATABASE_URL)";
    const missing = databaseUrl === undefined ? "--database-url (GATEWAY_DATABASE_URL)" : "--redis-url (GATEWAY_REDIS_URL)";
    return `${given} is set but ${missing} is not: a cluster node needs both (PostgreSQL for durable state, Redis for live shared state); set neither for the embedded single node`;
  }
  return null;
}

/** A setting's default as `serve --help` shows it. */
function shownDefault(spec: SettingSpec): string {
  if (spec.default === undefined) return spec.key === "inspect" ? "off" : "none";
  return String(spec.default);
}

export function configUsage(): string {
  const lines = settingSpecs.map((spec) => `  ${spec.flag.padEnd(34)} ${spec.help} (default: ${shownDefault(spec)}) [env ${spec.env}]`);
  return [
    "usage: gateway serve [--config FILE] [options]",
    "Each option also reads from GATEWAY_<NAME> and from the config file's key of the same name (docs/configuration.md).",
    ...lines,
  ].join("\n");
}
