// What the reaped-writer check costs (migration 12, docs/scale-out.md "Fencing"): server-side loops of
// attempt openings and of reservations, each call its own transaction (COMMIT in the loop, as each is
// an autocommit call on the request path), through the functions without the check (the versions
// older nodes call) and with it, alternating for ten rounds; prints µs a call for each. A request
// makes one of each.
//   bun test/bench/writer-check-cost.ts
import { SQL } from "bun";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { startPostgres } from "../support/postgres.ts";

const pg = await startPostgres();
try {
  const url = await pg.freshDatabase();
  const store = await openPostgresStore(url, { maxConnections: 2, writer: "bench-node" });
  await store.grantCredits("acct_1", 1_000_000_000_000);
  await store.close();
  const sql = new SQL(url, { max: 1, connection: { "gateway.writer": "bench-node" } });
  // Another writer was reaped once: the table the check reads is not empty.
  await sql`SELECT gateway_writer_reaped('other-node', 0)`;
  const a = attempt("x");
  const N = 5_000;
  let batch = 0;
  const loop = async (body: (id: string) => string) => {
    const prefix = `b${batch++}-`;
    const t0 = performance.now();
    await sql.unsafe(`DO $$ DECLARE id TEXT; BEGIN FOR i IN 1..${N} LOOP id := '${prefix}' || i; ${body("id")}; COMMIT; END LOOP; END $$`);
    return ((performance.now() - t0) * 1000) / N;
  };
  const q = (s: string) => `'${s.replaceAll("'", "''")}'`;
  const openArgs = (id: string) =>
    `${id}, 0, ${q(a.digest)}, ${q(a.snapshot_json)}, ${q(a.provider_id)}, 'acct_1', 'buyer', 'enforce', 200000, 600000, 9000, 1000`;
  const reserveArgs = (id: string) => `${id}, 'acct_1', 'buyer', '2026-11-28', 1, 1, NULL, 'buyer:acct_1', 1000`;
  const runs = {
    open_without: (id: string) => `PERFORM gateway_open_attempt(${openArgs(id)})`,
    open_with: (id: string) => `PERFORM gateway_open_attempt(${openArgs(id)}, 0)`,
    reserve_without: (id: string) => `PERFORM * FROM gateway_reserve(${reserveArgs(id)})`,
    reserve_with: (id: string) => `PERFORM * FROM gateway_reserve(${reserveArgs(id)}, 0)`,
  };
  // The check alone, in transactions that write nothing else (no commit record): its own cost.
  const checkLoop = async (body: string) => {
    const t0 = performance.now();
    await sql.unsafe(`DO $$ BEGIN FOR i IN 1..${N * 10} LOOP ${body} COMMIT; END LOOP; END $$`);
    return ((performance.now() - t0) * 1000) / (N * 10);
  };
  await loop(runs.open_with);
  await loop(runs.reserve_with);
  const r = (n: number) => +n.toFixed(2);
  const series: Record<string, number[]> = {};
  const add = (name: string, v: number) => (series[name] ??= []).push(v);
  for (let round = 1; round <= 10; round++) {
    const row = {
      round,
      empty_tx: await checkLoop(""),
      check_tx: await checkLoop("PERFORM gateway_writer_live(0);"),
      open_without: await loop(runs.open_without),
      open_with: await loop(runs.open_with),
      reserve_without: await loop(runs.reserve_without),
      reserve_with: await loop(runs.reserve_with),
    };
    for (const [k, v] of Object.entries(row)) if (k !== "round") add(k, v);
    console.log(JSON.stringify(Object.fromEntries(Object.entries(row).map(([k, v]) => [k, k === "round" ? v : r(v)]))));
  }
  const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
  const m = Object.fromEntries(Object.entries(series).map(([k, v]) => [k, median(v)]));
  console.log(JSON.stringify({ medians: Object.fromEntries(Object.entries(m).map(([k, v]) => [k, r(v)])), check_alone_us: r(m.check_tx! - m.empty_tx!), open_added_us: r(m.open_with! - m.open_without!), reserve_added_us: r(m.reserve_with! - m.reserve_without!) }));
  await sql.close();
} finally {
  pg.destroy();
}
