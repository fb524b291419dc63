// A dead node's late write (docs/scale-out.md, "Fencing"): a node cut from PostgreSQL sends an
// attempt's opening or a reservation into a silent connection and dies; a survivor reaps it, finds
// nothing of that request and resolves it; then the connection lets the bytes go. Without the writer's
// mark the write commits after the reap: an attempt pending for good, or credits held for good, with
// nobody left to resolve them (the cluster chaos's splitkill, seed 41115). The survivor marks the dead
// writer reaped before it reads anything, and the mark and the write exclude each other: a write in
// flight commits before the mark (and the survivor reads it), a write arriving after it is refused.
// Where no owned set names the dead writer — a node that died while Redis lost its data, or a cold
// start of the whole cluster — the sweep and the cold start mark every writer registered in the store
// (migration 13) that is not alive. Real PostgreSQL; the dead node's connections go through a TCP proxy
// that holds the bytes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { SQL } from "bun";
import { recoverOne, recoverPending } from "../../src/gateway/settlement/recovery.ts";
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

  const marks = async (...writers: string[]) =>
    Object.fromEntries(
      ((await side`SELECT writer, reaped, learned FROM gateway_writers WHERE writer IN ${side(writers)}`) as { writer: string; reaped: number; learned: number }[]).map(
        (r) => [r.writer, [r.reaped, r.learned]],
      ),
    );

  test("the sweep after a Redis data loss marks every writer not alive: the dead node's held opening is refused", async () => {
    const sweeper = await node("sweeper-a", false);
    const live = await node("live-a", false);
    const dead = await node("dead-a");
    expect(await marks("sweeper-a", "live-a", "dead-a")).toEqual({ "sweeper-a": [0, 0], "live-a": [0, 0], "dead-a": [0, 0] });
    expect((await reserve(dead, "lost-open")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(dead.recordRouteSnapshot(attempt("lost-open")));
    // The sweep (src/gateway/clusterBridge.ts, sweepOrphans): the live nodes' writers are spared, every
    // other one is marked, then what no live node owns resolves — here the request with no attempt.
    await sweeper.writersReapedExcept!(["live-a"]);
    await sweeper.markRequestEnded("lost-open");
    expect(await rows("lost-open")).toEqual({ settlements: [], reservation: "released" });
    await proxy.restore();
    expect(await late).toBe("refused");
    expect(await rows("lost-open")).toEqual({ settlements: [], reservation: "released" });
    // The live node writes on, unmarked (the test's "dead" process lives on, and learned from its refusal).
    expect((await reserve(live, "still-live")).ok).toBe(true);
    expect(await marks("sweeper-a", "live-a", "dead-a")).toEqual({ "sweeper-a": [0, 0], "live-a": [0, 0], "dead-a": [1, 1] });
  }, 30_000);

  test("a writer marked since it last learned is not marked again; one that learned (it lived) is", async () => {
    const sweeper = await node("sweeper-b", false);
    const alive = await node("alive-b", false);
    await node("gone-b", false);
    const others = ["sweeper-a", "live-a", "dead-a"];
    // (The writers of the tests above were marked by the sweep above; they did not learn since.)
    expect(await sweeper.writersReapedExcept!(others)).toBe(2);
    expect(await marks("gone-b", "alive-b")).toEqual({ "gone-b": [1, 0], "alive-b": [1, 0] });
    // alive-b was not dead (split from Redis past the sweep): refused once, it learns and writes again…
    expect(await refusal(reserve(alive, "b-stale"))).toBe("refused");
    expect((await reserve(alive, "b-after")).ok).toBe(true);
    expect(await marks("alive-b")).toEqual({ "alive-b": [1, 1] });
    // …so a later sweep that finds it not alive marks it again; gone-b, refused until it learns (which
    // only a live process does), is not marked twice.
    expect(await sweeper.writersReapedExcept!(others)).toBe(1);
    expect(await refusal(reserve(alive, "b-late"))).toBe("refused");
    expect(await marks("gone-b", "alive-b")).toEqual({ "gone-b": [1, 0], "alive-b": [2, 2] });
  }, 30_000);

  test("a cold start marks every other writer before it resumes: the previous process's held opening is refused", async () => {
    const previous = await node("previous-c");
    expect((await reserve(previous, "cold-open")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(previous.recordRouteSnapshot(attempt("cold-open")));
    // The whole cluster stopped; the new first node resumes every pending row and ends every request.
    const first = await node("first-c", false);
    await recoverPending(first, () => 1_000, () => {});
    expect(await rows("cold-open")).toEqual({ settlements: [], reservation: "released" });
    await proxy.restore();
    expect(await late).toBe("refused");
    expect(await rows("cold-open")).toEqual({ settlements: [], reservation: "released" });
    expect((await marks("previous-c", "first-c"))["first-c"]).toEqual([0, 0]);
    expect((await marks("previous-c"))["previous-c"]![0]).toBeGreaterThan(0);
  }, 30_000);
});
