// `gateway catalog init|add|remove|show|sign|history|pubkey` (docs/operator.md, docs/catalog.md). Exit codes as the other
// operator commands: 0 done, 1 the operation failed, 64 usage error. JSON on stdout; messages on
// stderr. Invariant: the operator's private key is never written to stdout or stderr.
import { randomBytes as cryptoRandomBytes } from "node:crypto";
import { parseFlags, type FlagSpec, type ParseResult } from "../cli/flags.ts";
import type { OperatorContext } from "../cli/operator.ts";
import { isExpiredAt, type RandomBytes } from "./feed.ts";
import { historyLine } from "./history.ts";
import { loadOperatorKey, operatorKeyPath, type OperatorKey } from "./keys.ts";
import { changeCatalog, ensureCatalog, setUpOperatorKey, type CatalogWriter } from "./operations.ts";
import { catalogModelChecker, HASH_SCOPES, type CatalogModel, type HashScope } from "./schema.ts";
import { addModel, removeModel, type CatalogState } from "./state.ts";
import { hashWeights } from "./weights.ts";

export interface CatalogCliContext extends OperatorContext {
  dataDir: string;
  now?: () => number;
  random?: RandomBytes;
}

const EXIT_OK = 0;
const EXIT_FAILURE = 1;
const EXIT_USAGE = 64;

const DAY_MS = 24 * 60 * 60 * 1000;
const MAX_VALID_DAYS = 3650;

const USAGE = [
  "usage: gateway catalog init [--valid-days N]",
  "       gateway catalog add --model-id ID (--model-hash HEX | --weights PATH) [--hash-scope S]",
  "                           [--min-ram-gb N] [--rate-card-row SLUG] [--tools] [--structured-output]",
  "                           [--replace] [--valid-days N]",
  "       gateway catalog remove --model-id ID [--valid-days N]",
  "       gateway catalog sign [--valid-days N]",
  "       gateway catalog show [--json]",
  "       gateway catalog history [--json]",
  "       gateway catalog pubkey",
  `hash scopes: ${HASH_SCOPES.join(", ")}; feeds are valid 30 days unless --valid-days says otherwise`,
];

type Sub = (argv: readonly string[], ctx: Required<CatalogCliContext>) => Promise<number> | number;

/** Runs `gateway catalog …`; `argv` starts after the word `catalog`. */
export async function runCatalogCommand(argv: readonly string[], context: CatalogCliContext): Promise<number> {
  const ctx: Required<CatalogCliContext> = { now: Date.now, random: cryptoRandomBytes, changed: () => {}, ...context };
  const [word, ...rest] = argv;
  if (word === "help" || word === "--help" || word === "-h") {
    USAGE.forEach((line) => ctx.stdout(line));
    return EXIT_OK;
  }
  const subs: Record<string, Sub> = { init, add, remove, sign, show, history, pubkey };
  const run = word !== undefined && Object.hasOwn(subs, word) ? subs[word] : undefined;
  if (run === undefined) return usageError(ctx, word === undefined ? "missing subcommand" : `unknown subcommand ${word}`);
  try {
    const code = await run(rest, ctx);
    // Every change but the read-only ones signs a new catalog: a cluster's nodes reload it at once.
    if (code === EXIT_OK && (word === "init" || word === "add" || word === "remove" || word === "sign")) ctx.changed({ kind: "catalog_signed" });
    return code;
  } catch (error) {
    // Store failures (e.g. a lock held past busy_timeout) are reported, not thrown. No key material
    // reaches here: key errors are values with messages naming only the file.
    ctx.stderr(`error: ${error instanceof Error ? error.message : String(error)}`);
    return EXIT_FAILURE;
  }
}

function usageError(ctx: CatalogCliContext, message: string): number {
  ctx.stderr(`error: ${message}`);
  USAGE.forEach((line) => ctx.stderr(line));
  return EXIT_USAGE;
}

function failure(ctx: CatalogCliContext, message: string): number {
  ctx.stderr(`error: ${message}`);
  return EXIT_FAILURE;
}

function parse<const S extends FlagSpec>(argv: readonly string[], spec: S, ctx: CatalogCliContext): Extract<ParseResult<S>, { ok: true }> | number {
  const parsed = parseFlags(argv, spec);
  if (!parsed.ok) return usageError(ctx, parsed.message);
  if (parsed.positionals.length > 0) return usageError(ctx, `unexpected argument ${parsed.positionals[0]}`);
  return parsed;
}

/** --valid-days as milliseconds (undefined = the default validity), or the usage error's exit code. */
function validFor(ctx: CatalogCliContext, text: string | undefined): { ok: true; ms: number | undefined } | { ok: false; exit: number } {
  if (text === undefined) return { ok: true, ms: undefined };
  if (!/^[0-9]{1,4}$/.test(text) || Number(text) < 1 || Number(text) > MAX_VALID_DAYS) {
    return { ok: false, exit: usageError(ctx, `--valid-days must be a whole number from 1 to ${MAX_VALID_DAYS}`) };
  }
  return { ok: true, ms: Number(text) * DAY_MS };
}

