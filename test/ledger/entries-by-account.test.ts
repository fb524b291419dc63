// Ledger entries have no index by account (migration 'DROP INDEX ledger_entries_account'):
// per-account balances summed from the entries still equal the kept totals, for every account, and a
// database migrated with entries in it loses the index and none of its balances.
import { Database } from "bun:sqlite";
import { afterEach, expect, test } from "bun:test";
import { migrations } from "../../src/store/migrations.ts";
import { openStore, type Store } from "../../src/store/index.ts";
import { attempt } from "./attempt-fixture.ts";
import { tempDir } from "../store/temp-dir.ts";

const files = tempDir();
const closers: (() => void)[] = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

const verified = (request_id: string, prompt_tokens: number, completion_tokens: number) => ({
  request_id,
  attempt_n: 0,
  label: "verified" as const,
  reason: null,
  billed: { prompt_tokens, completion_tokens },
});

/** Grants to two buyers and settlements paid by one of them: five ledger accounts with entries. */
function fill(store: Store): void {
  store.grantCredits("acct_1", 10_000);
  store.grantCredits("acct_2", 500);
  for (const [id, p, c] of [["r1", 30, 4], ["r2", 1_000, 300], ["r3", 7, 1]] as const) {
    store.recordRouteSnapshot(attempt(id));
    expect(store.settleAttempt(verified(id, p, c)).ok).toBe(true);
  }
  store.flushCommits();
}

/** Each ledger account's kept total, and its balance summed from entries by `ledgerBalances`. */
function bothWays(path: string, store: Store): { kept: Record<string, number>; summed: Record<string, number> } {
  const db = new Database(path, { readonly: true });
  try {
    const kept = Object.fromEntries(
      (db.query("SELECT account_id, balance FROM ledger_account_totals ORDER BY account_id").all() as { account_id: string; balance: number }[]).map((r) => [
        r.account_id,
        r.balance,
      ]),
    );
    return { kept, summed: Object.fromEntries(store.ledgerBalances().map((b) => [b.account_id, b.balance])) };
  } finally {
    db.close();
  }
}

const indexesOfEntries = (path: string): string[] => {
  const db = new Database(path, { readonly: true });
  try {
    return (db.query("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ledger_entries'").all() as { name: string }[]).map((r) => r.name);
  } finally {
    db.close();
  }
};

test("balances summed from the entries equal the kept totals, account by account", () => {
  const path = files.path("gateway.db");
  const store = openStore(path, { now: () => 1_000 });
  closers.push(() => store.close());
  fill(store);
  const { kept, summed } = bothWays(path, store);
  expect(Object.keys(summed).sort()).toEqual(["buyer:acct_1", "buyer:acct_2", "funding", "platform", `provider:${attempt("r1").provider_id}`].sort());
  expect(summed).toEqual(kept);
  expect(summed["buyer:acct_2"]).toBe(500); // granted, never charged
  expect(Object.values(summed).reduce((a, b) => a + b, 0)).toBe(0);
  expect(indexesOfEntries(path)).toEqual(["sqlite_autoindex_ledger_entries_1"]);
});

test("a database migrated with entries in it drops the index and keeps every balance", () => {
  const path = files.path("gateway.db");
  const first = openStore(path, { now: () => 1_000 });
  fill(first);
  const before = bothWays(path, first);
  first.close();
  // Back to the version before the migration: the index over the same entries, the versions from it on
  // unrecorded, and what the later migrations added undone.
  const dropIndex = migrations.findIndex((m) => m.includes("DROP INDEX ledger_entries_account")) + 1;
  const raw = new Database(path);
  raw.exec(`CREATE INDEX ledger_entries_account ON ledger_entries (account_id);
    ALTER TABLE settlements DROP COLUMN delivered_tool_call_bytes;
    DELETE FROM schema_migrations WHERE version >= ${dropIndex}`);
  raw.close();
  expect(indexesOfEntries(path)).toContain("ledger_entries_account");
  const store = openStore(path, { now: () => 1_000 });
  closers.push(() => store.close());
  expect(indexesOfEntries(path)).toEqual(["sqlite_autoindex_ledger_entries_1"]);
  expect(bothWays(path, store)).toEqual(before);
  expect(before.summed).toEqual(before.kept);
});
