// A cluster node's request path through the PostgreSQL store alone (no gateway, no provider): the
// store calls one non-streaming request makes, in the order the gateway makes them, by CONCURRENCY
// workers on one paid account for a fixed time, against a private PostgreSQL with the test settings
// (test/support/postgres.ts). Prints requests/s, PostgreSQL's CPU a request (its processes, /proc) and
// this process's CPU a request (the SQL client's side). Transactions a request, by construction: five with
// `current`, seven with `separate`, nine on builds without the key and attempt-head caches; fewer on
// builds that batch waiting settlements and admissions (migrations 7 and 8).
//   bun test/bench/pg-request-path.ts [--sequence current|separate] [--concurrency N] [--seconds S] [--statements N] [--writer ID|""]
// --writer: the store's connections carry it as a cluster node's do (fencing, migration 11; default
// "bench-node"); "" opens the store as the operator CLI does, unchecked.
// --statements N also lists the N statements with the most execution time a request (pg_stat_statements,
// nested ones included). --functions also lists every function's (triggers' too) calls and self time a
// request (track_functions) and each table's sequential and index scans and row updates (HOT ones too) a
// request.
// `separate` makes the calls as builds before 2026-11-27 10:00 did (accepted measurement and request
// end as transactions of their own): the A/B of docs/scale-out.md "Measured" runs it in the old tree.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { SQL } from "bun";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { startPostgres } from "../support/postgres.ts";

const { values } = parseArgs({
  options: {
    sequence: { type: "string", default: "current" },
    concurrency: { type: "string", default: "16" },
    seconds: { type: "string", default: "8" },
    statements: { type: "string", default: "0" },
    functions: { type: "boolean", default: false },
    writer: { type: "string", default: "bench-node" },
  },
});
const STATEMENTS = Number(values.statements);
const FUNCTIONS = values.functions === true;
// Read by test/support/postgres.ts when it starts the server.
process.env.GATEWAY_TEST_PG_OPTIONS = [
  process.env.GATEWAY_TEST_PG_OPTIONS ?? "",
  STATEMENTS > 0 ? "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" : "",
  FUNCTIONS ? "-c track_functions=all" : "",
  STATEMENTS > 0 ? "-c pg_stat_statements.track_planning=on" : "",
].join(" ");
const separate = values.sequence === "separate";
const CONCURRENCY = Number(values.concurrency);
const SECONDS = Number(values.seconds);

