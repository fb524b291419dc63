#!/usr/bin/env bun
// `gateway` — one entry point for every subcommand (docs/operator.md).
import { configUsage } from "./config/index.ts";
import { runCatalogCommand } from "./catalog/cli.ts";
import {
  runAccountsCommand,
  runBackupCommand,
  runCreditsCommand,
  runFeedbackCommand,
  runKeysCommand,
  runProvidersCommand,
  type OperatorContext,
} from "./cli/operator.ts";
import { runProviderCommand } from "./provider/cli.ts";
import { catalogLookupFrom } from "./ledger/audit.ts";
import { runLedgerCommand, runReceiptsCommand } from "./ledger/cli.ts";
import { processIo, runVerifyReceipt } from "./receipts/verifyCli.ts";
import { announceChanges } from "./cluster/announce.ts";
import type { ChangeMessage } from "./cluster/messages.ts";
import { databasePath } from "./compositionRoot.ts";
import { openStore } from "./store/index.ts";
import { asyncStore, type AsyncStore } from "./store/asyncStore.ts";
import { openPostgresStore } from "./store/postgres/index.ts";
import { runStoreCommand } from "./cli/storeMigrate.ts";
import { runPgDump } from "./cli/pgBackup.ts";
import { runServe } from "./serveCommand.ts";
import { runConsoleCommand } from "./console/cli.ts";

const USAGE = `usage: gateway <command> [options]

commands:
  serve         run the gateway (gateway serve --help for its options)
  accounts      create and list buyer accounts
  keys          create, list and revoke API keys
  credits       grant prepaid credits to a paid account, show its balance
  feedback      list buyers' ratings of their requests (gateway feedback list [--json])
  providers     pin, unpin, ban and list provider ids
  catalog       the signed model catalog: init, add, remove, show, sign, history
  provider      run a provider machine's runtime (gateway provider --help)
  receipts      list settled attempts and export their receipts
  ledger        audit the ledger against stored receipts (gateway ledger audit)
  verify-receipt  check a receipt offline (gateway verify-receipt --help)
  backup        copy the gateway's database while it runs (gateway backup --to FILE)
  store         move a single node's store into PostgreSQL (gateway store migrate --to postgres://…)
  console       the operator console at /console: gateway console token prints its token

operator commands read --data-dir DIR (env GATEWAY_DATA_DIR, default ./data), or with
--database-url URL (env GATEWAY_DATABASE_URL) a cluster's PostgreSQL database.`;

/** Pulls `--data-dir X` and `--database-url X` (either as `--name=X`) out of an operator command's argv. */
function takeDataDir(argv: string[]): { dataDir: string; databaseUrl: string | undefined; rest: string[] } {
  let dataDir = process.env.GATEWAY_DATA_DIR || "./data";
  let databaseUrl = process.env.GATEWAY_DATABASE_URL || undefined;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--data-dir" && argv[i + 1] !== undefined) dataDir = argv[++i]!;
    else if (arg.startsWith("--data-dir=")) dataDir = arg.slice("--data-dir=".length);
    else if (arg === "--database-url" && argv[i + 1] !== undefined) databaseUrl = argv[++i]!;
    else if (arg.startsWith("--database-url=")) databaseUrl = arg.slice("--database-url=".length);
    else rest.push(arg);
  }
  return { dataDir, databaseUrl, rest };
}

/** The store an operator command works on: the cluster's PostgreSQL database, or the data dir's SQLite file. */
async function openOperatorStore(dataDir: string, databaseUrl: string | undefined): Promise<AsyncStore> {
  const keyPrefix = process.env.GATEWAY_KEY_PREFIX || undefined;
  if (databaseUrl !== undefined) return openPostgresStore(databaseUrl, { keyPrefix, maxConnections: 2 });
  return asyncStore(openStore(databasePath(dataDir), { keyPrefix }));
}

/** Pulls `--redis-url X` / `--redis-url=X` out of an operator command's argv (env GATEWAY_REDIS_URL). */
function takeRedisUrl(argv: string[]): { redisUrl: string | undefined; rest: string[] } {
  let redisUrl = process.env.GATEWAY_REDIS_URL || undefined;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--redis-url" && argv[i + 1] !== undefined) redisUrl = argv[++i]!;
    else if (arg.startsWith("--redis-url=")) redisUrl = arg.slice("--redis-url=".length);
    else rest.push(arg);
  }
  return { redisUrl, rest };
}

async function runOperator(run: (argv: readonly string[], ctx: OperatorContext) => Promise<number>, argv: string[]): Promise<number> {
  const { redisUrl, rest: withoutRedis } = takeRedisUrl(argv);
  const { dataDir, databaseUrl, rest } = takeDataDir(withoutRedis);
  let store: AsyncStore;
  try {
    store = await openOperatorStore(dataDir, databaseUrl);
  } catch (error) {
    console.error(`error: cannot open the store: ${error instanceof Error ? error.message : String(error)}`);
    return 1;
  }
  const changes: ChangeMessage[] = [];
  try {
    const code = await run(rest, { store, stdout: (l) => console.log(l), stderr: (l) => console.error(l), changed: (c) => void changes.push(c) });
    // A cluster's nodes hear of the change at once; without Redis they see it at their next lookup.
    if (redisUrl && !(await announceChanges(redisUrl, changes))) console.error("warning: the change is stored, but Redis could not be reached to announce it");
    return code;
  } finally {
    await store.close();
  }
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case "serve":
      if (rest.includes("--help")) {
        console.log(configUsage());
        return 0;
      }
      return runServe(rest);
    case "accounts":
      return runOperator(runAccountsCommand, rest);
    case "keys":
      return runOperator(runKeysCommand, rest);
    case "credits":
      return runOperator(runCreditsCommand, rest);
    case "feedback":
      return runOperator(runFeedbackCommand, rest);
    case "providers":
      return runOperator(runProvidersCommand, rest);
    case "catalog":
      // The catalog commands also need the data dir itself (operator key, published catalog files).
      return runOperator((args, ctx) => runCatalogCommand(args, { ...ctx, dataDir: takeDataDir(rest).dataDir }), rest);
    case "provider":
      return runProviderCommand(rest);
    case "receipts":
      return runOperator(runReceiptsCommand, rest);
    case "ledger":
      return runOperator(async (args, ctx) => {
        // The audit looks catalogs up synchronously: read the (small, append-only) history once.
        const history = new Map((await ctx.store.listCatalogHistory()).map((entry) => [entry.catalog_id, entry]));
        return runLedgerCommand(args, ctx, { catalogLookup: catalogLookupFrom((id) => history.get(id)) });
      }, rest);
    case "verify-receipt":
      return runVerifyReceipt(rest, processIo);
    case "console":
      return runOperator(runConsoleCommand, rest);
    case "backup": {
      const { dataDir, databaseUrl, rest: args } = takeDataDir(rest);
      const io = { stdout: (l: string) => console.log(l), stderr: (l: string) => console.error(l) };
      if (databaseUrl !== undefined) return runPgDump(args, { databaseUrl, ...io });
      return runBackupCommand(args, { databasePath: databasePath(dataDir), ...io });
    }
    case "store": {
      const { dataDir, rest: args } = takeDataDir(rest);
      return runStoreCommand(args, { databasePath: databasePath(dataDir), stdout: (l) => console.log(l), stderr: (l) => console.error(l) });
    }
    case "--help":
    case "help":
      console.log(USAGE);
      return 0;
    default:
      console.error(command ? `unknown command ${command}\n\n${USAGE}` : USAGE);
      return 64;
  }
}

const code = await main(process.argv.slice(2));
if (code !== 0) process.exit(code);
