// Settlements and admissions in batches (docs/decisions.md, "Settlements in batches"): the natural
// batcher, the batch function's one outcome per call, exactly one settlement per attempt when a node
// settles many at once (duplicates included), and admissions that never hold more than the balance.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { naturalBatcher } from "../../src/store/postgres/naturalBatch.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { postgresMissing } from "../support/postgres.ts";
import { pgStoreWithSide, type PgStoreFixture } from "./pg-store-fixture.ts";

describe("naturalBatcher", () => {
  test("a call while idle goes alone at once; calls made meanwhile go together after it; a failed batch is retried one by one", async () => {
    const calls: string[] = [];
    const gates: PromiseWithResolvers<void>[] = [];
    const gate = () => {
      const g = Promise.withResolvers<void>();
      gates.push(g);
      return g.promise;
    };
    const one = async (n: number) => {
      calls.push(`one ${n}`);
      await gate();
      if (n === 13) throw new Error("thirteen");
      return n * 10;
    };
    const many = async (ns: number[]) => {
      calls.push(`many ${ns.join(",")}`);
      await gate();
      if (ns.includes(13)) throw new Error("batch with thirteen");
      return ns.map((n) => n * 10);
    };
    const failed: [number, string][] = [];
    const run = naturalBatcher(one, many, 3, (size, error) => failed.push([size, (error as Error).message]));
    const first = run(1);
    expect(calls).toEqual(["one 1"]); // at once, alone
    const rest = [2, 3, 4, 13].map((n) => run(n).catch((e: Error) => e.message));
    expect(calls).toEqual(["one 1"]); // waiting for the call in flight
    gates[0]!.resolve();
    expect(await first).toBe(10);
    await Bun.sleep(0);
    expect(calls).toEqual(["one 1", "many 2,3,4"]); // at most 3 together
    gates[1]!.resolve();
    await Bun.sleep(0);
    expect(calls.at(-1)).toBe("one 13"); // the last one alone
    gates[2]!.resolve();
    expect(await Promise.all(rest)).toEqual([20, 30, 40, "thirteen"]);

    // A batch that fails: each of its calls again alone, each with its own outcome.
    const open = () => gates.at(-1)!.resolve();
    const five = run(5);
    const later = [6, 13].map((n) => run(n).catch((e: Error) => e.message));
    open(); // one 5
    await Bun.sleep(1);
    expect(calls.at(-1)).toBe("many 6,13");
    open(); // the batch fails
    await Bun.sleep(1);
    expect(calls.at(-1)).toBe("one 6");
    open();
    await Bun.sleep(1);
    expect(calls.at(-1)).toBe("one 13");
    open();
    expect(await Promise.all([five, ...later])).toEqual([50, 60, "thirteen"]);
    // Each failed batch was told, once, with its size (a lone call's failure is its caller's).
    expect(failed).toEqual([[2, "batch with thirteen"]]);
  });
});

