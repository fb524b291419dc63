// The embedded ledger's request path runs as few statements as it can (docs/benchmarks.md, "SQL per
// request pass") without leaning on memory for what the database must hold: each shortcut here is
// checked by the database itself, and when memory is wrong (a rolled-back group, a restart) the store
// takes the long way and the outcome is the same.
import { afterEach, expect, test } from "bun:test";
import { openStore, type Store } from "../../src/store/index.ts";
import { attempt } from "./attempt-fixture.ts";
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