function summary(state: CatalogState) {
  return {
    seq: state.seq,
    catalog_id: state.catalog_id,
    catalog_body_digest: state.body_digest,
    issued_at: state.body.issued_at,
    expires_at: state.body.expires_at,
    model_count: state.body.models.length,
  };
}

function withKey(ctx: Required<CatalogCliContext>): { ok: true; key: OperatorKey } | { ok: false; exit: number } {
  const loaded = loadOperatorKey(ctx.dataDir);
  if (!loaded.ok) return { ok: false, exit: failure(ctx, loaded.message) };
  warnInsecure(ctx, loaded.key);
  return { ok: true, key: loaded.key };
}

function warnInsecure(ctx: CatalogCliContext, key: OperatorKey): void {
  if (key.insecureMode) ctx.stderr(`warning: ${operatorKeyPath(ctx.dataDir)} is readable by other users; chmod 600 it`);
}

const writer = (ctx: Required<CatalogCliContext>, key: OperatorKey): CatalogWriter => ({
  store: ctx.store,
  key,
  dataDir: ctx.dataDir,
  now: ctx.now,
  random: ctx.random,
});

// ── init ─────────────────────────────────────────────────────────────────────────────────────────

const init: Sub = async (argv, ctx) => {
  const p = parse(argv, { "valid-days": { kind: "string" } }, ctx);
  if (typeof p === "number") return p;
  const valid = validFor(ctx, p.flags["valid-days"]);
  if (!valid.ok) return valid.exit;
  const loaded = await setUpOperatorKey(ctx.dataDir, ctx.store);
  if (!loaded.ok) return failure(ctx, loaded.message);
  warnInsecure(ctx, loaded.key);
  const result = await ensureCatalog(writer(ctx, loaded.key), { valid_for_ms: valid.ms });
  if (!result.ok) return failure(ctx, result.message);
  ctx.stdout(
    JSON.stringify({
      public_key: loaded.key.publicKeyBase64,
      key_created: loaded.created,
      catalog_created: result.changed,
      ...summary(result.state),
    }),
  );
  return EXIT_OK;
};

// ── add / remove / sign ──────────────────────────────────────────────────────────────────────────

const ADD_FLAGS = {
  "model-id": { kind: "string" },
  "model-hash": { kind: "string" },
  weights: { kind: "string" },
  "hash-scope": { kind: "string" },
  "min-ram-gb": { kind: "string" },
  "rate-card-row": { kind: "string" },
  tools: { kind: "boolean" },
  "structured-output": { kind: "boolean" },
  replace: { kind: "boolean" },
  "valid-days": { kind: "string" },
} as const satisfies FlagSpec;

const isHashScope = (s: string): s is HashScope => (HASH_SCOPES as readonly string[]).includes(s);

const add: Sub = async (argv, ctx) => {
  const p = parse(argv, ADD_FLAGS, ctx);
  if (typeof p === "number") return p;
  const f = p.flags;
  const valid = validFor(ctx, f["valid-days"]);
  if (!valid.ok) return valid.exit;
  if (f["model-id"] === undefined) return usageError(ctx, "--model-id is required");
  if ((f["model-hash"] === undefined) === (f.weights === undefined)) return usageError(ctx, "give exactly one of --model-hash and --weights");
  const scopeFlag = f["hash-scope"];
  if (scopeFlag !== undefined && !isHashScope(scopeFlag)) return usageError(ctx, `--hash-scope must be one of ${HASH_SCOPES.join(", ")}`);
  const ram = f["min-ram-gb"] ?? "0";
  if (!/^[0-9]{1,5}$/.test(ram)) return usageError(ctx, "--min-ram-gb must be a whole number of GB");

  // Key first: hashing many GB of weights only to learn the data dir is not initialised wastes minutes.
  const keyed = withKey(ctx);
  if (!keyed.ok) return keyed.exit;

  let model_hash: string;
  let hash_scope: HashScope;
  if (f.weights !== undefined) {
    const hashed = await hashWeights(f.weights);
    if (!hashed.ok) return failure(ctx, `cannot hash weights (${hashed.code}): ${hashed.message}`);
    if (scopeFlag !== undefined && scopeFlag !== hashed.hash_scope) {
      return usageError(ctx, `--weights ${f.weights} hashes as ${hashed.hash_scope}, not ${scopeFlag}`);
    }
    model_hash = hashed.model_hash;
    hash_scope = hashed.hash_scope;
  } else {
    model_hash = f["model-hash"]!.toLowerCase();
    if (!/^[0-9a-f]{64}$/.test(model_hash)) return usageError(ctx, "--model-hash must be 64 hex characters (SHA-256)");
    // A bare hash is most often `sha256sum model.gguf`, so that is the default scope.
    hash_scope = scopeFlag ?? "gguf-file-v1";
  }
  const model: CatalogModel = {
    model_id: f["model-id"],
    model_hash,
    hash_scope,
    min_ram_gb: Number(ram),
    rate_card_row: f["rate-card-row"] ?? "default",
    capabilities: { tools: f.tools, structured_output: f["structured-output"] },
  };
  if (!catalogModelChecker.Check(model)) {
    const first = catalogModelChecker.Errors(model).First();
    return usageError(ctx, `invalid catalog entry${first ? ` (${first.path.slice(1)}: ${first.message})` : ""}`);
  }
  const result = await changeCatalog(writer(ctx, keyed.key), (models) => addModel(models, model, f.replace), { valid_for_ms: valid.ms });
  if (!result.ok) return failure(ctx, result.message);
  ctx.stdout(JSON.stringify({ action: result.changed ? "added" : "unchanged", model, ...summary(result.state) }));
  return EXIT_OK;
};

