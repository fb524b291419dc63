// Held credits per buyer account (migration reservation_holds): the trigger-kept sum always equals
// SUM(credits) of the account's held buyer reservations — as holds are taken, resolved, refused — and
// a database migrated with holds in flight starts from that sum.
import { afterEach, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { openDatabase } from "../../src/store/db.ts";
import { migrations } from "../../src/store/migrations.ts";
import { openStore, type Store } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const files = tempDir();
const closers: (() => void)[] = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

const hold = (request_id: string, account_id: string, credits: number, payer: "buyer" | "promotion" = "buyer") => ({
  request_id,
  account_id,
  payer,
  day: "2026-11-22",
  tokens: 10,
  credits,
});

/** What the trigger keeps, and what it must equal. */
function heldBothWays(path: string, account_id: string): { kept: number; summed: number } {
  const db = new Database(path, { readonly: true });
  try {
    const kept = (db.query("SELECT held_credits AS c FROM reservation_holds WHERE account_id = ?").get(account_id) as { c: number } | null)?.c ?? 0;
    const summed = (db.query("SELECT COALESCE(SUM(credits), 0) AS c FROM reservations WHERE account_id = ? AND payer = 'buyer' AND state = 'held'").get(account_id) as { c: number }).c;
    return { kept, summed };
  } finally {
    db.close();
  }
}

test("the kept sum follows holds taken, resolved and refused", () => {
  const path = files.path("gateway.db");
  const store: Store = openStore(path);
  closers.push(() => store.close());
  const { account_id } = store.createAccount({ tier: "paid" });
  store.grantCredits(account_id, 1_000);
  expect(store.reserve(hold("req_1", account_id, 300)).ok).toBe(true);
  expect(store.reserve(hold("req_2", account_id, 500)).ok).toBe(true);
  expect(store.reserve(hold("req_p", account_id, 999, "promotion")).ok).toBe(true);
  expect(heldBothWays(path, account_id)).toEqual({ kept: 800, summed: 800 });
  // Over the balance less the holds: refused, nothing held.
  expect(store.reserve(hold("req_3", account_id, 201))).toMatchObject({ ok: false, code: "insufficient_balance", available_credits: 200 });
  expect(heldBothWays(path, account_id)).toEqual({ kept: 800, summed: 800 });
  // A request that ends with nothing pending releases its hold.
  store.markRequestEnded("req_1");
  expect(heldBothWays(path, account_id)).toEqual({ kept: 500, summed: 500 });
  expect(store.availableCredits(account_id)).toBe(500);
  store.markRequestEnded("req_2");
  expect(heldBothWays(path, account_id)).toEqual({ kept: 0, summed: 0 });
});

test("migrating a database with holds in flight starts from their sum", () => {
  const path = files.path("gateway.db");
  const before = openDatabase(path, migrations.slice(0, -1));
  const insert = before.query(
    "INSERT INTO reservations (request_id, account_id, payer, day, tokens, credits, created_at_ms, state) VALUES (?, ?, ?, '2026-11-22', 1, ?, 0, ?)",
  );
  insert.run("req_a", "acct_x", "buyer", 70, "held");
  insert.run("req_b", "acct_x", "buyer", 30, "held");
  insert.run("req_c", "acct_x", "buyer", 500, "finalised");
  insert.run("req_d", "acct_x", "promotion", 900, "held");
  before.close();
  openDatabase(path).close();
  expect(heldBothWays(path, "acct_x")).toEqual({ kept: 100, summed: 100 });
});
