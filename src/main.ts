#!/usr/bin/env bun
// `gateway` — one entry point for every subcommand (DESIGN §2).
import { configUsage } from "./config/index.ts";
import { runAccountsCommand, runKeysCommand, runProvidersCommand, type OperatorContext } from "./cli/operator.ts";
import { runProviderCommand } from "./provider/cli.ts";
import { databasePath } from "./server.ts";
import { openStore } from "./store/index.ts";
import { runServe } from "./serve.ts";

const USAGE = `usage: gateway <command> [options]

commands:
  serve         run the gateway (gateway serve --help for its options)
  accounts      create and list buyer accounts
  keys          create, list and revoke API keys
  providers     pin, unpin, ban and list provider ids
  provider      run a provider machine's runtime (gateway provider --help)

operator commands read --data-dir DIR (env GATEWAY_DATA_DIR, default ./data).`;

/** Pulls `--data-dir X` / `--data-dir=X` out of an operator command's argv. */
function takeDataDir(argv: string[]): { dataDir: string; rest: string[] } {
  let dataDir = process.env.GATEWAY_DATA_DIR || "./data";
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--data-dir" && argv[i + 1] !== undefined) dataDir = argv[++i]!;
    else if (arg.startsWith("--data-dir=")) dataDir = arg.slice("--data-dir=".length);
    else rest.push(arg);
  }
  return { dataDir, rest };
}

async function runOperator(run: (argv: readonly string[], ctx: OperatorContext) => Promise<number>, argv: string[]): Promise<number> {
  const { dataDir, rest } = takeDataDir(argv);
  const store = openStore(databasePath(dataDir), { keyPrefix: process.env.GATEWAY_KEY_PREFIX || undefined });
  try {
    return await run(rest, { store, stdout: (l) => console.log(l), stderr: (l) => console.error(l) });
  } finally {
    store.close();
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
    case "providers":
      return runOperator(runProvidersCommand, rest);
    case "provider":
      return runProviderCommand(rest);
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
