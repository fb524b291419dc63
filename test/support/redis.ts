// A private Redis for a test file: `redis-server --port N --save ''` on loopback, no persistence, its
// own temp dir. Skipped visibly (describe.skipIf + a reason on stderr) when redis-server is missing.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { shQuote, stopWhenTestProcessDies } from "./orphanWatchdog.ts";
import { freePort } from "./ports.ts";

export const REDIS_SERVER = Bun.which("redis-server") ?? (Bun.file("/usr/bin/redis-server").size > 0 ? "/usr/bin/redis-server" : null);

/** Why Redis tests are skipped on this machine, or null when they run. */
export const redisMissing: string | null = REDIS_SERVER ? null : "redis-server is not installed (apt-get install redis-server)";
if (redisMissing) console.warn(`[skipped] Redis tests: ${redisMissing}`);

export interface TestRedis {
  url: string;
  port: number;
  /** SIGKILL (a crash, not a shutdown). */
  kill(): Promise<void>;
  /** SIGSTOP / SIGCONT: unreachable without closing connections (a hung engine). */
  pause(): void;
  resume(): void;
  /** Starts a killed server again on the same port (empty: it never saved anything). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

async function ping(port: number): Promise<boolean> {
  try {
    const socket = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {}, open() {}, error() {} } });
    socket.end();
    return true;
  } catch {
    return false;
  }
}

export interface RedisOptions {
  /** How many databases the server keeps (`--databases`): test gateways sharing one server each use one. */
  databases?: number;
}

export async function startRedis(options: RedisOptions = {}): Promise<TestRedis> {
  if (!REDIS_SERVER) throw new Error(redisMissing!);
  const dir = mkdtempSync(join(tmpdir(), "gw-redis-"));
  let proc: ReturnType<typeof Bun.spawn> | null = null;
  let port = 0;
  const launch = async (): Promise<boolean> => {
    const databases = options.databases ? ["--databases", String(options.databases)] : [];
    proc = Bun.spawn([REDIS_SERVER!, "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, ...databases], {
      stdout: "ignore",
      stderr: "ignore",
    });
    // Killed without an exit handler, this process leaves the server to a watchdog.
    const pid = proc.pid;
    stopWhenTestProcessDies(`grep -q redis-server /proc/${pid}/cmdline 2>/dev/null && kill -9 ${pid}; rm -rf ${shQuote(dir)}`);
    for (let i = 0; i < 200; i++) {
      if (proc.exitCode !== null) return false;
      if (await ping(port)) return true;
      await Bun.sleep(10);
    }
    return false;
  };
  for (let attempt = 0; ; attempt++) {
    port = await freePort();
    if (await launch()) break;
    (proc as ReturnType<typeof Bun.spawn> | null)?.kill("SIGKILL");
    if (attempt === 4) throw new Error("redis-server did not start");
  }
  const kill = async () => {
    const p = proc as ReturnType<typeof Bun.spawn> | null;
    if (p && p.exitCode === null && p.signalCode === null) {
      p.kill("SIGKILL");
      await p.exited;
    }
  };
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    kill,
    pause: () => (proc as ReturnType<typeof Bun.spawn> | null)?.kill("SIGSTOP"),
    resume: () => (proc as ReturnType<typeof Bun.spawn> | null)?.kill("SIGCONT"),
    async restart() {
      await kill();
      if (!(await launch())) throw new Error("redis-server did not restart");
    },
    async stop() {
      const p = proc as ReturnType<typeof Bun.spawn> | null;
      p?.kill("SIGCONT");
      await kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Databases of the shared server: one per cluster-mode test gateway of a `bun test` process. */
const SHARED_DATABASES = 10_000;
let shared: Promise<TestRedis> | null = null;
let nextDatabase = 0;

/**
 * A database of its own (`redis://127.0.0.1:PORT/N`) on a Redis server shared by every test file of
 * this process: started on first use, killed at exit. Keys are scoped by the database, and the
 * gateway scopes its pub/sub channels by it too (src/cluster/redis.ts, clusterChannel).
 */
export async function sharedRedisDatabase(): Promise<string> {
  shared ??= startRedis({ databases: SHARED_DATABASES }).then((redis) => {
    process.once("exit", () => void redis.kill());
    return redis;
  });
  const redis = await shared;
  nextDatabase += 1;
  if (nextDatabase >= SHARED_DATABASES) throw new Error("shared test Redis: out of databases");
  return `${redis.url}/${nextDatabase}`;
}
