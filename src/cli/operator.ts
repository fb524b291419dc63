// Operator subcommands `gateway accounts|keys|providers …` (docs/operator.md). Each returns an exit code:
// 0 done, 1 the operation failed (unknown id, store error), 64 usage error (EX_USAGE).
// JSON goes to stdout where a program reads it; messages and usage go to stderr.

import type { AsyncStore } from "../store/asyncStore.ts";
import type { ProviderBinding, AccountTier } from "../store/index.ts";
import { backupDatabase } from "../store/backup.ts";
import { parseFlags, type FlagSpec, type ParseResult } from "./flags.ts";
import type { ChangeMessage } from "../cluster/messages.ts";

export interface OperatorContext {
  store: AsyncStore;
  stdout: (line: string) => void;
  stderr: (line: string) => void;
  /** A change every running gateway node must apply at once (announced to a cluster, docs/scale-out.md). */
  changed?: (change: ChangeMessage) => void;
  /** Clock for "today" (default Date.now). */
  now?: () => number;
}

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 64;

/** docs/protocol.md: provider ids on the wire and on the command line. */
const PROVIDER_ID = /^[A-Za-z0-9._-]{1,64}$/;

const ACCOUNTS_USAGE = [
  "usage: gateway accounts create [--tier free|paid] [--name N] [--env]",
  "       gateway accounts list [--json]",
  "       gateway accounts set-tier ACCOUNT_ID --tier free|paid",
];
const KEYS_USAGE = [
  "usage: gateway keys create --account ID [--label L]",
  "       gateway keys revoke KEY_ID",
  "       gateway keys list [--account ID] [--json]",
];
const PROVIDERS_USAGE = [
  "usage: gateway providers pin ID --public-key B64",
  "       gateway providers unpin ID",
  "       gateway providers ban ID",
  "       gateway providers unban ID",
  "       gateway providers list [--json]",
];

const CREDITS_USAGE = [
  "usage: gateway credits grant --account ID --credits N [--memo TEXT]",
  "       gateway credits balance --account ID",
];

const FEEDBACK_USAGE = ["usage: gateway feedback list [--account ID] [--limit N] [--json]"];

type Subcommand = (argv: readonly string[], ctx: OperatorContext, usage: readonly string[]) => Promise<number>;

/** Runs `gateway accounts …`; `argv` starts after the word `accounts`. */
export function runAccountsCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  return dispatch(argv, ctx, ACCOUNTS_USAGE, { create: accountsCreate, list: accountsList, "set-tier": accountsSetTier });
}

/** Runs `gateway keys …`; `argv` starts after the word `keys`. */
export function runKeysCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  return dispatch(argv, ctx, KEYS_USAGE, { create: keysCreate, revoke: keysRevoke, list: keysList });
}

/** Runs `gateway providers …`; `argv` starts after the word `providers`. */
export function runProvidersCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  return dispatch(argv, ctx, PROVIDERS_USAGE, {
    pin: providersPin,
    unpin: providersUnpin,
    ban: providersBan,
    unban: providersUnban,
    list: providersList,
  });
}

/** Runs `gateway credits …`; `argv` starts after the word `credits`. */
export function runCreditsCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  return dispatch(argv, ctx, CREDITS_USAGE, { grant: creditsGrant, balance: creditsBalance });
}

/** Runs `gateway feedback …`; `argv` starts after the word `feedback`. */
export function runFeedbackCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  return dispatch(argv, ctx, FEEDBACK_USAGE, { list: feedbackList });
}

