// The SQLite side of settlement (docs/receipts.md, docs/ledger.md) on real database files: the database itself allows
// one posting per attempt and only balanced, immutable postings; the first terminal outcome is final;
// reservations hold, finalise and release; everything survives a reopen.
import { Database } from "bun:sqlite";
import { describe, expect, test } from "bun:test";
import { openStore, type Store } from "../../src/store/index.ts";
import { tempDir } from "../store/temp-dir.ts";
import { attempt } from "./attempt-fixture.ts";

const tmp = tempDir();
const delivered = {
  output_hash: "1".repeat(64),
  start_byte: 0,
  end_byte: 18,
  tokens: 8,
  terminal_state: "normal_done",
  finish_reason: "stop",
  tool_calls_delivered: false,
  reported_input_tokens: 31,
};

function fresh(): { store: Store; path: string } {
  const path = tmp.path("ledger.db");
  return { store: openStore(path, { now: () => 1_000 }), path };
}

describe("settling an attempt", () => {
  test("verified: one balanced posting debits the buyer, credits provider 90 % and platform the rest", () => {
    const { store } = fresh();
    store.grantCredits("acct_1", 1_000);
    expect(store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    const settled = store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(settled.ok).toBe(true);
    if (!settled.ok) return;
    expect(settled.settlement).toMatchObject({ label: "verified", debit_credits: 11, provider_credits: 9, platform_credits: 2 });
    expect(store.ledgerBalance("buyer:acct_1")).toBe(989);
    expect(store.ledgerBalance("provider:prov-golden")).toBe(9);
    expect(store.ledgerBalance("platform")).toBe(2);
    expect(store.ledgerBalance("funding")).toBe(-1_000);
    expect(store.ledgerBalances().reduce((s, b) => s + b.balance, 0)).toBe(0);
    store.close();
  });

  test("free tier and demo are debited from the promotion account", () => {
    const { store } = fresh();
    store.recordRouteSnapshot(attempt("r1", 0, { payer: "promotion", account_id: "demo:127.0.0.1" }));
    store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(store.ledgerBalance("promotion")).toBe(-11);
    expect(store.ledgerBalance("provider:prov-golden")).toBe(9);
    store.close();
  });

  test("the first terminal outcome is final: a later receipt or deadline changes nothing", () => {
    const { store } = fresh();
    store.recordRouteSnapshot(attempt("r1"));
    expect(store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" }).ok).toBe(true);
    const again = store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 1, completion_tokens: 1 } });
    expect(again).toMatchObject({ ok: false, code: "already_settled", settlement: { label: "quarantined", reason: "no_receipt" } });
    expect(store.ledgerBalances()).toEqual([]);
    // Later writes of attempt facts are refused quietly, never un-settling the row.
    expect(store.recordAcceptedMeasurement("r1", 0, "a".repeat(64))).toBe(false);
    expect(store.recordAttemptEnd("r1", 0, delivered, 2_000)).toBe(false);
    store.close();
  });

  test("the database refuses any write to a settled row, whatever code runs", () => {
    const { store, path } = fresh();
    store.recordRouteSnapshot(attempt("r1"));
    store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered" });
    store.close();
    const db = new Database(path);
    expect(() => db.run("UPDATE settlements SET label = 'verified' WHERE request_id = 'r1'")).toThrow(/final/);
    db.close();
  });

  test("no charge without verification in enforce mode; observe mode bills observed usage", () => {
    const { store } = fresh();
    store.recordRouteSnapshot(attempt("r1"));
    expect(
      store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "output_mismatch", billed: { prompt_tokens: 1, completion_tokens: 1 } }),
    ).toEqual({ ok: false, code: "charge_not_allowed" });
    expect(store.getSettlement("r1", 0)?.label).toBe("pending");

    store.recordRouteSnapshot(attempt("r2", 0, { mode: "observe", payer: "promotion" }));
    const observed = store.settleAttempt({ request_id: "r2", attempt_n: 0, label: "quarantined", reason: "model_hash_not_in_catalog", billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(observed).toMatchObject({ ok: true, settlement: { debit_credits: 11 } });
    store.close();
  });

  test("a snapshot is persisted once per attempt", () => {
    const { store } = fresh();
    expect(store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: true });
    expect(store.recordRouteSnapshot(attempt("r1"))).toEqual({ ok: false, code: "duplicate_attempt" });
    expect(store.getRouteSnapshot("r1", 0)?.digest).toBe(attempt("r1").digest);
    expect(store.recordRouteSnapshot({ ...attempt("r2"), digest: "0".repeat(64) })).toEqual({ ok: false, code: "digest_mismatch" });
    store.close();
  });
});

