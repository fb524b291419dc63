// A private PostgreSQL for tests: initdb + pg_ctl in a temporary data directory, listening on a random
// loopback port, as the `postgres` user when we are root (PostgreSQL refuses to run as root). One
// server is shared by every test file of a `bun test` process (each test gets its own database via
// `freshDatabase`); a test that stops the engine starts a private one with `startPostgres`.
// Without the binaries, `postgresMissing` says why and tests skip themselves (test.skipIf).

import { spawnSync } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { migratePostgres } from "../../src/store/postgres/index.ts";
import { shQuote, stopWhenTestProcessDies } from "./orphanWatchdog.ts";
import { freePort } from "./ports.ts";

const BIN = process.env.GATEWAY_TEST_PG_BIN ?? "/usr/lib/postgresql/15/bin";

function whyMissing(): string | null {
  if (!existsSync(join(BIN, "initdb")) || !existsSync(join(BIN, "pg_ctl"))) {
    return `PostgreSQL 15 binaries not found in ${BIN} (apt-get install postgresql; .ci/run does it as root)`;
  }
  if (process.getuid?.() === 0 && spawnSync("id", ["-u", "postgres"]).status !== 0) {
    return "running as root but there is no `postgres` user to run the server as";
  }
  return null;
}

/** Null when a private PostgreSQL can be started here; otherwise the reason tests are skipped. */
export const postgresMissing: string | null = whyMissing();
if (postgresMissing !== null) console.warn(`[postgres tests skipped] ${postgresMissing}`);

export interface PostgresServer {
  /** postgres://postgres@127.0.0.1:PORT/postgres */
  url: string;
  port: number;
  dataDir: string;
  /** URL of a new database holding the gateway's schema (copied from a template migrated once). */
  freshDatabase(): Promise<string>;
  /** URL of a new, empty database (no schema: `gateway store migrate --to` wants one). */
  emptyDatabase(): Promise<string>;
  /** Fast shutdown (connections are cut); `start` brings it back on the same port and data. */
  stop(): void;
  start(): void;
  /** The same, without blocking the test process's event loop while pg_ctl runs (its buyers keep reading). */
  stopAsync(): Promise<void>;
  startAsync(): Promise<void>;
  /** Stops the server and removes its data directory. */
  destroy(): void;
}

/** Runs a PostgreSQL binary as the `postgres` user when we are root, else as ourselves. */
function runPg(args: string[]): { ok: boolean; output: string } {
  const asRoot = process.getuid?.() === 0;
  const command = asRoot ? "su" : join(BIN, args[0]!);
  const argv = asRoot
    ? ["postgres", "-s", "/bin/sh", "-c", [join(BIN, args[0]!), ...args.slice(1)].map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(" ")]
    : args.slice(1);
  const result = spawnSync(command, argv, { encoding: "utf8", timeout: 60_000 });
  return { ok: result.status === 0, output: `${result.stdout ?? ""}${result.stderr ?? ""}` };
}

/** runPg in a child process, awaited: the caller's event loop keeps running. */
async function runPgAsync(args: string[]): Promise<{ ok: boolean; output: string }> {
  const asRoot = process.getuid?.() === 0;
  const argv = asRoot
    ? ["su", "postgres", "-s", "/bin/sh", "-c", [join(BIN, args[0]!), ...args.slice(1)].map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(" ")]
    : [join(BIN, args[0]!), ...args.slice(1)];
  const proc = Bun.spawn(argv, { stdout: "pipe", stderr: "pipe" });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { ok: code === 0, output: `${stdout}${stderr}` };
}

