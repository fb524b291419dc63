// `gateway store migrate --to postgres://…` (docs/postgres-store.md, "Moving up from a single node"): copies the single node's
// SQLite store of --data-dir into an empty PostgreSQL database. Run it with the gateway stopped; the
// copy is one transaction and is checked balance by balance before it commits.
import { existsSync } from "node:fs";
import { openDatabase } from "../store/db.ts";
import { copySqliteToPostgres } from "../store/postgres/copy.ts";
import { backendProblem } from "../config/index.ts";

const USAGE = ["usage: gateway store migrate --to postgres://USER@HOST:PORT/DB [--data-dir DIR]"];

export async function runStoreCommand(
  argv: readonly string[],
  ctx: { databasePath: string; stdout: (l: string) => void; stderr: (l: string) => void },
): Promise<number> {
  const [word, ...rest] = argv;
  if (word === "help" || word === "--help" || word === "-h") {
    USAGE.forEach((l) => ctx.stdout(l));
    return 0;
  }
  const usage = (message: string) => {
    ctx.stderr(`error: ${message}`);
    USAGE.forEach((l) => ctx.stderr(l));
    return 64;
  };
  if (word !== "migrate") return usage(word === undefined ? "missing subcommand" : `unknown subcommand ${word}`);
  let to: string | undefined;
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]!;
    if (arg === "--to" && rest[i + 1] !== undefined) to = rest[++i];
    else if (arg.startsWith("--to=")) to = arg.slice("--to=".length);
    else return usage(`unexpected argument ${arg}`);
  }
  if (!to) return usage("--to postgres://… is required");
  const problem = backendProblem(to, "redis://unused");
  if (problem !== null) return usage(problem);
  if (!existsSync(ctx.databasePath)) {
    ctx.stderr(`error: no gateway database at ${ctx.databasePath} (check --data-dir)`);
    return 1;
  }
  // openDatabase brings an older file up to this build's schema first, as `gateway serve` would.
  const source = openDatabase(ctx.databasePath);
  try {
    const result = await copySqliteToPostgres(source, to);
    if (!result.ok) {
      ctx.stderr(`error: ${result.message}`);
      return 1;
    }
    ctx.stdout(JSON.stringify({ migrated: true, rows: result.rows, balances_checked: result.balances }));
    return 0;
  } catch (error) {
    ctx.stderr(`error: copy failed, nothing was written: ${error instanceof Error ? error.message : String(error)}`);
    return 1;
  } finally {
    source.close();
  }
}