async function dispatch(
  argv: readonly string[],
  ctx: OperatorContext,
  usage: readonly string[],
  subcommands: Record<string, Subcommand>,
): Promise<number> {
  const [word, ...rest] = argv;
  if (word === "help" || word === "--help" || word === "-h") {
    usage.forEach((line) => ctx.stdout(line));
    return EXIT_OK;
  }
  const run = word !== undefined && Object.hasOwn(subcommands, word) ? subcommands[word] : undefined;
  if (run === undefined) {
    return usageError(ctx, usage, word === undefined ? "missing subcommand" : `unknown subcommand ${word}`);
  }
  try {
    return await run(rest, ctx, usage);
  } catch (error) {
    // A store failure (e.g. the database stayed locked past busy_timeout) is reported, not thrown.
    ctx.stderr(`error: ${error instanceof Error ? error.message : String(error)}`);
    return EXIT_FAILURE;
  }
}

/** Where messages go; the helpers below need nothing else of a context. */
type Io = Pick<OperatorContext, "stdout" | "stderr">;

function usageError(ctx: Io, usage: readonly string[], message: string): number {
  ctx.stderr(`error: ${message}`);
  usage.forEach((line) => ctx.stderr(line));
  return EXIT_USAGE;
}

function failure(ctx: Io, message: string): number {
  ctx.stderr(`error: ${message}`);
  return EXIT_FAILURE;
}

/** Parses flags and checks the positional count; on failure prints usage and gives the exit code. */
function parse<const S extends FlagSpec>(
  argv: readonly string[],
  spec: S,
  positionalNames: readonly string[],
  ctx: Io,
  usage: readonly string[],
): Extract<ParseResult<S>, { ok: true }> | number {
  const parsed = parseFlags(argv, spec);
  if (!parsed.ok) return usageError(ctx, usage, parsed.message);
  if (parsed.positionals.length > positionalNames.length) {
    return usageError(ctx, usage, `unexpected argument ${parsed.positionals[positionalNames.length]}`);
  }
  if (parsed.positionals.length < positionalNames.length) {
    return usageError(ctx, usage, `missing ${positionalNames[parsed.positionals.length]}`);
  }
  return parsed;
}

const json = (value: unknown) => JSON.stringify(value);

// ── credits ───────────────────────────────────────────────────────────────────────────────────────