const ticks = (pid: number): number => {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return Number(fields[11]) + Number(fields[12]);
  } catch {
    return 0;
  }
};
const postgresCpu = (dataDir: string): number => {
  const postmaster = Number(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
  const children = Bun.spawnSync(["ps", "-o", "pid=", "--ppid", String(postmaster)]).stdout.toString().split("\n").filter((l) => l.trim());
  return [postmaster, ...children.map(Number)].reduce((sum, pid) => sum + ticks(pid), 0) / 100;
};
const selfCpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

const pg = await startPostgres();
try {
  const url = await pg.freshDatabase();
  const store = await openPostgresStore(url, { maxConnections: 16, ...(values.writer ? { writer: values.writer } : {}) });
  const { account_id } = await store.createAccount({ tier: "paid", name: "bench" });
  const { api_key } = await store.createApiKey({ account_id });
  await store.grantCredits(account_id, 1e15);
  const delivered = {
    output_hash: "1".repeat(64),
    start_byte: 0,
    end_byte: 18,
    tokens: 8,
    terminal_state: "normal_done" as const,
    finish_reason: "stop",
    tool_calls_delivered: false,
    tool_call_bytes: 0,
    reported_input_tokens: 31,
  };
  const modelHash = "a".repeat(64);
  // A receipt envelope the size of a real one (test/fixtures/receipts/receipt.env: 1,826 characters).
  const ENVELOPE = `${"e".repeat(1_739)}.${"s".repeat(86)}`;
  let seq = 0;
  const oneRequest = async () => {
    const request_id = `req_${process.pid}_${++seq}`;
    const now = Date.now();
    if ((await store.authenticateApiKey(api_key, now)) === null) throw new Error("key refused");
    const reserved = await store.reserve({ request_id, account_id, payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 }, now);
    if (!reserved.ok) throw new Error(`reserve: ${reserved.code}`);
    await store.recordRouteSnapshot(attempt(request_id, 0, { account_id }), now);
    if (separate) await store.recordAcceptedMeasurement(request_id, 0, modelHash);
    await store.recordAttemptEnd(request_id, 0, delivered, now + 60_000, now, ...(separate ? [] : [modelHash]));
    if (separate) await store.markRequestEnded(request_id, now);
    const arrival_id = await store.recordReceiptArrival({ request_id, attempt_n: 0, provider_id: "p", envelope: ENVELOPE, disposition: "judged" }, now);
    const settled = await store.settleAttempt(
      {
        request_id,
        attempt_n: 0,
        label: "verified",
        reason: null,
        receipt: { envelope: ENVELOPE, received_at_ms: now, arrival_id },
        billed: { prompt_tokens: 31, completion_tokens: 8 },
        ...(separate ? {} : { end_request: true }),
      },
      now,
    );
    if (!settled.ok) throw new Error(`settle: ${settled.code}`);
  };
  // Warm-up: every pool connection has planned every statement.
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    for (let i = 0; i < 20; i++) await oneRequest();
  }));
  const stats = new SQL(url, { max: 1 });
  if (STATEMENTS > 0) {
    await stats`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`;
    await stats`SELECT pg_stat_statements_reset()`;
  }
  // Cumulative function and table counters, read before and after the window.
  const counters = async () => {
    if (!FUNCTIONS) return new Map<string, number[]>();
    await stats`SELECT pg_stat_clear_snapshot()`;
    const functions = (await stats`SELECT funcname AS name, calls, self_time FROM pg_stat_user_functions`) as { name: string; calls: string; self_time: number }[];
    const tables = (await stats`SELECT relname AS name, seq_scan, idx_scan, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables`) as {
      name: string;
      seq_scan: string;
      idx_scan: string | null;
      n_tup_upd: string;
      n_tup_hot_upd: string;
    }[];
    return new Map<string, number[]>([
      ...functions.map((f) => [`function ${f.name}`, [Number(f.calls), f.self_time]] as [string, number[]]),
      ...tables.map((t) => [`table ${t.name}`, [Number(t.seq_scan), Number(t.idx_scan ?? 0), Number(t.n_tup_upd), Number(t.n_tup_hot_upd)]] as [string, number[]]),
    ]);
  };
  const counters0 = await counters();
  const pg0 = postgresCpu(pg.dataDir);
  const self0 = selfCpu();
  const start = performance.now();
  const end = start + SECONDS * 1000;
  let done = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < end) {
        await oneRequest();
        done++;
      }
    }),
  );
  const elapsed = (performance.now() - start) / 1000;
  const pgCpu = postgresCpu(pg.dataDir) - pg0;
  const clientCpu = selfCpu() - self0;
  const statements =
    STATEMENTS > 0
      ? (
          (await stats`SELECT query, calls, plans, total_exec_time, total_plan_time, toplevel FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT ${STATEMENTS}`) as {
            query: string;
            calls: string | number;
            plans: string | number;
            total_exec_time: number;
            total_plan_time: number;
            toplevel: boolean;
          }[]
        ).map((r) => ({
          query: r.query.replace(/\s+/g, " ").slice(0, 100),
          toplevel: r.toplevel,
          calls_per_request: Math.round((Number(r.calls) / done) * 100) / 100,
          exec_us_per_request: Math.round((r.total_exec_time * 1000) / done),
          plans_per_request: Math.round((Number(r.plans) / done) * 100) / 100,
          plan_us_per_request: Math.round((r.total_plan_time * 1000) / done),
        }))
      : undefined;
  const counters1 = await counters();
  const perRequest = (x: number) => Math.round((x / done) * 100) / 100;
  const functions = [...counters1].filter(([k]) => k.startsWith("function ")).map(([k, [calls, self]]) => {
    const [calls0, self0] = counters0.get(k) ?? [0, 0];
    return { function: k.slice(9), calls_per_request: perRequest(calls! - calls0!), self_us_per_request: Math.round(((self! - self0!) * 1000) / done) };
  }).filter((f) => f.calls_per_request > 0).sort((a, b) => b.self_us_per_request - a.self_us_per_request);
  const tables = [...counters1].filter(([k]) => k.startsWith("table ")).map(([k, [seq, idx, upd, hot]]) => {
    const [seq0, idx0, upd0, hot0] = counters0.get(k) ?? [0, 0, 0, 0];
    return {
      table: k.slice(6),
      seq_scans_per_request: perRequest(seq! - seq0!),
      index_scans_per_request: perRequest(idx! - idx0!),
      // Row updates a request, and those that were HOT (no index entry written: the page had room).
      updates_per_request: perRequest(upd! - upd0!),
      hot_updates_per_request: perRequest(hot! - hot0!),
    };
  }).filter((t) => t.seq_scans_per_request + t.index_scans_per_request + t.updates_per_request > 0);
  console.log(
    JSON.stringify({
      sequence: values.sequence,
      concurrency: CONCURRENCY,
      requests_per_s: Math.round(done / elapsed),
      postgres_cpu_us_per_request: Math.round((pgCpu * 1e6) / done),
      client_cpu_us_per_request: Math.round((clientCpu * 1e6) / done),
      ...(statements ? { statements } : {}),
      ...(FUNCTIONS ? { functions, tables } : {}),
    }, null, 1),
  );
  await stats.close();
  await store.close();
} finally {
  pg.destroy();
}
