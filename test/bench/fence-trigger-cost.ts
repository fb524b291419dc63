// What the store's fencing check costs (migration 11, docs/scale-out.md "Fencing"): one server-side loop
// of UPDATEs of pending settlement rows owned by the session's writer, with the owner trigger disabled
// and enabled in turn, ten alternations; prints µs an UPDATE for each. A request updates its attempt's
// row twice (delivered record, settlement).
//   bun test/bench/fence-trigger-cost.ts
import { SQL } from "bun";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { startPostgres } from "../support/postgres.ts";
const pg = await startPostgres();
try {
  const url = await pg.freshDatabase();
  const store = await openPostgresStore(url, { maxConnections: 2, writer: "bench-node" });
  await store.grantCredits("acct_1", 1_000_000);
  await store.reserve({ request_id: "t-1", account_id: "acct_1", payer: "buyer", day: "2026-11-28", tokens: 1, credits: 1 });
  await store.recordRouteSnapshot(attempt("t-1"));
  await store.close();
  const sql = new SQL(url, { max: 1, connection: { "gateway.writer": "bench-node" } });
  const N = 20_000;
  // N pending rows owned by this writer, each updated once a run (a row updated N times in one
  // transaction would make every update walk its chain of versions).
  await sql.unsafe(`INSERT INTO route_snapshots SELECT 'u-' || i, attempt_n, digest, snapshot, created_at_ms FROM route_snapshots, generate_series(1, ${N}) i WHERE request_id = 't-1'`).catch(() => {});
  await sql.unsafe(`INSERT INTO settlements SELECT (jsonb_populate_record(s, jsonb_build_object('request_id', 'u-' || i))).* FROM settlements s, generate_series(1, ${N}) i WHERE s.request_id = 't-1'`);
  let version = 0;
  const run = async () => {
    const hash = (version++ % 16).toString(16).repeat(64);
    const t0 = performance.now();
    await sql.unsafe(`DO $$ BEGIN FOR i IN 1..${N} LOOP UPDATE settlements SET accepted_model_hash = '${hash}' WHERE request_id = 'u-' || i AND attempt_n = 0; END LOOP; END $$`);
    return ((performance.now() - t0) * 1000) / N;
  };
  await run();
  for (let round = 1; round <= 10; round++) {
    await sql`ALTER TABLE settlements DISABLE TRIGGER settlements_owner`;
    const off = await run();
    await sql`ALTER TABLE settlements ENABLE TRIGGER settlements_owner`;
    const on = await run();
    console.log(JSON.stringify({ round, without_check_us: +off.toFixed(2), with_check_us: +on.toFixed(2), added_us: +(on - off).toFixed(2) }));
  }
  await sql.close();
} finally {
  pg.destroy();
}
