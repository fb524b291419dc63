// Preloaded into the gateway (`BENCH_PRELOAD=$PWD/test/bench/sql-timing-preload.ts`: Bun wants an absolute
// path there; see stack.ts); not part
// of the product. Times every bun:sqlite statement run and `exec` (COMMIT, BEGIN) by SQL text, on the
// main thread. On SIGUSR2 it writes the totals since the last signal to
// `$BENCH_SQL_DIR/sql-PID.txt` (total ms, calls, µs a call, slowest ms, SQL), largest total first,
// and starts counting again: send one signal when the measured window opens and one when it closes.
// Each key starts with the connection's synchronous level when the call ran (`[FULL]`, `[NORMAL]`,
// from the last `PRAGMA synchronous = …` seen) and `auto` when no transaction was open (an autocommit
// write then pays its own commit, and at FULL its own fsync, inside the call).
// Bun caches `db.query(sql)` statements and binds per-statement run methods at creation, so each
// statement's methods are wrapped once, when `query`/`prepare` hands it out.
import { Database } from "bun:sqlite";
import { writeFileSync } from "node:fs";

interface Tally {
  calls: number;
  ms: number;
  slowest: number;
}
const tallies = new Map<string, Tally>();
const count = (sql: string, ms: number) => {
  let t = tallies.get(sql);
  if (t === undefined) tallies.set(sql, (t = { calls: 0, ms: 0, slowest: 0 }));
  t.calls++;
  t.ms += ms;
  if (ms > t.slowest) t.slowest = ms;
};
const timed = <A extends unknown[], R>(db: Database, sql: string, run: (...args: A) => R) =>
  function (this: unknown, ...args: A): R {
    const key = tag(db, sql);
    const start = performance.now();
    try {
      return run.apply(this, args);
    } finally {
      count(key, performance.now() - start);
    }
  };

/** Each connection's synchronous level, as last set (the gateway's store opens with FULL). */
const levels = new WeakMap<Database, string>();
const SYNC = /PRAGMA\s+synchronous\s*=\s*(\w+)/i;
const tag = (db: Database, sql: string) => `[${levels.get(db) ?? "?"}${db.inTransaction ? "" : " auto"}] ${sql}`;

const wrapped = new WeakSet<object>();
for (const method of ["query", "prepare"] as const) {
  const original = Database.prototype[method] as unknown as (this: Database, sql: string, ...rest: unknown[]) => Record<string, unknown>;
  (Database.prototype as unknown as Record<string, unknown>)[method] = function (this: Database, sql: string, ...rest: unknown[]) {
    const statement = original.call(this, sql, ...rest);
    if (!wrapped.has(statement)) {
      wrapped.add(statement);
      const text = sql.replace(/\s+/g, " ").slice(0, 120);
      for (const run of ["run", "get", "all", "values"]) {
        const f = statement[run];
        if (typeof f === "function") statement[run] = timed(this, text, f.bind(statement) as (...args: unknown[]) => unknown);
      }
    }
    return statement;
  };
}
const exec = Database.prototype.exec as unknown as (this: Database, sql: string, ...rest: unknown[]) => unknown;
(Database.prototype as unknown as Record<string, unknown>).exec = function (this: Database, sql: string, ...rest: unknown[]) {
  const key = tag(this, `EXEC ${sql.slice(0, 60)}`);
  const start = performance.now();
  try {
    return exec.call(this, sql, ...rest);
  } finally {
    count(key, performance.now() - start);
    const level = SYNC.exec(sql);
    if (level) levels.set(this, level[1]!.toUpperCase());
  }
};

process.on("SIGUSR2", () => {
  const rows = [...tallies]
    .sort((a, b) => b[1].ms - a[1].ms)
    .map(([sql, t]) => `${t.ms.toFixed(1).padStart(9)} ms ${String(t.calls).padStart(8)} ${((t.ms / t.calls) * 1000).toFixed(1).padStart(8)} µs  max ${t.slowest.toFixed(2)} ms  ${sql}`);
  writeFileSync(`${process.env.BENCH_SQL_DIR ?? "/tmp"}/sql-${process.pid}.txt`, `${rows.join("\n")}\n`);
  tallies.clear();
});