/** Starts a new private server (about a second for initdb and start). */
export async function startPostgres(): Promise<PostgresServer> {
  if (postgresMissing !== null) throw new Error(postgresMissing);
  const root = mkdtempSync(join(tmpdir(), "gw-pg-"));
  const dataDir = join(root, "data");
  chmodSync(root, 0o755);
  if (process.getuid?.() === 0) {
    const uid = Number(spawnSync("id", ["-u", "postgres"], { encoding: "utf8" }).stdout.trim());
    const gid = Number(spawnSync("id", ["-g", "postgres"], { encoding: "utf8" }).stdout.trim());
    chownSync(root, uid, gid);
  }
  const init = runPg(["initdb", "-D", dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]);
  if (!init.ok) throw new Error(`initdb failed: ${init.output}`);
  const port = await freePort();
  // Test settings: no fsync (a test server's data dies with it), sockets only on loopback TCP and in
  // the data directory (the system socket directory may not be writable). synchronous_commit stays at
  // its default (on), as in production (docs/postgres-store.md): without fsync a synchronous commit is a
  // write() by the committing backend, cheaper in CPU than an asynchronous one, which wakes the WAL
  // writer (docs/benchmarks.md, "Cluster node CPU pass"). GATEWAY_TEST_PG_OPTIONS adds more (the
  // cluster bench's pg_stat_statements).
  const options = `-c listen_addresses=127.0.0.1 -p ${port} -c unix_socket_directories=${root} -c fsync=off -c full_page_writes=off -c max_connections=200 ${process.env.GATEWAY_TEST_PG_OPTIONS ?? ""}`;
  const start = () => {
    const started = runPg(["pg_ctl", "-D", dataDir, "-o", options, "-l", join(root, "log"), "-w", "-t", "30", "start"]);
    if (!started.ok) throw new Error(`pg_ctl start failed: ${started.output}`);
  };
  const stop = () => {
    runPg(["pg_ctl", "-D", dataDir, "-m", "fast", "-w", "stop"]);
  };
  const startAsync = async () => {
    const started = await runPgAsync(["pg_ctl", "-D", dataDir, "-o", options, "-l", join(root, "log"), "-w", "-t", "30", "start"]);
    if (!started.ok) throw new Error(`pg_ctl start failed: ${started.output}`);
  };
  const stopAsync = async () => {
    await runPgAsync(["pg_ctl", "-D", dataDir, "-m", "fast", "-w", "stop"]);
  };
  start();
  // Killed without an exit handler, this process leaves the server to its watchdog: an immediate
  // shutdown (SIGQUIT to the postmaster named in its pid file), then the directory goes.
  const pidFile = shQuote(join(dataDir, "postmaster.pid"));
  stopWhenTestProcessDies(`[ -f ${pidFile} ] && kill -QUIT "$(head -1 ${pidFile})"; sleep 2; rm -rf ${shQuote(root)}`);
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  let databases = 0;
  let destroyed = false;
  const destroy = () => {
    if (destroyed) return;
    destroyed = true;
    runPg(["pg_ctl", "-D", dataDir, "-m", "immediate", "-w", "stop"]);
    rmSync(root, { recursive: true, force: true });
  };
  process.once("exit", destroy);
  const createDatabase = async (template: string | null): Promise<string> => {
    const name = `t${process.pid}_${++databases}`;
    const admin = new Bun.SQL(url, { max: 1 });
    try {
      await admin.unsafe(`CREATE DATABASE ${name}${template ? ` TEMPLATE ${template}` : ""} STRATEGY FILE_COPY`);
    } finally {
      await admin.close();
    }
    return `postgres://postgres@127.0.0.1:${port}/${name}`;
  };
  // The migrations run once, into a template; every fresh database is a file copy of it.
  let template: Promise<string> | null = null;
  const migratedTemplate = () =>
    (template ??= (async () => {
      const templateUrl = await createDatabase(null);
      const sql = new Bun.SQL(templateUrl, { max: 1 });
      try {
        await migratePostgres(sql);
      } finally {
        await sql.close();
      }
      return templateUrl.slice(templateUrl.lastIndexOf("/") + 1);
    })());
  return {
    url,
    port,
    dataDir,
    freshDatabase: async () => createDatabase(await migratedTemplate()),
    emptyDatabase: () => createDatabase(null),
    stop,
    start,
    stopAsync,
    startAsync,
    destroy,
  };
}

let shared: Promise<PostgresServer> | null = null;

/** The server shared by every test file of this process, started on first use, stopped at exit. */
export function sharedPostgres(): Promise<PostgresServer> {
  shared ??= startPostgres();
  return shared;
}
