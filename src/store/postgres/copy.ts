// Moving up (docs/postgres-store.md): copies a single node's SQLite store into an empty PostgreSQL database,
// row for row, in one PostgreSQL transaction — either all of it is there afterwards, or nothing is.
// Ids are kept (ledger postings, receipts, catalog seqs), so receipts, audits and exports read the same.
// The kept sums (ledger_account_totals, reservation_holds) are not copied: the target's own triggers
// rebuild them from the copied rows, and the copy is checked against the source before it commits.

import type { Database } from "bun:sqlite";
import { SQL } from "bun";
import { applyMigrations } from "./index.ts";

type Row = Record<string, unknown>;

/** Tables in an order that satisfies every foreign key; `flags` are SQLite 0/1 columns that are BOOLEAN here. */
const TABLES: readonly { name: string; order: string; flags?: readonly string[]; skip?: readonly string[] }[] = [
  { name: "accounts", order: "created_at_ms, rowid" },
  { name: "api_keys", order: "created_at_ms, rowid" },
  { name: "provider_bindings", order: "provider_id", flags: ["pinned", "banned"] },
  { name: "secrets", order: "name" },
  { name: "catalog_history", order: "seq" },
  { name: "oidc_identities", order: "created_at_ms" },
  { name: "oidc_pending_logins", order: "created_at_ms" },
  { name: "account_sessions", order: "created_at_ms" },
  { name: "demo_sessions", order: "issued_at_ms" },
  { name: "route_snapshots", order: "created_at_ms, request_id, attempt_n" },
  { name: "receipts_received", order: "id" },
  { name: "settlements", order: "created_at_ms, request_id, attempt_n", flags: ["delivered_tool_calls"] },
  { name: "reservations", order: "created_at_ms, request_id", flags: ["request_ended"] },
  { name: "ledger_accounts", order: "id" },
  // Postings go in unsealed, then their entries, then the seal (the target's triggers check each sum).
  { name: "ledger_postings", order: "id", flags: ["sealed"] },
  { name: "ledger_entries", order: "posting_id, account_id" },
  { name: "feedback", order: "updated_at_ms, request_id" },
  { name: "feedback_submissions", order: "submitted_at_ms" },
];

/** Identity columns whose sequence must continue after the copied ids. */
const IDENTITIES: readonly [string, string][] = [
  ["catalog_history", "seq"],
  ["receipts_received", "id"],
  ["ledger_postings", "id"],
];

export type CopyResult =
  | { ok: true; rows: Record<string, number>; balances: number }
  | { ok: false; code: "not_empty" | "mismatch"; message: string };

const BATCH = 500;

/**
 * Copies everything in `source` (an open, migrated gateway SQLite database) into the empty database at
 * `url`. Refuses a database that already has tables. Rejects when PostgreSQL fails.
 */
export async function copySqliteToPostgres(source: Database, url: string): Promise<CopyResult> {
  const sql = new SQL(url, { max: 1 });
  try {
    const [tables] = await sql`SELECT COUNT(*) AS n FROM pg_tables WHERE schemaname = current_schema()`;
    if (Number((tables as Row).n) !== 0) {
      return { ok: false, code: "not_empty", message: "the target database already has tables; store migrate copies into an empty database only" };
    }
    // The source is read in one read transaction: a consistent instant even if something still writes.
    source.exec("BEGIN");
    try {
      return await sql.begin(async (tx) => {
        await applyMigrations(tx);
        const rows: Record<string, number> = {};
        for (const table of TABLES) {
          const all = source.query(`SELECT * FROM ${table.name} ORDER BY ${table.order}`).all() as Row[];
          rows[table.name] = all.length;
          for (let i = 0; i < all.length; i += BATCH) {
            const batch = all.slice(i, i + BATCH).map((row) => {
              const copy: Row = { ...row };
              for (const flag of table.flags ?? []) if (copy[flag] !== null && copy[flag] !== undefined) copy[flag] = copy[flag] === 1;
              if (table.name === "ledger_postings") copy.sealed = false;
              return copy;
            });
            await tx`INSERT INTO ${tx(table.name)} ${tx(batch)}`;
          }
        }
        await tx`UPDATE ledger_postings SET sealed = true`;
        for (const [table, column] of IDENTITIES) {
          await tx.unsafe(
            `SELECT setval(pg_get_serial_sequence('${table}', '${column}'), COALESCE(MAX(${column}), 1), MAX(${column}) IS NOT NULL) FROM ${table}`,
          );
        }
        // The copy must reproduce every balance and every held sum exactly, or nothing commits.
        const before = source
          .query("SELECT account_id, SUM(amount) AS balance FROM ledger_entries GROUP BY account_id ORDER BY account_id")
          .all() as { account_id: string; balance: number }[];
        const after = new Map(
          ((await tx`SELECT account_id, balance FROM ledger_account_totals`) as Row[]).map((r) => [r.account_id as string, Number(r.balance)]),
        );
        for (const b of before) {
          if (after.get(b.account_id) !== b.balance) {
            throw new CopyMismatch(`balance of ${b.account_id}: ${b.balance} in SQLite, ${after.get(b.account_id)} after the copy`);
          }
        }
        const heldBefore = source
          .query("SELECT account_id, SUM(credits) AS c FROM reservations WHERE payer = 'buyer' AND state = 'held' GROUP BY account_id")
          .all() as { account_id: string; c: number }[];
        const heldAfter = new Map(
          ((await tx`SELECT account_id, held_credits FROM reservation_holds`) as Row[]).map((r) => [r.account_id as string, Number(r.held_credits)]),
        );
        for (const h of heldBefore) {
          if (heldAfter.get(h.account_id) !== h.c) throw new CopyMismatch(`held credits of ${h.account_id} differ after the copy`);
        }
        return { ok: true as const, rows, balances: before.length };
      });
    } catch (error) {
      if (error instanceof CopyMismatch) return { ok: false, code: "mismatch", message: error.message };
      throw error;
    } finally {
      source.exec("ROLLBACK");
    }
  } finally {
    await sql.close();
  }
}

class CopyMismatch extends Error {}