describe("database constraints", () => {
  function raw() {
    const { store, path } = fresh();
    store.recordRouteSnapshot(attempt("r1"));
    store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    store.close();
    return new Database(path);
  }

  test("at most one posting per (request_id, attempt_n)", () => {
    const db = raw();
    expect(() =>
      db.run("INSERT INTO ledger_postings (kind, request_id, attempt_n, created_at_ms) VALUES ('settlement', 'r1', 0, 1)"),
    ).toThrow(/UNIQUE/);
    db.close();
  });

  test("a posting whose entries do not sum to zero cannot be sealed", () => {
    const db = raw();
    db.run("INSERT INTO ledger_postings (kind, request_id, attempt_n, created_at_ms) VALUES ('settlement', 'r9', 0, 1)");
    const id = (db.query("SELECT last_insert_rowid() AS id").get() as { id: number }).id;
    db.run("INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (?, 'platform', 5)", [id]);
    db.run("INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (?, 'promotion', -4)", [id]);
    expect(() => db.run("UPDATE ledger_postings SET sealed = 1 WHERE id = ?", [id])).toThrow(/unbalanced/);
    db.close();
  });

  test("entries and sealed postings never change", () => {
    const db = raw();
    expect(() => db.run("UPDATE ledger_entries SET amount = amount + 1")).toThrow(/append-only/);
    expect(() => db.run("DELETE FROM ledger_entries")).toThrow(/append-only/);
    expect(() => db.run("UPDATE ledger_postings SET memo = 'x'")).toThrow(/append-only/);
    expect(() => db.run("DELETE FROM ledger_postings")).toThrow(/append-only/);
    expect(() => db.run("INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (1, 'platform', 1)")).toThrow(/sealed/);
    db.close();
  });
});

describe("reservations", () => {
  test("a paid buyer cannot reserve more than the balance less what is already held", () => {
    const { store } = fresh();
    store.grantCredits("acct_1", 100);
    const base = { account_id: "acct_1", payer: "buyer" as const, day: "2026-01-01", tokens: 500 };
    expect(store.reserve({ ...base, request_id: "r1", credits: 60 }).ok).toBe(true);
    expect(store.reserve({ ...base, request_id: "r2", credits: 60 })).toEqual({ ok: false, code: "insufficient_balance", available_credits: 40 });
    expect(store.reserve({ ...base, request_id: "r1", credits: 1 })).toEqual({ ok: false, code: "duplicate_request" });
    expect(store.availableCredits("acct_1")).toBe(40);
    store.close();
  });

  test("the daily token quota counts held and used tokens", () => {
    const { store } = fresh();
    const base = { account_id: "acct_free", payer: "promotion" as const, day: "2026-01-01", credits: 0, daily_token_limit: 1000 };
    expect(store.reserve({ ...base, request_id: "r1", tokens: 600 }).ok).toBe(true);
    expect(store.reserve({ ...base, request_id: "r2", tokens: 600 })).toEqual({ ok: false, code: "quota_exhausted", used_tokens: 600 });
    expect(store.reserve({ ...base, request_id: "r3", tokens: 600, day: "2026-01-02" }).ok).toBe(true);
    store.close();
  });

  test("finalised by the verified attempt's usage once the request ended and nothing is pending", () => {
    const { store } = fresh();
    store.grantCredits("acct_1", 1_000);
    store.reserve({ request_id: "r1", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
    store.recordRouteSnapshot(attempt("r1", 0));
    store.recordRouteSnapshot(attempt("r1", 1));
    store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered" });
    store.markRequestEnded("r1");
    expect(store.getReservation("r1")?.state).toBe("held"); // attempt 1 still pending
    store.settleAttempt({ request_id: "r1", attempt_n: 1, label: "verified", reason: null, billed: { prompt_tokens: 31, completion_tokens: 8 } });
    expect(store.getReservation("r1")).toMatchObject({ state: "finalised", used_tokens: 39, used_credits: 11 });
    expect(store.availableCredits("acct_1")).toBe(989);
    expect(store.tokensCountedOn("acct_1", "2026-01-01")).toBe(39);
    store.close();
  });

  test("released when no attempt was charged", () => {
    const { store } = fresh();
    store.reserve({ request_id: "r1", account_id: "acct_1", payer: "promotion", day: "2026-01-01", tokens: 100, credits: 0 });
    store.recordRouteSnapshot(attempt("r1"));
    store.markRequestEnded("r1");
    store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" });
    expect(store.getReservation("r1")).toMatchObject({ state: "released", used_tokens: 0 });
    expect(store.tokensCountedOn("acct_1", "2026-01-01")).toBe(0);
    store.close();
  });
});

test("pending settlements, their facts and reservations survive a restart and settle afterwards", () => {
  const path = tmp.path("restart.db");
  let store = openStore(path);
  store.grantCredits("acct_1", 100);
  store.reserve({ request_id: "r1", account_id: "acct_1", payer: "buyer", day: "2026-01-01", tokens: 100, credits: 40 });
  store.recordRouteSnapshot(attempt("r1"));
  store.recordAcceptedMeasurement("r1", 0, "a".repeat(64));
  store.recordAttemptEnd("r1", 0, delivered, 5_000);
  store.markRequestEnded("r1");
  store.close();

  store = openStore(path);
  const pending = store.listSettlements({ label: "pending" });
  expect(pending).toHaveLength(1);
  expect(pending[0]).toMatchObject({ accepted_model_hash: "a".repeat(64), delivered, pending_deadline_at_ms: 5_000 });
  expect(store.getReservation("r1")?.state).toBe("held");
  store.settleAttempt({ request_id: "r1", attempt_n: 0, label: "quarantined", reason: "no_receipt" });
  expect(store.getReservation("r1")?.state).toBe("released");
  expect(store.availableCredits("acct_1")).toBe(100);
  store.close();
});
