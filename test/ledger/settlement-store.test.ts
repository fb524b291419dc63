// The store's side of settlement (docs/ledger.md), on both backends (test/store/backends.ts): the
// database itself allows one posting per attempt and only balanced, immutable postings; the first
// terminal outcome is final; reservations hold, finalise and release; everything survives a reopen.
import { describe, expect, test } from "bun:test";
import { eachBackend } from "../store/backends.ts";
import { attempt } from "./attempt-fixture.ts";

eachBackend((b) => {
const delivered = {
  output_hash: "1".repeat(64),
  start_byte: 0,
  end_byte: 18,
  tokens: 8,
  terminal_state: "normal_done",
  finish_reason: "stop",
  tool_calls_delivered: false,
  // Kept as written (a pending attempt is bounded by it after a restart); 0 with no tool call.
  tool_call_bytes: 0,
  reported_input_tokens: 31,
};

const fresh = async () => {
  const { store, location } = await b.fresh({ now: () => 1_000 });
  return { store, path: location };
};

describe("settling an attempt", () => {
  test("verified: one balanced posting debits the buyer, credits provider 90 % and platform the rest", async () => {
    const { store } = await fresh();
    await store.grantCredits("acct_1", 1_000);
    expect(await store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    const settled = await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(settled.ok).toBe(true);
    if (!settled.ok) return;
    expect(settled.settlement).toMatchObject({ label: "verified", debit_credits: 11, provider_credits: 9, platform_credits: 2 });
    expect(await store.ledgerBalance("buyer:acct_1")).toBe(989);
    expect(await store.ledgerBalance("provider:prov-golden")).toBe(9);
    expect(await store.ledgerBalance("platform")).toBe(2);
    expect(await store.ledgerBalance("funding")).toBe(-1_000);
    expect((await store.ledgerBalances()).reduce((s, b) => s + b.balance, 0)).toBe(0);
    await store.close();
  });

  test("free tier and demo are debited from the promotion account", async () => {
    const { store } = await fresh();
    await store.recordRouteSnapshot(attempt("r1", 0, { payer: "promotion", account_id: "demo:127.0.0.1" }));
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(await store.ledgerBalance("promotion")).toBe(-11);
    expect(await store.ledgerBalance("provider:prov-golden")).toBe(9);
    await store.close();
  });

  test("the first terminal outcome is final: a later receipt or deadline changes nothing", async () => {
    const { store } = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    expect((await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" })).ok).toBe(true);
    const again = await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1, completion_tokens: 1 } });
    expect(again).toMatchObject({ ok: false, code: "already_settled", settlement: { label: "quarantined", reason: "no_receipt" } });
    expect(await store.ledgerBalances()).toEqual([]);
    // Later writes of attempt facts are refused quietly, never un-settling the row.
    expect(await store.recordAcceptedMeasurement("r1", 0, "a".repeat(64))).toBe(false);
    expect(await store.recordAttemptEnd("r1", 0, delivered, 2_000)).toBe(false);
    await store.close();
  });

  test("the accepted measurement rides with the delivered record or with the outcome; the first one stands", async () => {
    const { store } = await fresh();
    const [a, b2, c] = ["a", "b", "c"].map((x) => x.repeat(64)) as [string, string, string];
    await store.recordRouteSnapshot(attempt("r1", 0));
    await store.recordRouteSnapshot(attempt("r1", 1));
    await store.recordRouteSnapshot(attempt("r1", 2));
    // With the delivered record; a later outcome's measurement does not replace it.
    expect(await store.recordAttemptEnd("r1", 0, delivered, 2_000, 1_500, a)).toBe(true);
    expect(await store.getSettlement("r1", 0)).toMatchObject({ accepted_model_hash: a, delivered, pending_deadline_at_ms: 2_000 });
    const settled = await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt", accepted_model_hash: b2 });
    expect(settled).toMatchObject({ ok: true, settlement: { accepted_model_hash: a } });
    expect((await store.getSettlement("r1", 0))?.accepted_model_hash).toBe(a);
    // With the outcome alone (an attempt refused on its measurement), as returned and as stored.
    const refused = await store.settleAttempt({ request_id: "r1", attempt_n: 1, label: "quarantined", reason: "model_hash_not_in_catalog", accepted_model_hash: c });
    expect(refused).toMatchObject({ ok: true, settlement: { accepted_model_hash: c } });
    expect((await store.getSettlement("r1", 1))?.accepted_model_hash).toBe(c);
    // One recorded on its own stands too.
    expect(await store.recordAcceptedMeasurement("r1", 2, a)).toBe(true);
    expect(await store.recordAttemptEnd("r1", 2, delivered, 2_000, 1_500, c)).toBe(true);
    expect((await store.getSettlement("r1", 2))?.accepted_model_hash).toBe(a);
    await store.close();
  });

  test("the database refuses any write to a settled row, whatever code runs", async () => {
    const { store, path } = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered" });
    await store.close();
    await expect(b.exec(path, "UPDATE settlements SET label = 'verified' WHERE request_id = 'r1'")).rejects.toThrow(/final/);
  });

  test("no charge without verification in enforce mode; observe mode bills observed usage", async () => {
    const { store } = await fresh();
    await store.recordRouteSnapshot(attempt("r1"));
    expect(
      await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "output_mismatch", billed: { prompt_tokens: 1, completion_tokens: 1 } }),
    ).toEqual({ ok: false, code: "charge_not_allowed" });
    expect((await store.getSettlement("r1", 0))?.label).toBe("pending");

    await store.recordRouteSnapshot(attempt("r2", 0, { mode: "observe", payer: "promotion" }));
    const observed = await store.settleAttempt({ request_id: "r2", attempt_n: 0, label: "quarantined", reason: "model_hash_not_in_catalog", billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(observed).toMatchObject({ ok: true, settlement: { debit_credits: 11 } });
    await store.close();
  });

  test("a snapshot is persisted once per attempt", async () => {
    const { store } = await fresh();
    expect(await store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    expect(await store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: false, code: "duplicate_attempt" });
    expect((await store.getRouteSnapshot("r1", 0))?.digest).toBe(attempt("r1").digest);
    expect(await store.recordRouteSnapshot({ ...attempt("r2"), digest: "0".repeat(64) })).toEqual({ ok: false, code: "digest_mismatch" });
    await store.close();
  });
});

describe("database constraints", () => {
  let path = "";
  async function raw() {
    const opened = await fresh();
    const store = opened.store;
    path = opened.path;
    await store.recordRouteSnapshot(attempt("r1"));
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    await store.close();
    return (statement: string) => b.exec(path, statement);
  }

  test("at most one posting per (request_id, attempt_n)", async () => {
    const run = await raw();
    await expect(run("INSERT INTO ledger_postings (kind, request_id, attempt_n, created_at_ms) VALUES ('settlement', 'r1', 0, 1)")).rejects.toThrow(
      /UNIQUE|unique/,
    );
  });

  test("a posting whose entries do not sum to zero cannot be sealed", async () => {
    await raw();
    // One script (one implicit transaction on PostgreSQL, whose deferred check also wants every posting sealed).
    await expect(
      b.script(
        path,
        `INSERT INTO ledger_postings (id, kind, request_id, attempt_n, created_at_ms) VALUES (99, 'settlement', 'r9', 0, 1);
         INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (99, 'platform', 5), (99, 'provider:prov-golden', -4);
         UPDATE ledger_postings SET sealed = ${b.TRUE} WHERE id = 99;`,
      ),
    ).rejects.toThrow(/unbalanced/);
  });

  test("a posting left unsealed, or with one entry, never commits", async () => {
    await raw();
    const script = `INSERT INTO ledger_postings (id, kind, memo, created_at_ms) VALUES (98, 'grant', 'x', 1);
       INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (98, 'platform', 5);`;
    if (b.name === "postgres") await expect(b.script(path, script)).rejects.toThrow(/unsealed/);
    await expect(b.script(path, `${script} UPDATE ledger_postings SET sealed = ${b.TRUE} WHERE id = 98;`)).rejects.toThrow(/unbalanced/);
  });

  test("entries and sealed postings never change", async () => {
    const run = await raw();
    await expect(run("UPDATE ledger_entries SET amount = amount + 1")).rejects.toThrow(/append-only/);
    await expect(run("DELETE FROM ledger_entries")).rejects.toThrow(/append-only/);
    await expect(run("UPDATE ledger_postings SET memo = 'x'")).rejects.toThrow(/append-only/);
    await expect(run("DELETE FROM ledger_postings")).rejects.toThrow(/append-only/);
    // An account the sealed posting does not have yet (a repeated one would hit the primary key first).
    await expect(
      b.script(
        path,
        `INSERT INTO ledger_accounts (id, kind, created_at_ms) VALUES ('provider:late', 'provider', 1);
         INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (1, 'provider:late', 1);`,
      ),
    ).rejects.toThrow(/sealed/);
    await expect(run("INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (1, 'platform', 1)")).rejects.toThrow(
      b.name === "postgres" ? /sealed|duplicate key/ : /sealed/,
    );
  });
});

describe("reservations", () => {
  test("a paid buyer cannot reserve more than the balance less what is already held", async () => {
    const { store } = await fresh();
    await store.grantCredits("acct_1", 100);
    const base = { account_id: "acct_1", payer: "buyer" as const, day: "2026-01-01", tokens: 500 };
    expect((await store.reserve({ ...base, request_id: "r1", credits: 60 })).ok).toBe(true);
    expect(await store.reserve({ ...base, request_id: "r2", credits: 60 })).toEqual({ ok: false, code: "insufficient_balance", available_credits: 40 });
    expect(await store.reserve({ ...base, request_id: "r1", credits: 1 })).toEqual({ ok: false, code: "duplicate_request" });
    expect(await store.availableCredits("acct_1")).toBe(40);
    await store.close();
  });

  test("the daily token quota counts held and used tokens", async () => {
    const { store } = await fresh();
    const base = { account_id: "acct_free", payer: "promotion" as const, day: "2026-01-01", credits: 0, daily_token_limit: 1000 };
    expect((await store.reserve({ ...base, request_id: "r1", tokens: 600 })).ok).toBe(true);
    expect(await store.reserve({ ...base, request_id: "r2", tokens: 600 })).toEqual({ ok: false, code: "quota_exhausted", used_tokens: 600 });
    expect((await store.reserve({ ...base, request_id: "r3", tokens: 600, day: "2026-01-02" })).ok).toBe(true);
    await store.close();
  });

  test("finalised by the verified attempt's usage once the request ended and nothing is pending", async () => {
    const { store } = await fresh();
    await store.grantCredits("acct_1", 1_000);
    await store.reserve({ request_id: "r1", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
    await store.recordRouteSnapshot(attempt("r1", 0));
    await store.recordRouteSnapshot(attempt("r1", 1));
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered" });
    await store.markRequestEnded("r1");
    expect((await store.getReservation("r1"))?.state).toBe("held"); // attempt 1 still pending
    await store.settleAttempt({ request_id: "r1", attempt_n: 1, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(await store.getReservation("r1")).toMatchObject({ state: "finalised", used_tokens: 39, used_credits: 11 });
    expect(await store.availableCredits("acct_1")).toBe(989);
    expect(await store.tokensCountedOn("acct_1", "2026-01-01")).toBe(39);
    await store.close();
  });

  test("a settlement that ends its request resolves the reservation in the same transaction, unless another attempt is pending", async () => {
    const { store } = await fresh();
    await store.grantCredits("acct_1", 1_000);
    await store.reserve({ request_id: "r1", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
    await store.recordRouteSnapshot(attempt("r1", 0));
    await store.recordRouteSnapshot(attempt("r1", 1));
    const billed = { prompt_tokens: 31, completion_tokens: 8 };
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed, end_request: true });
    expect(await store.getReservation("r1")).toMatchObject({ state: "held", request_ended: true }); // attempt 1 still pending
    await store.settleAttempt({ request_id: "r1", attempt_n: 1, label: "zero_settled", reason: "nothing_delivered" });
    expect(await store.getReservation("r1")).toMatchObject({ state: "finalised", used_tokens: 39, used_credits: 11 });
    // Only with a written outcome: a refused settlement ends nothing.
    await store.reserve({ request_id: "r2", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
    await store.recordRouteSnapshot(attempt("r2", 0));
    await store.settleAttempt({ request_id: "r2", attempt_n: 0, label: "quarantined", reason: "no_receipt" });
    expect((await store.settleAttempt({ request_id: "r2", attempt_n: 0, label: "verified", reason: null, billed, end_request: true })).ok).toBe(false);
    expect(await store.getReservation("r2")).toMatchObject({ state: "held", request_ended: false });
    await store.close();
  });

  test("released when no attempt was charged", async () => {
    const { store } = await fresh();
    await store.reserve({ request_id: "r1", account_id: "acct_1", payer: "promotion", day: "2026-01-01", tokens: 100, credits: 0 });
    await store.recordRouteSnapshot(attempt("r1"));
    await store.markRequestEnded("r1");
    await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" });
    expect(await store.getReservation("r1")).toMatchObject({ state: "released", used_tokens: 0 });
    expect(await store.tokensCountedOn("acct_1", "2026-01-01")).toBe(0);
    await store.close();
  });
});

test("pending settlements, their facts and reservations survive a restart and settle afterwards", async () => {
  const path = await b.location();
  let store = await b.open(path);
  await store.grantCredits("acct_1", 100);
  await store.reserve({ request_id: "r1", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
  await store.recordRouteSnapshot(attempt("r1"));
  await store.recordAcceptedMeasurement("r1", 0, "a".repeat(64));
  await store.recordAttemptEnd("r1", 0, delivered, 5_000);
  await store.markRequestEnded("r1");
  await store.close();

  store = await b.open(path);
  const pending = await store.listSettlements({ label: "pending" });
  expect(pending).toHaveLength(1);
  expect(pending[0]).toMatchObject({ accepted_model_hash: "a".repeat(64), delivered, pending_deadline_at_ms: 5_000 });
  expect((await store.getReservation("r1"))?.state).toBe("held");
  await store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" });
  expect((await store.getReservation("r1"))?.state).toBe("released");
  expect(await store.availableCredits("acct_1")).toBe(100);
  await store.close();
});
});