/** Prepaid credits of a paid account (docs/ledger.md): a balanced posting funding → buyer. */
const creditsGrant: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { account: { kind: "string" }, credits: { kind: "string" }, memo: { kind: "string" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  if (!p.flags.account) return usageError(ctx, usage, "--account is required");
  const credits = Number(p.flags.credits);
  if (!p.flags.credits || !Number.isSafeInteger(credits) || credits <= 0) {
    return usageError(ctx, usage, "--credits must be a positive whole number of credits");
  }
  const account = await ctx.store.getAccount(p.flags.account);
  if (!account) return failure(ctx, `unknown account ${p.flags.account}`);
  if (account.tier !== "paid") return failure(ctx, `account ${p.flags.account} is free tier: free-tier usage is paid by the promotion account`);
  const granted = await ctx.store.grantCredits(account.account_id, credits, p.flags.memo);
  if (!granted.ok) return failure(ctx, `cannot grant ${credits} credits (${granted.code})`);
  ctx.stdout(json({ account_id: account.account_id, granted_credits: credits, available_credits: await ctx.store.availableCredits(account.account_id) }));
  return EXIT_OK;
};

const creditsBalance: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { account: { kind: "string" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  if (!p.flags.account) return usageError(ctx, usage, "--account is required");
  const account = await ctx.store.getAccount(p.flags.account);
  if (!account) return failure(ctx, `unknown account ${p.flags.account}`);
  ctx.stdout(
    json({
      account_id: account.account_id,
      balance_credits: await ctx.store.ledgerBalance(`buyer:${account.account_id}`),
      available_credits: await ctx.store.availableCredits(account.account_id),
    }),
  );
  return EXIT_OK;
};

// ── feedback ──────────────────────────────────────────────────────────────────────────────────────

/** Buyer ratings for review, newest first (POST /v1/feedback). Comments are the buyer's own words. */
const feedbackList: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { account: { kind: "string" }, limit: { kind: "string" }, json: { kind: "boolean" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const limit = p.flags.limit === undefined ? undefined : Number(p.flags.limit);
  if (limit !== undefined && (!Number.isSafeInteger(limit) || limit <= 0)) return usageError(ctx, usage, "--limit must be a positive whole number");
  const rows = await ctx.store.listFeedback({ account_id: p.flags.account, limit });
  if (p.flags.json) rows.forEach((row) => ctx.stdout(json(row)));
  else {
    table(
      ctx,
      ["REQUEST_ID", "ACCOUNT_ID", "RATING", "UPDATED", "COMMENT"],
      rows.map((r) => [r.request_id, r.account_id, r.rating, iso(r.updated_at_ms), (r.comment ?? "").replace(/\s+/g, " ")]),
    );
  }
  return EXIT_OK;
};

// ── accounts ──────────────────────────────────────────────────────────────────────────────────────

const accountsCreate: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { tier: { kind: "string" }, name: { kind: "string" }, env: { kind: "boolean" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const tier = p.flags.tier ?? "free";
  if (tier !== "free" && tier !== "paid") return usageError(ctx, usage, `--tier must be free or paid, got ${tier}`);
  const { account_id } = await ctx.store.createAccount({ tier: tier satisfies AccountTier, name: p.flags.name });
  // A new account gets its first key at once, so the operator can hand it over in one step.
  const { api_key } = await ctx.store.createApiKey({ account_id });
  if (p.flags.env) {
    // For `eval "$(gateway accounts create … --env)"` (README): both values are [A-Za-z0-9_-] only.
    ctx.stdout(`export ACCOUNT_ID=${account_id}`);
    ctx.stdout(`export GATEWAY_API_KEY=${api_key}`);
  } else ctx.stdout(json({ account_id, api_key }));
  return EXIT_OK;
};

/** Moves an account between free and paid: its keys' limits and payer change with their next request. */
const accountsSetTier: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { tier: { kind: "string" } }, ["ACCOUNT_ID"], ctx, usage);
  if (typeof p === "number") return p;
  const tier = p.flags.tier;
  if (tier !== "free" && tier !== "paid") return usageError(ctx, usage, `--tier must be free or paid, got ${tier ?? "nothing"}`);
  const account = await ctx.store.setAccountTier(p.positionals[0]!, tier);
  if (!account) return failure(ctx, `unknown account ${p.positionals[0]}`);
  ctx.changed?.({ kind: "tier_changed" });
  ctx.stdout(json(account));
  return EXIT_OK;
};

/**
 * Each account with what an operator checks first: its balance (paid: prepaid credits left), what it
 * spent today (UTC: credits debited, tokens counted) and how many keys work.
 */
const accountsList: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { json: { kind: "boolean" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const day = new Date((ctx.now ?? Date.now)()).toISOString().slice(0, 10); // the UTC day quotas count
  const activeKeys = new Map<string, number>();
  for (const key of await ctx.store.listApiKeys()) {
    if (key.revoked_at_ms === null) activeKeys.set(key.account_id, (activeKeys.get(key.account_id) ?? 0) + 1);
  }
  const rows = [];
  for (const account of await ctx.store.listAccounts()) {
    const usage = await ctx.store.accountUsage(account.account_id, day);
    rows.push({
      ...account,
      balance_credits: account.tier === "paid" ? await ctx.store.ledgerBalance(`buyer:${account.account_id}`) : null,
      spent_credits_today: usage.spent_credits_day,
      tokens_today: usage.daily_tokens_used,
      active_keys: activeKeys.get(account.account_id) ?? 0,
    });
  }
  if (p.flags.json) rows.forEach((row) => ctx.stdout(json(row)));
  else {
    const cells = rows.map((r) => [
      r.account_id,
      r.tier,
      r.balance_credits === null ? "-" : String(r.balance_credits),
      String(r.spent_credits_today),
      String(r.tokens_today),
      String(r.active_keys),
      iso(r.created_at_ms),
      r.name ?? "",
    ]);
    table(ctx, ["ACCOUNT_ID", "TIER", "BALANCE", "SPENT_TODAY", "TOKENS_TODAY", "KEYS", "CREATED", "NAME"], cells);
  }
  return EXIT_OK;
};

// ── keys ──────────────────────────────────────────────────────────────────────────────────────────

const keysCreate: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { account: { kind: "string" }, label: { kind: "string" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const account_id = p.flags.account;
  if (account_id === undefined) return usageError(ctx, usage, "--account is required");
  if (await ctx.store.getAccount(account_id) === null) return failure(ctx, `unknown account ${account_id}`);
  ctx.stdout(json(await ctx.store.createApiKey({ account_id, label: p.flags.label })));
  return EXIT_OK;
};

const keysRevoke: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, {}, ["KEY_ID"], ctx, usage);
  if (typeof p === "number") return p;
  const key_id = p.positionals[0]!;
  if (!(await ctx.store.revokeApiKey(key_id))) return failure(ctx, `unknown key ${key_id}`);
  ctx.changed?.({ kind: "key_revoked" });
  ctx.stdout(json({ key_id, revoked: true }));
  return EXIT_OK;
};

const keysList: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { account: { kind: "string" }, json: { kind: "boolean" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const account_id = p.flags.account;
  if (account_id !== undefined && await ctx.store.getAccount(account_id) === null) {
    return failure(ctx, `unknown account ${account_id}`);
  }
  // Rows carry the display prefix only: the store never returns hashes or keys.
  const rows = await ctx.store.listApiKeys(account_id);
  if (p.flags.json) rows.forEach((row) => ctx.stdout(json(row)));
  else {
    table(
      ctx,
      ["KEY_ID", "ACCOUNT_ID", "PREFIX", "STATUS", "LAST_USED", "LABEL"],
      rows.map((r) => [
        r.key_id,
        r.account_id,
        r.display_prefix,
        r.revoked_at_ms === null ? "active" : "revoked",
        r.last_used_at_ms === null ? "never" : iso(r.last_used_at_ms),
        r.label ?? "",
      ]),
    );
  }
  return EXIT_OK;
};

// ── providers ─────────────────────────────────────────────────────────────────────────────────────

/** Standard base64 (padding optional) of exactly 32 bytes, or null. */
export function decodeEd25519PublicKey(b64: string): Uint8Array | null {
  if (!/^[A-Za-z0-9+/]{43}=?$/.test(b64)) return null;
  const bytes = Buffer.from(b64, "base64");
  // The round trip rejects a last character whose unused low bits are set (a non-canonical form).
  if (bytes.length !== 32 || bytes.toString("base64") !== b64.padEnd(44, "=")) return null;
  return new Uint8Array(bytes);
}

function providerJson(b: ProviderBinding) {
  return {
    provider_id: b.provider_id,
    public_key: b.public_key === null ? null : Buffer.from(b.public_key).toString("base64"),
    pinned: b.pinned,
    banned: b.banned,
    first_admitted_at_ms: b.first_admitted_at_ms,
    updated_at_ms: b.updated_at_ms,
  };
}

function providerIdArg(argv: readonly string[], ctx: OperatorContext, usage: readonly string[], spec: FlagSpec = {}) {
  const p = parse(argv, spec, ["ID"], ctx, usage);
  if (typeof p === "number") return p;
  const id = p.positionals[0]!;
  if (!PROVIDER_ID.test(id)) return usageError(ctx, usage, `provider id must match ${PROVIDER_ID.source}`);
  return { id, flags: p.flags };
}

const providersPin: Subcommand = async (argv, ctx, usage) => {
  const p = providerIdArg(argv, ctx, usage, { "public-key": { kind: "string" } });
  if (typeof p === "number") return p;
  const b64 = p.flags["public-key"];
  if (typeof b64 !== "string") return usageError(ctx, usage, "--public-key is required");
  const key = decodeEd25519PublicKey(b64);
  if (key === null) return usageError(ctx, usage, "--public-key must be standard base64 of a 32-byte Ed25519 key");
  ctx.stdout(json(providerJson(await ctx.store.pinProvider(p.id, key))));
  return EXIT_OK;
};

const providersUnpin: Subcommand = async (argv, ctx, usage) => {
  const p = providerIdArg(argv, ctx, usage);
  if (typeof p === "number") return p;
  const binding = await ctx.store.unpinProvider(p.id);
  if (binding === null) return failure(ctx, `unknown provider ${p.id}`);
  ctx.stdout(json(providerJson(binding)));
  return EXIT_OK;
};

const providersBan: Subcommand = async (argv, ctx, usage) => {
  const p = providerIdArg(argv, ctx, usage);
  if (typeof p === "number") return p;
  ctx.stdout(json(providerJson(await ctx.store.banProvider(p.id))));
  ctx.changed?.({ kind: "provider_banned", provider_id: p.id });
  return EXIT_OK;
};

const providersUnban: Subcommand = async (argv, ctx, usage) => {
  const p = providerIdArg(argv, ctx, usage);
  if (typeof p === "number") return p;
  const binding = await ctx.store.unbanProvider(p.id);
  if (!binding) return failure(ctx, `unknown provider ${p.id}`);
  ctx.stdout(json(providerJson(binding)));
  return EXIT_OK;
};

const providersList: Subcommand = async (argv, ctx, usage) => {
  const p = parse(argv, { json: { kind: "boolean" } }, [], ctx, usage);
  if (typeof p === "number") return p;
  const rows = (await ctx.store.listProviders()).map(providerJson);
  if (p.flags.json) rows.forEach((row) => ctx.stdout(json(row)));
  else {
    table(
      ctx,
      ["PROVIDER_ID", "TIER", "BANNED", "PUBLIC_KEY"],
      rows.map((r) => [r.provider_id, r.pinned ? "pinned" : "provisional", r.banned ? "yes" : "no", r.public_key ?? "-"]),
    );
  }
  return EXIT_OK;
};

// ── backup ────────────────────────────────────────────────────────────────────────────────────────

const BACKUP_USAGE = ["usage: gateway backup --to FILE [--data-dir DIR]"];

export interface BackupContext extends Io {
  /** The gateway's SQLite file (databasePath(dataDir)); it is read, never migrated or written. */
  databasePath: string;
}

/**
 * Runs `gateway backup --to FILE`: an online copy of the store, safe while a gateway serves from it.
 * Prints `{"backup": path, "bytes": n}`; refuses an existing FILE (exit 1).
 */
export async function runBackupCommand(argv: readonly string[], ctx: BackupContext): Promise<number> {
  const [word] = argv;
  if (word === "help" || word === "--help" || word === "-h") {
    BACKUP_USAGE.forEach((line) => ctx.stdout(line));
    return EXIT_OK;
  }
  const p = parse(argv, { to: { kind: "string" } }, [], ctx, BACKUP_USAGE);
  if (typeof p === "number") return p;
  if (p.flags.to === undefined || p.flags.to === "") return usageError(ctx, BACKUP_USAGE, "--to FILE is required");
  const result = backupDatabase(ctx.databasePath, p.flags.to);
  if (!result.ok) return failure(ctx, result.message);
  ctx.stdout(json({ backup: result.path, bytes: result.bytes }));
  return EXIT_OK;
}

// ── human output ──────────────────────────────────────────────────────────────────────────────────

const iso = (ms: number) => new Date(ms).toISOString();

function table(ctx: OperatorContext, header: string[], rows: string[][]): void {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  for (const row of [header, ...rows]) {
    ctx.stdout(row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join("  ").trimEnd());
  }
}
