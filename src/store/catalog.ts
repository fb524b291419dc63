// The signed catalog's append-only history (docs/catalog.md). Rows are only ever inserted: the table's
// triggers refuse UPDATE and DELETE, and nothing here issues either. A feed is accepted only when its
// signature verifies and it has not expired at the moment of acceptance.

import type { Database } from "bun:sqlite";
import { verifyCatalogFeed } from "../catalog/feed.ts";
import type { AppendCatalogInput, AppendCatalogResult, CatalogHistoryEntry } from "./types.ts";

/** A catalog_history row: its columns are exactly the entry's fields. */
type HistoryRow = CatalogHistoryEntry;

const COLUMNS = "seq, catalog_id, body, signature, body_digest, public_key, issued_at_ms, expires_at_ms, accepted_at_ms";

const toEntry = (row: HistoryRow): CatalogHistoryEntry => ({ ...row });

export function appendCatalog(db: Database, input: AppendCatalogInput, now_ms: number): AppendCatalogResult {
  // Verified outside the transaction: Ed25519 and JSON parsing need no lock, so the write lock is
  // held only for the few statements below.
  const verified = verifyCatalogFeed(input.body, input.signature, input.public_key, { now_ms });
  if (!verified.ok) return verified;
  const feed = verified.feed;
  return db
    .transaction((): AppendCatalogResult => {
      const existing = db
        .query(`SELECT ${COLUMNS} FROM catalog_history WHERE catalog_id = ? OR body_digest = ?`)
        .get(feed.body.catalog_id, feed.digest) as HistoryRow | null;
      if (existing !== null) {
        // The same feed offered again (a retry, or two processes publishing one file) is a no-op.
        if (existing.body_digest === feed.digest) return { ok: true, entry: toEntry(existing), duplicate: true };
        return { ok: false, code: "catalog_id_taken", message: `catalog id ${feed.body.catalog_id} is already in the history with another body` };
      }
      if (input.expect_latest_seq !== undefined) {
        // Optimistic concurrency: a writer that read the catalog at seq N and derived a new body
        // from it may append only if nobody appended since, so two concurrent `catalog add`s never
        // silently drop one another's change.
        const latest = latestSeq(db);
        if (latest !== input.expect_latest_seq) {
          return { ok: false, code: "conflict", message: `catalog changed concurrently (latest seq ${latest}, expected ${input.expect_latest_seq})` };
        }
      }
      const row = db
        .query(
          `INSERT INTO catalog_history (catalog_id, body, signature, body_digest, public_key, issued_at_ms, expires_at_ms, accepted_at_ms)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING ${COLUMNS}`,
        )
        .get(
          feed.body.catalog_id,
          feed.bytes,
          feed.signature,
          feed.digest,
          input.public_key,
          feed.issued_at_ms,
          feed.expires_at_ms,
          now_ms,
        ) as HistoryRow;
      return { ok: true, entry: toEntry(row), duplicate: false };
    })
    .immediate();
}

/** 0 when nothing was ever accepted. Cheap (the rowid b-tree's last key): polled for live reload. */
export function latestSeq(db: Database): number {
  const row = db.query("SELECT MAX(seq) AS seq FROM catalog_history").get() as { seq: number | null };
  return row.seq ?? 0;
}

export function latestCatalog(db: Database): CatalogHistoryEntry | null {
  const row = db.query(`SELECT ${COLUMNS} FROM catalog_history ORDER BY seq DESC LIMIT 1`).get();
  return row === null ? null : toEntry(row as HistoryRow);
}

export function getCatalog(db: Database, catalog_id: string): CatalogHistoryEntry | null {
  const row = db.query(`SELECT ${COLUMNS} FROM catalog_history WHERE catalog_id = ?`).get(catalog_id);
  return row === null ? null : toEntry(row as HistoryRow);
}

export function listCatalogHistory(db: Database, after_seq = 0): CatalogHistoryEntry[] {
  const rows = db.query(`SELECT ${COLUMNS} FROM catalog_history WHERE seq > ? ORDER BY seq`).all(after_seq) as HistoryRow[];
  return rows.map(toEntry);
}