const remove: Sub = async (argv, ctx) => {
  const p = parse(argv, { "model-id": { kind: "string" }, "valid-days": { kind: "string" } }, ctx);
  if (typeof p === "number") return p;
  const valid = validFor(ctx, p.flags["valid-days"]);
  if (!valid.ok) return valid.exit;
  const model_id = p.flags["model-id"];
  if (model_id === undefined) return usageError(ctx, "--model-id is required");
  const keyed = withKey(ctx);
  if (!keyed.ok) return keyed.exit;
  const result = await changeCatalog(writer(ctx, keyed.key), (models) => removeModel(models, model_id), { valid_for_ms: valid.ms });
  if (!result.ok) return failure(ctx, result.message);
  ctx.stdout(JSON.stringify({ action: "removed", model_id, ...summary(result.state) }));
  return EXIT_OK;
};

const sign: Sub = async (argv, ctx) => {
  const p = parse(argv, { "valid-days": { kind: "string" } }, ctx);
  if (typeof p === "number") return p;
  const valid = validFor(ctx, p.flags["valid-days"]);
  if (!valid.ok) return valid.exit;
  const keyed = withKey(ctx);
  if (!keyed.ok) return keyed.exit;
  if ((await ctx.store.latestCatalog()) === null) return failure(ctx, "no catalog yet; run gateway catalog init");
  const result = await changeCatalog(writer(ctx, keyed.key), (models) => ({ ok: true, models: [...models], changed: false }), {
    valid_for_ms: valid.ms,
    force: true,
  });
  if (!result.ok) return failure(ctx, result.message);
  ctx.stdout(JSON.stringify({ action: "signed", ...summary(result.state) }));
  return EXIT_OK;
};

// ── show / history / pubkey (read-only: no private key needed) ────────────────────────────────────

const show: Sub = async (argv, ctx) => {
  const p = parse(argv, { json: { kind: "boolean" } }, ctx);
  if (typeof p === "number") return p;
  const entry = await ctx.store.latestCatalog();
  if (entry === null) return failure(ctx, "no catalog yet; run gateway catalog init");
  const line = historyLine(entry);
  const body = JSON.parse(line.body) as { models: CatalogModel[] };
  const expired = isExpiredAt(entry.expires_at_ms, ctx.now());
  if (p.flags.json) {
    const { body: _exact, ...meta } = line;
    ctx.stdout(JSON.stringify({ ...meta, expired, models: body.models }));
    return EXIT_OK;
  }
  ctx.stdout(`catalog ${line.catalog_id} (seq ${line.seq})${expired ? "  EXPIRED: run gateway catalog sign" : ""}`);
  ctx.stdout(`issued ${line.issued_at}  expires ${line.expires_at}  accepted ${line.accepted_at}`);
  ctx.stdout(`digest ${line.catalog_body_digest}`);
  ctx.stdout(`operator key ${line.public_key}`);
  const header = ["MODEL_ID", "HASH_SCOPE", "MODEL_HASH", "MIN_RAM_GB", "RATE_CARD_ROW", "CAPABILITIES"];
  const rows = body.models.map((m) => [
    m.model_id,
    m.hash_scope,
    m.model_hash,
    String(m.min_ram_gb),
    m.rate_card_row,
    [m.capabilities.tools ? "tools" : "", m.capabilities.structured_output ? "structured_output" : ""].filter(Boolean).join(",") || "-",
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  for (const row of [header, ...rows]) ctx.stdout(row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i]!))).join("  "));
  return EXIT_OK;
};

const history: Sub = async (argv, ctx) => {
  const p = parse(argv, { json: { kind: "boolean" } }, ctx);
  if (typeof p === "number") return p;
  for (const entry of await ctx.store.listCatalogHistory()) {
    const line = historyLine(entry);
    if (p.flags.json) ctx.stdout(JSON.stringify(line));
    else {
      const models = (JSON.parse(line.body) as { models: unknown[] }).models.length;
      ctx.stdout(`${line.seq}  ${line.catalog_id}  issued ${line.issued_at}  expires ${line.expires_at}  ${models} models  digest ${line.catalog_body_digest}`);
    }
  }
  return EXIT_OK;
};

const pubkey: Sub = (argv, ctx) => {
  const p = parse(argv, {}, ctx);
  if (typeof p === "number") return p;
  const keyed = withKey(ctx);
  if (!keyed.ok) return keyed.exit;
  ctx.stdout(JSON.stringify({ public_key: keyed.key.publicKeyBase64 }));
  return EXIT_OK;
};
