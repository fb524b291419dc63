// The node's Redis connections (Bun's RedisClient, docs/decisions.md "Scale-out"): one for commands,
// one for pub/sub. Commands fail at once while Redis is unreachable (no offline queue: a buyer gets a
// retryable 503 instead of a hung request), a probe every second notices when it is back, and the
// subscriber is made again then — Bun's client does not resubscribe after a reconnect.
import { RedisClient } from "bun";
import type { Log } from "../log.ts";

export type RedisResult<T> = { ok: true; value: T } | { ok: false; error: string };

export interface ClusterRedis {
  /** A pub/sub channel's full name: scoped to the URL's database (clusterChannel). */
  channel(name: string): string;
  /** Whether the last command or probe reached Redis. */
  readonly up: boolean;
  /** One command; never throws, never waits longer than the command timeout. */
  call<T = unknown>(command: string, args: (string | number)[]): Promise<RedisResult<T>>;
  /** A command whose answer nobody waits for (lease refreshes, cleanup); failures only flip `up`. */
  fire(command: string, args: (string | number)[]): void;
  /** Listens on `channel` for as long as the node runs, across reconnects. */
  subscribe(channel: string, listener: (message: string) => void): Promise<void>;
  /** Called on each change of `up` (true: back; false: lost). */
  onChange(listener: (up: boolean) => void): void;
  /**
   * The latest time on Redis's clock (ms, as a script reads `TIME`) at which a command sent now runs
   * before `call` gives up on it; null until Redis's clock was read once. A script that refuses to act
   * after it cannot take effect for a caller that was already told the command failed.
   */
  commandDeadline(): number | null;
  close(): void;
}

export interface RedisOptions {
  url: string;
  log: Log;
  /** Longest a command may take before it counts as failed (Redis is hung or unreachable). */
  commandTimeoutMs?: number;
  /** How often a down connection is probed. */
  probeMs?: number;
}

export async function connectRedis(options: RedisOptions): Promise<ClusterRedis> {
  const { log } = options;
  const timeoutMs = options.commandTimeoutMs ?? 1000;
  const probeMs = options.probeMs ?? 1000;
  const clientOptions = { enableOfflineQueue: false, connectionTimeout: timeoutMs, autoReconnect: true, maxRetries: 1_000_000 };
  let client = new RedisClient(options.url, clientOptions);
  let subscriber: RedisClient | null = null;
  const channels = new Map<string, (message: string) => void>();
  const listeners: ((up: boolean) => void)[] = [];
  let up = false;
  let closed = false;
  // Redis's clock minus this process's monotonic one, read from TIME: its answer is taken as made at
  // the moment it arrived, so this never exceeds the real offset (a late answer only lowers it).
  let clockOffset: number | null = null;

  const setUp = (value: boolean, reason?: string) => {
    if (value === up) return;
    up = value;
    if (value) log.info("redis_up", { url: redact(options.url) });
    else log.warn("redis_down", { url: redact(options.url), error: reason ?? null });
    if (value) void resubscribe();
    for (const l of listeners) l(value);
  };

  async function resubscribe(): Promise<void> {
    const old = subscriber;
    subscriber = null;
    try {
      old?.close();
    } catch {}
    if (channels.size === 0 || closed) return;
    const sub = new RedisClient(options.url, { ...clientOptions, autoReconnect: false });
    try {
      await sub.connect();
      for (const [channel, listener] of channels) await sub.subscribe(channel, (message) => listener(message));
      subscriber = sub;
      sub.onclose = () => {
        if (subscriber === sub && !closed) setUp(false, "subscriber closed");
      };
    } catch (error) {
      try {
        sub.close();
      } catch {}
      setUp(false, String(error));
    }
  }

  const withTimeout = <T>(promise: Promise<T>): Promise<T> =>
    new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("redis command timed out")), timeoutMs);
      promise.then(
        (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        (e) => {
          clearTimeout(timer);
          reject(e);
        },
      );
    });

  async function call<T>(command: string, args: (string | number)[]): Promise<RedisResult<T>> {
    if (closed) return { ok: false, error: "closed" };
    try {
      const value = (await withTimeout(client.send(command, args.map(String)))) as T;
      setUp(true);
      return { ok: true, value };
    } catch (error) {
      const message = String(error);
      // A script or type error is Redis answering: it is up. Only transport failures count as down.
      if (/CONNECTION|closed|timed out|ECONN|connect/i.test(message)) setUp(false, message);
      return { ok: false, error: message };
    }
  }

  let probing = false;
  const probe = setInterval(() => {
    if (closed || probing) return;
    probing = true;
    void reprobe().finally(() => (probing = false));
  }, probeMs);
  probe.unref?.();

  // A hung command leaves the client unusable: a fresh one is made while down, and connected before
  // the probe's command — without an offline queue, a command sent while it connects fails at once, so
  // a probe that did not wait would never see Redis back unless other traffic did.
  async function reprobe(): Promise<void> {
    if (!up) {
      try {
        client.close();
      } catch {}
      client = new RedisClient(options.url, clientOptions);
      try {
        await withTimeout(client.connect());
      } catch (error) {
        setUp(false, String(error));
        return;
      }
    }
    await readClock();
  }

  // The probe: TIME answers as PING does and keeps the clock offset fresh. A slow answer (one held in
  // a silent connection, delivered late) would make the offset far too low and refuse every acquire
  // until the next probe: only a quick one is taken.
  async function readClock(): Promise<void> {
    const sent = performance.now();
    const result = await call<[string, string]>("TIME", []);
    const now = performance.now();
    if (result.ok && now - sent <= timeoutMs / 4) clockOffset = Number(result.value[0]) * 1000 + Math.floor(Number(result.value[1]) / 1000) - now;
  }

  try {
    await withTimeout(client.connect());
    setUp(true);
    await readClock();
  } catch (error) {
    log.warn("redis_down", { url: redact(options.url), error: String(error) });
  }

  return {
    channel: (name) => clusterChannel(options.url, name),
    get up() {
      return up;
    },
    call,
    fire: (command, args) => void call(command, args),
    async subscribe(channel, listener) {
      channels.set(channel, listener);
      if (subscriber) await subscriber.subscribe(channel, (message) => listener(message));
      else if (up) await resubscribe();
    },
    onChange: (listener) => void listeners.push(listener),
    // `call`'s timer starts after this is read, so a command that ran by then ran before it gave up; a
    // small margin covers the two clocks' drift between reads (one a second).
    commandDeadline: () => (clockOffset === null ? null : Math.floor(performance.now() + clockOffset + timeoutMs - Math.min(50, timeoutMs / 10))),
    close() {
      closed = true;
      clearInterval(probe);
      try {
        client.close();
      } catch {}
      try {
        subscriber?.close();
      } catch {}
    },
  };
}

/**
 * A channel name of the cluster whose keys live in `url`'s database. Keys are scoped by the database
 * number (`redis://HOST:PORT/N`) but pub/sub is not: without the number in the name, two clusters
 * sharing one Redis server on different databases would hear each other's jobs, registry and changes.
 */
export function clusterChannel(url: string, name: string): string {
  const db = databaseOf(url);
  return db === 0 ? `gw:${name}` : `gw:db${db}:${name}`;
}

/** The database number a Redis URL selects (its path, `/N`), 0 when it names none. */
function databaseOf(url: string): number {
  try {
    const db = Number(new URL(url).pathname.slice(1) || "0");
    return Number.isInteger(db) && db >= 0 ? db : 0;
  } catch {
    return 0;
  }
}

/** The URL without its password, for logs. */
export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "redis://?";
  }
}
