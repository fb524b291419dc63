// The embedded ledger's request path runs as few statements as it can (docs/benchmarks.md, "SQL per
// request pass") without leaning on memory for what the database must hold: each shortcut here is
// checked by the database itself, and when memory is wrong (a rolled-back group, a restart) the store
// takes the long way and the outcome is the same.
import { afterEach, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { priceUsage } from "../../src/ledger/money.ts";
import { openStore, type Store } from "../../src/store/index.ts";
import { attempt, delivered, rates } from "./attempt-fixture.ts";
import { tempDir } from "../store/temp-dir.ts";

const files = tempDir();
const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const f of cleanup.splice(0)) f();
});

/** A grouped store (as the gateway runs it) whose COMMITs fail while `failing()` says so. */
function grouped(failing: () => boolean): Store {
  const store = openStore(files.path("gateway.db"), { now: () => 1_000, groupCommit: true, lazyCommitTimer: () => {}, commitFails: failing });
  cleanup.push(() => store.close());
  return store;
}

const verified = (request_id: string) => ({
  request_id,
  attempt_n: 0,
  label: "verified" as const,
  reason: null,
  billed: { prompt_tokens: 30, completion_tokens: 4 },
});

const priced = (prompt: number, completion: number, r: typeof rates) => {
  const p = priceUsage(prompt, completion, r);
  if (!p.ok) throw new Error("unpriceable");
  return p.charge.debit_credits;
};

test("a ledger account whose creating group rolled back is created again by the next posting", () => {
  let fail = false;
  const store = grouped(() => fail);
  store.grantCredits("acct_1", 1_000);
  // The first settlement creates the provider's and the platform's accounts, in a group that is lost.
  store.recordRouteSnapshot(attempt("r1"));
  expect(store.settleAttempt(verified("r1")).ok).toBe(true);
  fail = true;
  store.flushCommits();
  fail = false;
  expect(store.getSettlement("r1", 0)).toBeNull();

  store.recordRouteSnapshot(attempt("r2"));
  const settled = store.settleAttempt(verified("r2"));
  expect(settled.ok).toBe(true);
  store.flushCommits();
  const debit = settled.ok ? settled.settlement.debit_credits : 0;
  const balances = Object.fromEntries(store.ledgerBalances().map((b) => [b.account_id, b.balance]));
  expect(balances[`provider:${attempt("r2").provider_id}`]).toBeGreaterThan(0);
  expect(balances.platform).toBeGreaterThan(0);
  expect(balances["buyer:acct_1"]).toBe(1_000 - debit);
  expect(Object.values(balances).reduce((a, b) => a + b, 0)).toBe(0);
});

test("an attempt whose opening group rolled back is an unknown attempt to its settlement", () => {
  let fail = false;
  const store = grouped(() => fail);
  store.grantCredits("acct_1", 1_000);
  expect(store.recordRouteSnapshot(attempt("r1")).ok).toBe(true);
  fail = true;
  store.flushCommits();
  fail = false;
  expect(store.settleAttempt(verified("r1"))).toEqual({ ok: false, code: "unknown_attempt" });
  expect(store.ledgerBalance("buyer:acct_1")).toBe(1_000);
});

test("a delivered record whose group rolled back is written by the settlement that carries it", () => {
  let fail = false;
  const store = grouped(() => fail);
  store.grantCredits("acct_1", 1_000);
  store.recordRouteSnapshot(attempt("r1"));
  store.flushCommits();
  expect(store.recordAttemptEnd("r1", 0, delivered, 301_000, 1_200)).toBe(true);
  fail = true;
  store.flushCommits();
  fail = false;
  const settled = store.settleAttempt({ ...verified("r1"), ended: { delivered, ended_at_ms: 1_300, pending_deadline_at_ms: 302_000 } });
  expect(settled.ok && settled.settlement.delivered).toEqual(delivered);
  store.flushCommits();
  expect(store.getSettlement("r1", 0)?.delivered).toEqual(delivered);
  expect(store.getSettlement("r1", 0)?.ended_at_ms).toBe(1_300);
});

test("an attempt is priced at its row's rates, whatever the process remembers of them", () => {
  const path = files.path("gateway.db");
  const store = openStore(path, { now: () => 1_000 });
  cleanup.push(() => store.close());
  store.grantCredits("acct_1", 1_000_000);
  store.recordRouteSnapshot(attempt("r1"));
  // Another connection changes the pending row's rate after the attempt opened.
  const other = new Database(path);
  other.run("UPDATE settlements SET completion_credits_per_million = 1200000 WHERE request_id = 'r1'");
  other.close();
  const settled = store.settleAttempt(verified("r1"));
  expect(settled.ok).toBe(true);
  if (!settled.ok) return;
  expect(settled.settlement.rates.completion_credits_per_million).toBe(1_200_000);
  expect(settled.settlement.debit_credits).toBe(priced(30, 4, { ...rates, completion_credits_per_million: 1_200_000 }));
  expect(settled.settlement).toEqual(store.getSettlement("r1", 0)!);
});
