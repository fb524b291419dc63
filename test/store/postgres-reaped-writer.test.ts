// A dead node's late write (docs/scale-out.md, "Fencing"): a node cut from PostgreSQL sends an
// attempt's opening or a reservation into a silent connection and dies; a survivor reaps it, finds
// nothing of that request and resolves it; then the connection lets the bytes go. Without the writer's
// mark the write commits after the reap: an attempt pending for good, or credits held for good, with
// nobody left to resolve them (the cluster chaos's splitkill, seed 41115). The survivor marks the dead
// writer reaped before it reads anything, and the mark and the write exclude each other: a write in
// flight commits before the mark (and the survivor reads it), a write arriving after it is refused.
// Real PostgreSQL; the dead node's connections go through a TCP proxy that holds the bytes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { SQL } from "bun";
import { recoverOne } from "../../src/gateway/settlement/recovery.ts";
import { isAdoptedElsewhere, type AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { waitFor } from "../support/harness.ts";
import { postgresMissing } from "../support/postgres.ts";
import { holdShareLock } from "../support/tableLock.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { pgStoreWithSide, type PgStoreFixture } from "./pg-store-fixture.ts";

const DAY = "2026-11-28";
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => "written",
    (error) => (isAdoptedElsewhere(error) ? "refused" : `failed: ${String(error)}`),
  );

describe.skipIf(postgresMissing !== null)("a reaped writer's late write on PostgreSQL", () => {
  let pg: PgStoreFixture;
  let side: SQL;
  let proxy: TcpProxy;
  /** The survivor's process, and each dead node's (its connections through the proxy). */
  let survivor: AsyncStore;
  const stores: AsyncStore[] = [];
  beforeAll(async () => {
    pg = await pgStoreWithSide(10_000_000);
    side = pg.side;
    proxy = await startTcpProxy(Number(new URL(pg.url).port));
    survivor = await openPostgresStore(pg.url, { maxConnections: 2, now: () => 1_000, writer: "survivor-a" });
  }, 60_000);
  afterAll(async () => {
    await proxy?.restore();
    for (const s of stores) await s.close();
    await survivor?.close();
    await proxy?.stop();
    await pg?.close();
  });

  const node = async (writer: string, proxied = true) => {
    const url = new URL(pg.url);
    if (proxied) url.port = String(proxy.port);
    const store = await openPostgresStore(url.toString(), { maxConnections: 2, now: () => 1_000, writer });
    stores.push(store);
    return store;
  };
  const reserve = (store: AsyncStore, id: string) => store.reserve({ request_id: id, account_id: "acct_1", payer: "buyer", day: DAY, tokens: 100, credits: 1_000 });
  const rows = async (id: string) => ({
    settlements: (await side`SELECT label, reason FROM settlements WHERE request_id = ${id}`) as { label: string; reason: string | null }[],
    reservation: ((await side`SELECT state FROM reservations WHERE request_id = ${id}`)[0] as { state: string } | undefined)?.state ?? null,
  });
  /** The reaper's resolution of a request the dead node owned (src/gateway/clusterBridge.ts, resolveOwned). */
  const reap = async (writer: string, id: string) => {
    await survivor.writerReaped!(writer);
    const resumed = await recoverOne(survivor, () => 1_000, id, 0, () => {});
    await survivor.markRequestEnded(id);
    return resumed;
  };

  test("an opening held in the network lands after the reap: refused, and the request stays resolved", async () => {
    const dead = await node("n4-a");
    expect((await reserve(dead, "late-open")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(dead.recordRouteSnapshot(attempt("late-open")));
    // n4 is killed; a survivor reaps it: no attempt of the request yet, so the request resolves.
    expect(await reap("n4-a", "late-open")).toBe(false);
    expect(await rows("late-open")).toEqual({ settlements: [], reservation: "released" });
    // The proxy lets the held bytes go.
    await proxy.restore();
    const outcome = await late;
    expect(await rows("late-open")).toEqual({ settlements: [], reservation: "released" });
    expect(outcome).toBe("refused");
  }, 30_000);

  test("a reservation held in the network lands after the reap: refused, no credits held", async () => {
    const dead = await node("n5-a");
    expect((await reserve(dead, "warm")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(reserve(dead, "late-hold"));
    await reap("n5-a", "late-hold");
    await proxy.restore();
    const outcome = await late;
    expect(await rows("late-hold")).toEqual({ settlements: [], reservation: null });
    expect(outcome).toBe("refused");
    expect((await side`SELECT held_credits::int AS c FROM reservation_holds WHERE account_id = 'acct_1'`)[0]).toEqual({ c: 1_000 });
  }, 30_000);

  test("the reap waits for an opening in flight, then reads and resolves it", async () => {
    const dead = await node("n6-a", false);
    expect((await reserve(dead, "in-flight")).ok).toBe(true);
    // The opening starts and waits inside PostgreSQL (its insert behind a table lock) when n6 dies.
    const lock = await holdShareLock(pg.url, "route_snapshots");
    const waitingOn = async (what: string) =>
      ((await side`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = ${what}`)[0] as { n: number }).n;
    const opened = dead.recordRouteSnapshot(attempt("in-flight"));
    await waitFor(async () => (await waitingOn("relation")) === 1, 10_000, "the opening waiting");
    const reaped = reap("n6-a", "in-flight");
    await waitFor(async () => (await waitingOn("advisory")) === 1, 10_000, "the reaper's mark waiting for the opening");
    await lock.release();
    expect((await opened).ok).toBe(true);
    // The survivor saw the attempt: claimed and resolved as interrupted (nothing delivered), not left behind.
    expect(await reaped).toBe(false);
    expect(await rows("in-flight")).toEqual({ settlements: [{ label: "quarantined", reason: "interrupted" }], reservation: "released" });
  }, 30_000);

  test("a writer reaped while alive is refused once, then writes again; a writer-less store is never checked", async () => {
    const alive = await node("n7-a", false);
    expect((await reserve(alive, "before")).ok).toBe(true);
    await survivor.writerReaped!("n7-a");
    // What it made before it learned of the reap is refused, batched or alone (a failed batch is
    // retried call by call); the refusal teaches it the reap.
    expect(await Promise.all(["stale", "stale-2", "stale-3"].map((id) => refusal(reserve(alive, id))))).toEqual(["refused", "refused", "refused"]);
    expect((await reserve(alive, "after")).ok).toBe(true);
    expect((await alive.recordRouteSnapshot(attempt("after"))).ok).toBe(true);
    await survivor.writerReaped!("n7-a");
    expect(await refusal(alive.recordRouteSnapshot(attempt("after", 1)))).toBe("refused");
    expect((await alive.recordRouteSnapshot(attempt("after", 2))).ok).toBe(true);
    expect((await reserve(pg.store, "operator")).ok).toBe(true);
    expect(await rows("stale")).toEqual({ settlements: [], reservation: null });
  }, 30_000);
});
