// A dead node's late write when no owned set names its writer (docs/scale-out.md, "Fencing"): a node
// dies while Redis loses its data, or the whole cluster stops and its first node starts cold. Nobody
// knows the dead incarnation from Redis, so before migration 13 nobody marked it, and an opening it had
// sent into a silent connection landed after the sweep (or the cold start) had resolved its request:
// an attempt pending for good. Every writer now registers in PostgreSQL when its store opens, and the
// sweep and the cold start mark every registered writer that is not alive before reading anything.
// Real PostgreSQL; the dead node's connections go through a TCP proxy that holds the bytes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { SQL } from "bun";
import { recoverPending } from "../../src/gateway/settlement/recovery.ts";
import { isAdoptedElsewhere, type AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { postgresMissing } from "../support/postgres.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { pgStoreWithSide, type PgStoreFixture } from "./pg-store-fixture.ts";

const DAY = "2026-11-28";
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => "written",
    (error) => (isAdoptedElsewhere(error) ? "refused" : `failed: ${String(error)}`),
  );

describe.skipIf(postgresMissing !== null)("a late write of a writer nobody named, on PostgreSQL", () => {
  let pg: PgStoreFixture;
  let side: SQL;
  let proxy: TcpProxy;
  const stores: AsyncStore[] = [];
  beforeAll(async () => {
    pg = await pgStoreWithSide(10_000_000);
    side = pg.side;
    proxy = await startTcpProxy(Number(new URL(pg.url).port));
  }, 60_000);
  afterAll(async () => {
    await proxy?.restore();
    for (const s of stores) await s.close();
    await proxy?.stop();
    await pg?.close();
  });

  /** A node's store (its process's writer), through the proxy unless `direct`. */
  const node = async (writer: string, direct = false) => {
    const url = new URL(pg.url);
    if (!direct) url.port = String(proxy.port);
    const store = await openPostgresStore(url.toString(), { maxConnections: 2, now: () => 1_000, writer });
    stores.push(store);
    return store;
  };
  const reserve = (store: AsyncStore, id: string) => store.reserve({ request_id: id, account_id: "acct_1", payer: "buyer", day: DAY, tokens: 100, credits: 1_000 });
  const rows = async (id: string) => ({
    settlements: (await side`SELECT label, reason FROM settlements WHERE request_id = ${id}`) as { label: string; reason: string | null }[],
    reservation: ((await side`SELECT state FROM reservations WHERE request_id = ${id}`)[0] as { state: string } | undefined)?.state ?? null,
  });
  const marks = async (...writers: string[]) =>
    Object.fromEntries(
      ((await side`SELECT writer, reaped, learned FROM gateway_writers WHERE writer IN ${side(writers)}`) as { writer: string; reaped: number; learned: number }[]).map(
        (r) => [r.writer, [r.reaped, r.learned]],
      ),
    );

  test("the sweep after a Redis data loss marks every writer not alive: the dead node's held opening is refused", async () => {
    const survivor = await node("sweeper-a", true);
    const live = await node("live-a", true);
    const dead = await node("dead-a");
    expect(await marks("sweeper-a", "live-a", "dead-a")).toEqual({ "sweeper-a": [0, 0], "live-a": [0, 0], "dead-a": [0, 0] });
    expect((await reserve(dead, "lost-open")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(dead.recordRouteSnapshot(attempt("lost-open")));
    // The sweep (src/gateway/clusterBridge.ts, sweepOrphans): the live nodes' writers are spared, every
    // other one is marked, then what no live node owns resolves — here the request with no attempt.
    expect(await survivor.writersReapedExcept!(["live-a"])).toBe(1);
    await survivor.markRequestEnded("lost-open");
    expect(await rows("lost-open")).toEqual({ settlements: [], reservation: "released" });
    await proxy.restore();
    expect(await late).toBe("refused");
    expect(await rows("lost-open")).toEqual({ settlements: [], reservation: "released" });
    // The live node writes on, unmarked (the test's "dead" process lives on, and learned from its refusal).
    expect((await reserve(live, "still-live")).ok).toBe(true);
    expect(await marks("sweeper-a", "live-a", "dead-a")).toEqual({ "sweeper-a": [0, 0], "live-a": [0, 0], "dead-a": [1, 1] });
  }, 30_000);

  test("a writer marked since it last learned is not marked again; one that learned (it lived) is", async () => {
    const survivor = await node("sweeper-b", true);
    const alive = await node("alive-b", true);
    await node("gone-b", true);
    const others = ["sweeper-a", "live-a", "dead-a"];
    expect(await survivor.writersReapedExcept!(others)).toBe(2);
    expect(await marks("gone-b", "alive-b")).toEqual({ "gone-b": [1, 0], "alive-b": [1, 0] });
    // alive-b was not dead (split from Redis past the sweep): refused once, it learns and writes again…
    expect(await refusal(reserve(alive, "b-stale"))).toBe("refused");
    expect((await reserve(alive, "b-after")).ok).toBe(true);
    expect(await marks("alive-b")).toEqual({ "alive-b": [1, 1] });
    // …so a later sweep that finds it not alive marks it again; gone-b, refused until it learns (which
    // only a live process does), is not marked twice.
    expect(await survivor.writersReapedExcept!(others)).toBe(1);
    expect(await refusal(reserve(alive, "b-late"))).toBe("refused");
    expect(await marks("gone-b", "alive-b")).toEqual({ "gone-b": [1, 0], "alive-b": [2, 2] });
  }, 30_000);

  test("a cold start marks every other writer before it resumes: the previous process's held opening is refused", async () => {
    const previous = await node("previous-c");
    expect((await reserve(previous, "cold-open")).ok).toBe(true);
    await proxy.cut("blackhole");
    const late = refusal(previous.recordRouteSnapshot(attempt("cold-open")));
    // The whole cluster stopped; the new first node resumes every pending row and ends every request.
    const first = await node("first-c", true);
    expect(await recoverPending(first, () => 1_000, () => {})).toEqual({ resumed: 0, interrupted: 0 });
    expect(await rows("cold-open")).toEqual({ settlements: [], reservation: "released" });
    await proxy.restore();
    expect(await late).toBe("refused");
    expect(await rows("cold-open")).toEqual({ settlements: [], reservation: "released" });
    expect((await marks("previous-c", "first-c"))["first-c"]).toEqual([0, 0]);
    expect((await marks("previous-c"))["previous-c"]![0]).toBeGreaterThan(0);
  }, 30_000);
});
