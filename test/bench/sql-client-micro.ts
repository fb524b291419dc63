// What one query costs Bun's SQL client and the server, by shape: `bun test/bench/sql-client-micro.ts [N]`.
// Starts a private PostgreSQL (test settings), runs N queries of each shape from 16 workers on a pool of 16,
// and prints client CPU µs and server CPU µs a query.
import { SQL } from "bun";
import { startPostgres } from "../support/postgres.ts";
import { postgresCpuSeconds } from "./children.ts";

const N = Number(process.argv[2] ?? 20000);
const pg = await startPostgres();
const selfCpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};
try {
  const url = await pg.freshDatabase();
  const sql = new SQL(url, { max: 16 });
  await sql`CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)`;
  await sql`CREATE FUNCTION f31(a1 TEXT, a2 INT, a3 TEXT, a4 TEXT, a5 TEXT, a6 BIGINT, a7 BIGINT, a8 BIGINT, a9 BIGINT, a10 BIGINT,
    a11 BIGINT, a12 BIGINT, a13 BIGINT, a14 BOOLEAN, a15 TEXT, a16 BIGINT, a17 BIGINT, a18 BIGINT, a19 TEXT, a20 TEXT, a21 BOOLEAN,
    a22 BIGINT, a23 BIGINT, a24 BIGINT, a25 BIGINT, a26 TEXT[], a27 TEXT[], a28 BIGINT[], a29 BIGINT, a30 TEXT, a31 BOOLEAN)
    RETURNS TABLE (outcome TEXT, posting_id BIGINT, settlement JSON) LANGUAGE sql AS $$ SELECT 'ok', 1::bigint, '{"a":1}'::json $$`;
  let i = 0;
  const shapes: Record<string, () => Promise<unknown>> = {
    "SELECT 1": () => sql`SELECT 1 AS x`,
    "SELECT $1 (one text param)": () => sql`SELECT ${"abc"}::text AS x`,
    "INSERT one row": () => sql`INSERT INTO t (id, v) VALUES (${++i}, ${"x".repeat(64)})`,
    "function, 31 params incl. 3 arrays": () =>
      sql`SELECT * FROM f31(${"req_1"}, ${0}, NULL::text, ${"verified"}, ${null}, ${1}::bigint, ${2}::bigint, ${3}, ${4}, ${5}, ${6}, ${7}, ${8},
        ${true}, ${"a".repeat(64)}::text, ${0}::bigint, ${18}::bigint, ${8}::bigint, ${"normal_done"}::text, ${"stop"}::text, ${false}::boolean,
        ${0}::bigint, ${31}::bigint, ${1}::bigint, ${2}::bigint, ${sql.array(["buyer:a", "platform", "provider:p"], "TEXT")}::text[],
        ${sql.array(["buyer", "platform", "provider"], "TEXT")}::text[], ${sql.array([-10, 2, 8], "INT8")}::int8[], ${3}, ${null}::text, ${true})`,
  };
  for (const [name, run] of Object.entries(shapes)) {
    for (let w = 0; w < 500; w++) await run();
    const c0 = selfCpu();
    const p0 = postgresCpuSeconds(pg.dataDir);
    const t0 = performance.now();
    let left = N;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (left-- > 0) await run();
    }));
    const ms = performance.now() - t0;
    const client = ((selfCpu() - c0) * 1e6) / N;
    const server = ((postgresCpuSeconds(pg.dataDir) - p0) * 1e6) / N;
    console.log(`${name}: ${Math.round(N / (ms / 1000))} q/s, client ${client.toFixed(1)} µs, server ${server.toFixed(1)} µs a query`);
  }
  await sql.close();
} finally {
  pg.destroy();
}
