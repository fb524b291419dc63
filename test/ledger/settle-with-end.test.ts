// The request path's merged writes leave exactly the rows the separate writes left: an
// attempt that ends and settles at once gets its delivered record from the settlement's own UPDATE,
// and what the store returns is what it stored (it no longer reads rows back).
import { describe, expect, test } from "bun:test";
import { eachBackend } from "../store/backends.ts";
import { attempt, delivered } from "./attempt-fixture.ts";

const verified = { label: "verified" as const, reason: null, billed: { prompt_tokens: 30, completion_tokens: 4 } };
const receipt = { envelope: "e.s", received_at_ms: 1_500 };

eachBackend((b) => {
async function fresh() {
  const store = (await b.fresh({ now: () => 1_000 })).store;
  await store.grantCredits("acct_1", 1_000);
  return store;
}

describe("an attempt that ends and settles in one call", () => {
  test("stores the same row as recordAttemptEnd followed by settleAttempt, and returns it", async () => {
    const separate = await fresh();
    expect(await separate.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    expect(await separate.recordAttemptEnd("r1", 0, delivered, 301_000, 1_200)).toBe(true);
    const a = await separate.settleAttempt({ request_id: "r1", attempt_n: 0, ...verified, receipt }, 1_600);

    const merged = await fresh();
    expect(await merged.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    const b = await merged.settleAttempt(
      { request_id: "r1", attempt_n: 0, ...verified, receipt, ended: { delivered, ended_at_ms: 1_200, pending_deadline_at_ms: 301_000 } },
      1_600,
    );

    expect(a.ok && b.ok).toBe(true);
    if (!a.ok || !b.ok) return;
    expect(b.settlement).toEqual(a.settlement);
    expect(b.posting_id).toBe(a.posting_id);
    expect(await merged.getSettlement("r1", 0)).toEqual(await separate.getSettlement("r1", 0)!);
    expect(await merged.getSettlement("r1", 0)).toEqual(b.settlement);
    expect(await merged.ledgerBalances()).toEqual(await separate.ledgerBalances());
    await separate.close();
    await merged.close();
  });

  test("a delivered record written earlier wins over the one given with the outcome", async () => {
    const store = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    expect(await store.recordAttemptEnd("r1", 0, delivered, 301_000, 1_200)).toBe(true);
    const other = { ...delivered, output_hash: "3".repeat(64), end_byte: 99 };
    const settled = await store.settleAttempt(
      { request_id: "r1", attempt_n: 0, ...verified, ended: { delivered: other, ended_at_ms: 1_300, pending_deadline_at_ms: 9 } },
      1_600,
    );
    expect(settled.ok).toBe(true);
    if (!settled.ok) return;
    expect(settled.settlement).toMatchObject({ delivered, ended_at_ms: 1_200, pending_deadline_at_ms: 301_000, label: "verified" });
    expect(await store.getSettlement("r1", 0)).toEqual(settled.settlement);
    await store.close();
  });

  test("a zero_settled attempt keeps its delivered record and is never charged", async () => {
    const store = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    const nothing = { ...delivered, end_byte: 0, tokens: 0 };
    const settled = await store.settleAttempt(
      { request_id: "r1", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered", ended: { delivered: nothing, ended_at_ms: 1_200, pending_deadline_at_ms: 301_000 } },
      1_600,
    );
    expect(settled.ok && settled.posting_id).toBe(null);
    expect(await store.getSettlement("r1", 0)).toMatchObject({ label: "zero_settled", delivered: nothing, debit_credits: 0 });
    await store.close();
  });
});

describe("the accepted measurement rides the attempt's delivered record or its outcome", () => {
  const measured = "a".repeat(64);

  test("written with the delivered record; the first one written wins", async () => {
    const store = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    await store.recordRouteSnapshot(attempt("r2"));
    expect(await store.recordAttemptEnd("r1", 0, delivered, 301_000, 1_200, measured)).toBe(true);
    expect(await store.recordAcceptedMeasurement("r2", 0, measured)).toBe(true);
    expect(await store.recordAttemptEnd("r2", 0, delivered, 301_000, 1_200, "b".repeat(64))).toBe(true);
    expect((await store.getSettlement("r1", 0))?.accepted_model_hash).toBe(measured);
    expect((await store.getSettlement("r2", 0))?.accepted_model_hash).toBe(measured);
    // The outcome keeps the measurement it finds.
    const settled = await store.settleAttempt({ request_id: "r2", attempt_n: 0, ...verified, receipt, accepted_model_hash: "c".repeat(64) }, 1_600);
    expect(settled.ok && settled.settlement.accepted_model_hash).toBe(measured);
    expect((await store.getSettlement("r2", 0))?.accepted_model_hash).toBe(measured);
    await store.close();
  });

  test("written with the outcome when the attempt ends and settles at once", async () => {
    const store = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    const settled = await store.settleAttempt(
      { request_id: "r1", attempt_n: 0, ...verified, receipt, ended: { delivered, ended_at_ms: 1_200, pending_deadline_at_ms: 301_000 }, accepted_model_hash: measured },
      1_600,
    );
    expect(settled.ok && settled.settlement.accepted_model_hash).toBe(measured);
    expect(await store.getSettlement("r1", 0)).toEqual(settled.ok ? settled.settlement : null);
    await store.close();
  });
});

test("reserve returns the reservation exactly as stored", async () => {
  const store = await fresh();
  const reserved = await store.reserve({ request_id: "r9", account_id: "acct_1", payer: "buyer", day: "2026-11-22", tokens: 50, credits: 40 }, 1_234);
  expect(reserved.ok).toBe(true);
  if (!reserved.ok) return;
  expect(reserved.reservation).toEqual((await store.getReservation("r9"))!);
  await store.close();
});
});
