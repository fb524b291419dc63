// Fencing by the store (docs/scale-out.md, "Fencing"): an attempt's row names the cluster node process
// that may write it. A survivor claims a dead node's attempt before it reads it; from then on, every
// write of that attempt by the old owner — a process that stalled past its membership and woke — is
// refused in its own transaction (SQLSTATE GWF01), whatever its label still says. Without the check
// such a write lands while the attempt is still pending: a delivered record the survivor never read,
// or a settlement of an attempt the survivor is resolving.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { SQL } from "bun";
import { isAdoptedElsewhere, type AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { attempt, delivered } from "../ledger/attempt-fixture.ts";
import { postgresMissing } from "../support/postgres.ts";
import { pgStoreWithSide, type PgStoreFixture } from "./pg-store-fixture.ts";

const refusal = (p: Promise<unknown>) =>
  p.then(
    () => "written",
    (error) => (isAdoptedElsewhere(error) ? "adopted_elsewhere" : `failed: ${String(error)}`),
  );

describe.skipIf(postgresMissing !== null)("writes fenced by the attempt's owner on PostgreSQL", () => {
  let pg: PgStoreFixture;
  let side: SQL;
  /** The stalled node's process and the survivor's. */
  let stale: AsyncStore;
  let survivor: AsyncStore;
  beforeAll(async () => {
    pg = await pgStoreWithSide(10_000_000);
    side = pg.side;
    stale = await openPostgresStore(pg.url, { maxConnections: 4, now: () => 1_000, writer: "n1-incarnation-a" });
    survivor = await openPostgresStore(pg.url, { maxConnections: 4, now: () => 1_000, writer: "n2-incarnation-a" });
  }, 60_000);
  afterAll(async () => {
    await stale?.close();
    await survivor?.close();
    await pg?.close();
  });

  const open = async (store: AsyncStore, id: string) => {
    expect((await store.reserve({ request_id: id, account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 })).ok).toBe(true);
    expect((await store.recordRouteSnapshot(attempt(id))).ok).toBe(true);
  };
  const row = async (id: string) =>
    ((await side`SELECT owner, label, reason, ended_at_ms, accepted_model_hash FROM settlements WHERE request_id = ${id}`) as Record<string, unknown>[])[0];
  const postings = async (id: string) => ((await side`SELECT count(*)::int AS n FROM ledger_postings WHERE request_id = ${id}`)[0] as { n: number }).n;

  test("an attempt is its opener's; once a survivor claimed it, the opener's delivered record, measurement and settlement are refused", async () => {
    await open(stale, "f-1");
    expect(await row("f-1")).toMatchObject({ owner: "n1-incarnation-a", label: "pending" });
    // The owner writes its own attempt as always.
    expect(await stale.recordAcceptedMeasurement("f-1", 0, "a".repeat(64))).toBe(true);

    // n1 is taken for dead: n2 claims the attempt, then reads it.
    await survivor.claimAttempt!("f-1", 0);
    expect(await row("f-1")).toMatchObject({ owner: "n2-incarnation-a", label: "pending", ended_at_ms: null });

    // n1 wakes and writes on: each write refused, nothing of it written.
    expect(await refusal(stale.recordAttemptEnd("f-1", 0, delivered, 5_000, 1_000, null))).toBe("adopted_elsewhere");
    expect(
      await refusal(stale.settleAttempt({ request_id: "f-1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 30, completion_tokens: 4 }, end_request: true })),
    ).toBe("adopted_elsewhere");
    expect(await row("f-1")).toMatchObject({ owner: "n2-incarnation-a", label: "pending", ended_at_ms: null });
    expect(await postings("f-1")).toBe(0);

    // The survivor's resolution stands, once.
    const settled = await survivor.settleAttempt({ request_id: "f-1", attempt_n: 0, label: "quarantined", reason: "interrupted", billed: null, end_request: true });
    expect(settled.ok).toBe(true);
    expect(await row("f-1")).toMatchObject({ label: "quarantined", reason: "interrupted" });
    expect(await survivor.getReservation("f-1")).toMatchObject({ state: "released" });
  });

  test("a write the old owner made before the claim is the survivor's to read", async () => {
    await open(stale, "f-2");
    expect(await stale.recordAttemptEnd("f-2", 0, delivered, 5_000, 1_000, null)).toBe(true);
    await survivor.claimAttempt!("f-2", 0);
    expect((await survivor.getSettlement("f-2", 0))?.delivered?.tokens).toBe(delivered.tokens);
  });

  test("in one batch of the old owner's settlements, only the adopted attempt is refused", async () => {
    await open(stale, "f-3");
    await open(stale, "f-4");
    await open(stale, "f-5");
    await survivor.claimAttempt!("f-4", 0);
    const settle = (id: string) =>
      refusal(stale.settleAttempt({ request_id: id, attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 30, completion_tokens: 4 }, end_request: true }));
    // Sent together: the later ones go in one batch, which fails as a whole and is retried one by one.
    expect(await Promise.all(["f-3", "f-4", "f-5"].map(settle))).toEqual(["written", "adopted_elsewhere", "written"]);
    expect([await postings("f-3"), await postings("f-4"), await postings("f-5")]).toEqual([1, 0, 1]);
  });

  test("a cold start claims every pending attempt; a writer-less connection (operator CLI) is never refused", async () => {
    await open(stale, "f-6");
    await survivor.claimPending!();
    expect(await row("f-6")).toMatchObject({ owner: "n2-incarnation-a" });
    expect(await refusal(stale.recordAcceptedMeasurement("f-6", 0, "b".repeat(64)))).toBe("adopted_elsewhere");
    // The fixture's store has no writer: it opens unowned rows and may write any.
    await open(pg.store, "f-7");
    expect(await row("f-7")).toMatchObject({ owner: null });
    expect(await stale.recordAcceptedMeasurement("f-7", 0, "c".repeat(64))).toBe(true);
    expect(await pg.store.recordAcceptedMeasurement("f-6", 0, "d".repeat(64))).toBe(true);
  });
});