describe.skipIf(postgresMissing !== null)("settlements in batches on PostgreSQL", () => {
  let pg: PgStoreFixture;
  let store: AsyncStore;
  let side: SQL;
  beforeAll(async () => {
    pg = await pgStoreWithSide(10_000_000);
    ({ store, side } = pg);
  });
  afterAll(() => pg.close());

  test("gateway_settle_attempts: one outcome per call, in the calls' order; an attempt already settled, or twice in the batch, settles once", async () => {
    for (const id of ["b-1", "b-2", "b-3"]) {
      expect((await store.reserve({ request_id: id, account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 })).ok).toBe(true);
      await store.recordRouteSnapshot(attempt(id));
    }
    expect((await store.settleAttempt({ request_id: "b-1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1_000, completion_tokens: 1_000 }, end_request: true })).ok).toBe(true);
    const call = (request_id: string, n: number, charged: boolean) => ({
      request_id,
      attempt_n: 0,
      account: "acct_1",
      label: charged ? "verified" : "zero_settled",
      reason: charged ? null : "nothing_delivered",
      billed_prompt: charged ? 1_000 : 0,
      billed_completion: charged ? 1_000 : 0,
      debit: charged ? 800 : 0,
      provider_credits: charged ? 720 : 0,
      platform_credits: charged ? 80 : 0,
      ended: false,
      accounts: charged ? ["buyer:acct_1", "platform", `provider:${attempt(request_id).provider_id}`] : null,
      kinds: charged ? ["buyer", "platform", "provider"] : null,
      amounts: charged ? [-800, 80, 720] : null,
      now: 1_000,
      end_request: true,
      n,
    });
    const calls = [call("b-1", 0, true), call("b-2", 1, true), call("b-3", 2, false), call("b-2", 3, true)];
    const rows = (await side`SELECT i, outcome, posting_id FROM gateway_settle_attempts(${JSON.stringify(calls)}::text::jsonb) ORDER BY i`) as {
      i: number;
      outcome: string;
      posting_id: string | null;
    }[];
    expect(rows.map((r) => [r.i, r.outcome, r.posting_id !== null])).toEqual([
      [0, "already_settled", false],
      [1, "ok", true],
      [2, "ok", false],
      [3, "already_settled", false],
    ]);
    const [count] = (await side`SELECT COUNT(*)::int AS n FROM ledger_postings WHERE request_id IN ('b-1', 'b-2', 'b-3')`) as { n: number }[];
    expect(count!.n).toBe(2);
    expect(await store.getReservation("b-2")).toMatchObject({ state: "finalised", used_credits: 800 });
    expect(await store.getReservation("b-3")).toMatchObject({ state: "released" });
  });

  test("many settlements at once on one node, each attempt asked twice: each settles exactly once and its caller learns how", async () => {
    const ids = Array.from({ length: 40 }, (_, i) => `m-${i}`);
    for (const id of ids) {
      expect((await store.reserve({ request_id: id, account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 })).ok).toBe(true);
      await store.recordRouteSnapshot(attempt(id));
    }
    const before = await store.ledgerBalance("buyer:acct_1");
    const settleOf = (id: string) =>
      store.settleAttempt({ request_id: id, attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1_000, completion_tokens: 1_000 }, end_request: true });
    const outcomes = await Promise.all([...ids, ...ids].map(settleOf));
    for (const [k, id] of ids.entries()) {
      const pair = [outcomes[k]!, outcomes[k + ids.length]!];
      expect(pair.filter((o) => o.ok)).toHaveLength(1);
      expect(pair.filter((o) => !o.ok && o.code === "already_settled")).toHaveLength(1);
      for (const o of pair) expect(o.ok ? o.settlement.request_id : "").toBe(o.ok ? id : "");
    }
    expect(await store.ledgerBalance("buyer:acct_1")).toBe(before - 800 * ids.length);
    const [count] = (await side`SELECT COUNT(*)::int AS n FROM ledger_postings WHERE request_id LIKE 'm-%'`) as { n: number }[];
    expect(count!.n).toBe(ids.length);
    expect(await store.availableCredits("acct_1")).toBe(before - 800 * ids.length);
    // Batched: the first call alone, the 79 that waited in two batches (at most 64 each) — three
    // transactions wrote the 40 settled rows.
    const [writers] = (await side`SELECT COUNT(DISTINCT xmin::text)::int AS n FROM settlements WHERE request_id LIKE 'm-%'`) as { n: number }[];
    expect(writers!.n).toBeLessThanOrEqual(3);
  });

  test("many admissions of one account at once on one node: batched, each sees the holds before it, duplicates refused", async () => {
    await store.grantCredits("acct_2", 10_500);
    const reserveOf = (request_id: string) =>
      store.reserve({ request_id, account_id: "acct_2", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000, daily_token_limit: 1_000_000 });
    const ids = Array.from({ length: 30 }, (_, i) => `a-${i}`);
    const outcomes = await Promise.all([...ids, "a-3"].map(reserveOf));
    const admitted = outcomes.filter((o) => o.ok);
    expect(admitted).toHaveLength(10);
    const refused = outcomes.filter((o) => !o.ok);
    expect(refused.filter((o) => o.code === "duplicate_request")).toHaveLength(1);
    const short = refused.filter((o) => o.code === "insufficient_balance");
    expect(short).toHaveLength(20);
    for (const o of short) expect(o).toMatchObject({ available_credits: 500 });
    expect(await store.availableCredits("acct_2")).toBe(500);
    const [writers] = (await side`SELECT COUNT(DISTINCT xmin::text)::int AS n FROM reservations WHERE account_id = 'acct_2'`) as { n: number }[];
    expect(writers!.n).toBeLessThanOrEqual(2);
  });
});
