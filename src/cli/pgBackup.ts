// `gateway backup --to FILE --database-url URL`: a cluster's backup is PostgreSQL's own consistent
// dump (pg_dump's custom format, restored with pg_restore; docs/postgres-store.md, "Backups"). Like the
// SQLite backup it never overwrites, and the file appears under its name only once complete (0600).
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, linkSync, readdirSync, rmSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { randomBytes } from "node:crypto";

const USAGE = ["usage: gateway backup --to FILE --database-url URL   (runs pg_dump --format=custom)"];

/** pg_dump on PATH, else the newest one Debian's postgresql packages installed. */
export function findPgDump(): string | null {
  const onPath = spawnSync("sh", ["-c", "command -v pg_dump"], { encoding: "utf8" });
  if (onPath.status === 0 && onPath.stdout.trim() !== "") return onPath.stdout.trim();
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return null;
  const versions = readdirSync(root).filter((v) => /^\d+$/.test(v)).sort((a, b) => Number(b) - Number(a));
  for (const v of versions) {
    const candidate = join(root, v, "bin", "pg_dump");
    if (existsSync(candidate)) return candidate;
  }
  return null;
}

export async function runPgDump(
  argv: readonly string[],
  ctx: { databaseUrl: string; stdout: (l: string) => void; stderr: (l: string) => void },
): Promise<number> {
  if (argv[0] === "help" || argv[0] === "--help" || argv[0] === "-h") {
    USAGE.forEach((l) => ctx.stdout(l));
    return 0;
  }
  let to: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--to" && argv[i + 1] !== undefined) to = argv[++i];
    else if (arg.startsWith("--to=")) to = arg.slice("--to=".length);
    else {
      ctx.stderr(`error: unexpected argument ${arg}`);
      USAGE.forEach((l) => ctx.stderr(l));
      return 64;
    }
  }
  if (!to) {
    ctx.stderr("error: --to FILE is required");
    USAGE.forEach((l) => ctx.stderr(l));
    return 64;
  }
  const target = resolve(to);
  if (existsSync(target)) return fail(ctx, `${target} already exists; refusing to overwrite it`);
  if (!existsSync(dirname(target))) return fail(ctx, `directory ${dirname(target)} does not exist`);
  const pgDump = findPgDump();
  if (pgDump === null) return fail(ctx, "pg_dump not found (install postgresql-client of the server's major version)");
  const partial = `${target}.partial-${randomBytes(6).toString("hex")}`;
  try {
    // The URL goes through the environment-free --dbname; pg_dump takes one consistent snapshot.
    const dumped = spawnSync(pgDump, ["--format=custom", "--no-owner", `--file=${partial}`, `--dbname=${ctx.databaseUrl}`], { encoding: "utf8" });
    if (dumped.status !== 0) return fail(ctx, `pg_dump failed: ${(dumped.stderr || dumped.stdout || "").trim()}`);
    chmodSync(partial, 0o600);
    try {
      linkSync(partial, target);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") return fail(ctx, `${target} already exists; refusing to overwrite it`);
      throw error;
    }
    ctx.stdout(JSON.stringify({ backup: target, bytes: statSync(target).size, format: "pg_dump custom (restore with pg_restore)" }));
    return 0;
  } catch (error) {
    return fail(ctx, error instanceof Error ? error.message : String(error));
  } finally {
    rmSync(partial, { force: true });
  }
}

function fail(ctx: { stderr: (l: string) => void }, message: string): number {
  ctx.stderr(`error: ${message}`);
  return 1;
}
