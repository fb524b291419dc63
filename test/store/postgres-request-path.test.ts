// The PostgreSQL store's request path (docs/decisions.md, "PostgreSQL on the request path"): which
// transactions skip the WAL flush, that a lock held elsewhere delays only the writes that need it, and
// that an effect of one request waits for that request's writes only.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { postgresMissing } from "../support/postgres.ts";
import { pgStoreWithSide, type PgStoreFixture } from "./pg-store-fixture.ts";

describe.skipIf(postgresMissing !== null)("PostgreSQL request path", () => {
  let pg: PgStoreFixture;
  let url: string;
  let store: AsyncStore;
  let side: SQL;
  beforeAll(async () => {
    pg = await pgStoreWithSide(1_000_000);
    ({ url, store, side } = pg);
  });
  afterAll(() => pg.close());

  /** The synchronous_commit level a function call leaves for the rest of its transaction. */
  const levelAfter = async (call: string) =>
    side.begin(async (tx) => {
      await tx.unsafe("SET LOCAL synchronous_commit TO on");
      await tx.unsafe(call);
      const [row] = await tx.unsafe("SHOW synchronous_commit");
      return (row as { synchronous_commit: string }).synchronous_commit;
    });

  test("the reservation and the attempt's opening commit without waiting for the WAL flush; the settlement waits", async () => {
    expect(await levelAfter("SELECT * FROM gateway_reserve('lvl-1', 'acct_1', 'buyer', '2026-11-27', 10, 10, NULL, 'buyer:acct_1', 1000)")).toBe("off");
    const a = attempt("lvl-2");
    expect(
      await levelAfter(
        `SELECT gateway_open_attempt('lvl-2', 0, '${a.digest}', '${a.snapshot_json.replace(/'/g, "''")}', '${a.provider_id}', 'acct_1', 'buyer', 'enforce', 1, 1, 9000, 1000)`,
      ),
    ).toBe("off");
    await store.recordRouteSnapshot(attempt("lvl-3"));
    expect(
      await levelAfter(
        "SELECT * FROM gateway_settle('lvl-3', 0, 'acct_1', 'zero_settled', 'nothing_delivered', NULL, NULL, NULL, 0, 0, 0, 0, 0, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1000)",
      ),
    ).toBe("on");
    expect(await levelAfter("SELECT gateway_end_request('lvl-3', 1000)")).toBe("on");
    // The batches keep their calls' tiers (migrations 7 and 8).
    const reserves = JSON.stringify([1, 2].map((n) => ({ request_id: `lvl-b${n}`, account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 1, credits: 1, ledger_account: "buyer:acct_1", now: 1000, n: n - 1 })));
    expect(await levelAfter(`SELECT * FROM gateway_reserves('${reserves}')`)).toBe("off");
    await store.recordRouteSnapshot(attempt("lvl-4"));
    const settles = JSON.stringify([{ request_id: "lvl-4", attempt_n: 0, account: "acct_1", label: "zero_settled", reason: "nothing_delivered", billed_prompt: 0, billed_completion: 0, debit: 0, provider_credits: 0, platform_credits: 0, ended: false, now: 1000, end_request: true, n: 0 }]);
    expect(await levelAfter(`SELECT * FROM gateway_settle_attempts('${settles}')`)).toBe("on");
  });

  test("an effect of one request waits for that request's writes only; without a request it waits for all", async () => {
    // Another session holds the account's lock: request A's reservation waits for it.
    const held = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    const holder = side.begin(async (tx) => {
      await tx`SELECT pg_advisory_xact_lock(hashtextextended('a:acct_1', 0))`;
      held.resolve();
      await release.promise;
    });
    await held.promise;
    const reserveA = store.reserve({ request_id: "conv-a", account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 10, credits: 10 });
    const order: string[] = [];
    try {
      store.afterCommit(() => order.push("all"));
      const snapshotB = store.recordRouteSnapshot(attempt("conv-b"));
      store.afterCommit((committed) => order.push(`b:${committed}`), "conv-b");
      store.afterCommit((committed) => order.push(`a:${committed}`), "conv-a");
      await snapshotB;
      await Bun.sleep(0);
      // B's effect ran; A's and the node-wide one still wait for A's reservation behind the lock.
      expect(order).toEqual(["b:true"]);
    } finally {
      release.resolve();
      await holder;
    }
    expect((await reserveA).ok).toBe(true);
    await Bun.sleep(0);
    expect(order.sort()).toEqual(["a:true", "all", "b:true"]);
  });

  test("writesAfter: the request's later writes wait for the gate, and so do its effects; another request's do not", async () => {
    await store.recordRouteSnapshot(attempt("gated"));
    const gate = Promise.withResolvers<void>();
    store.writesAfter!("gated", gate.promise);
    const order: string[] = [];
    const delivered = { output_hash: "1".repeat(64), start_byte: 0, end_byte: 18, tokens: 8, terminal_state: "normal_done" as const, finish_reason: "stop", tool_calls_delivered: false, tool_call_bytes: 0, reported_input_tokens: 31 };
    const ended = store.recordAttemptEnd("gated", 0, delivered, 2_000, 1_500).then((written) => order.push(`written:${written}`));
    store.afterCommit((committed) => order.push(`effect:${committed}`), "gated");
    // Another request's write goes through meanwhile; the gated one has not been sent.
    await store.recordRouteSnapshot(attempt("not-gated"));
    const endedAt = async () => ((await side`SELECT ended_at_ms FROM settlements WHERE request_id = 'gated'`)[0] as { ended_at_ms: unknown }).ended_at_ms;
    expect(await endedAt()).toBeNull();
    expect(order).toEqual([]);
    gate.resolve();
    await ended;
    await Bun.sleep(0);
    expect(order).toEqual(["written:true", "effect:true"]);
    expect(Number(await endedAt())).toBe(1_500);
  });

  test("the settlement prices the charge, posts it and resolves the reservation in one call", async () => {
    expect((await store.reserve({ request_id: "one-call", account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 })).ok).toBe(true);
    await store.recordRouteSnapshot(attempt("one-call"));
    await store.markRequestEnded("one-call");
    const settled = await store.settleAttempt({ request_id: "one-call", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1_000, completion_tokens: 1_000 } });
    expect(settled).toMatchObject({ ok: true, settlement: { label: "verified", debit_credits: 800, provider_credits: 720, platform_credits: 80 } });
    expect(await store.getReservation("one-call")).toMatchObject({ state: "finalised", used_credits: 800, used_tokens: 2_000 });
    const again = await store.settleAttempt({ request_id: "one-call", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1, completion_tokens: 1 } });
    expect(again).toMatchObject({ ok: false, code: "already_settled", settlement: { debit_credits: 800 } });
  });

  test("an attempt this store opened settles without reading its row first: priced at the rates it was opened with", async () => {
    expect((await store.reserve({ request_id: "no-read", account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 100, credits: 1_000 })).ok).toBe(true);
    await store.recordRouteSnapshot(attempt("no-read"));
    // Rates never change once an attempt is open; changed past the store, they show whether it reads them back.
    await side`UPDATE settlements SET prompt_credits_per_million = 0, completion_credits_per_million = 0 WHERE request_id = 'no-read'`;
    const settled = await store.settleAttempt({ request_id: "no-read", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1_000, completion_tokens: 1_000 } });
    expect(settled).toMatchObject({ ok: true, settlement: { debit_credits: 800 } });
    // Another process (which opened nothing) reads them from the row.
    const other = await openPostgresStore(url, { maxConnections: 1, now: () => 1_000 });
    try {
      await store.recordRouteSnapshot(attempt("no-read", 1));
      await side`UPDATE settlements SET prompt_credits_per_million = 0, completion_credits_per_million = 0 WHERE request_id = 'no-read' AND attempt_n = 1`;
      const read = await other.settleAttempt({ request_id: "no-read", attempt_n: 1, label: "verified", reason: null, billed: { prompt_tokens: 1_000, completion_tokens: 1_000 } });
      expect(read).toMatchObject({ ok: true, settlement: { debit_credits: 0 } });
    } finally {
      await other.close();
    }
  });
});
