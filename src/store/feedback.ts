// Buyer feedback (docs/usage.md): one rating per request, for operator review. The owner check, the
// per-IP hourly count and the write are one transaction, so concurrent submissions cannot overshoot
// the limit nor rate another account's request.

import type { Database } from "bun:sqlite";

export type FeedbackRating = "up" | "down";

export interface FeedbackRow {
  request_id: string;
  account_id: string;
  rating: FeedbackRating;
  comment: string | null;
  created_at_ms: number;
  updated_at_ms: number;
}

export type RecordFeedbackResult =
  /** `replaced`: the request already had a rating, now overwritten by this one. */
  | { ok: true; feedback: FeedbackRow; replaced: boolean }
  /** The request is unknown or belongs to another account (indistinguishable on purpose). */
  | { ok: false; code: "unknown_request" }
  /** `retry_at_ms`: when the oldest submission in the window leaves it. */
  | { ok: false; code: "too_many_submissions"; retry_at_ms: number };

export interface RecordFeedbackInput {
  request_id: string;
  account_id: string;
  rating: FeedbackRating;
  comment: string | null;
  /** The submitter's client IP key (/32 or /64) the hourly limit counts against. */
  ip_key: string;
  limit: number;
  window_ms: number;
}

export interface FeedbackStore {
  /** Records (or replaces) the rating of one of `account_id`'s own requests. */
  recordFeedback(input: RecordFeedbackInput, now_ms?: number): RecordFeedbackResult;
  /** Ratings, newest change first; `since_ms` keeps those changed at or after it. */
  listFeedback(filter?: { account_id?: string; since_ms?: number; limit?: number }): FeedbackRow[];
  /** How many of the account's requests are rated up and down. */
  feedbackSummary(account_id: string): { up: number; down: number };
}

/** A request belongs to an account when it was admitted for it (reservation) or routed for it. */
function ownerOf(db: Database, request_id: string): string | null {
  const row = db
    .query(
      `SELECT account_id FROM reservations WHERE request_id = ?1
       UNION ALL SELECT account_id FROM settlements WHERE request_id = ?1 LIMIT 1`,
    )
    .get(request_id) as { account_id: string } | null;
  return row?.account_id ?? null;
}

export function feedbackStore(db: Database, clock: () => number): FeedbackStore {
  return {
    recordFeedback: (input, now_ms = clock()) =>
      db
        .transaction((): RecordFeedbackResult => {
          if (ownerOf(db, input.request_id) !== input.account_id) return { ok: false, code: "unknown_request" };
          const since = now_ms - input.window_ms;
          db.query("DELETE FROM feedback_submissions WHERE submitted_at_ms <= ?").run(since);
          const count = db
            .query("SELECT COUNT(*) AS n, MIN(submitted_at_ms) AS oldest FROM feedback_submissions WHERE ip_key = ? AND submitted_at_ms > ?")
            .get(input.ip_key, since) as { n: number; oldest: number | null };
          if (count.n >= input.limit) {
            return { ok: false, code: "too_many_submissions", retry_at_ms: (count.oldest ?? now_ms) + input.window_ms };
          }
          db.query("INSERT INTO feedback_submissions (ip_key, submitted_at_ms) VALUES (?, ?)").run(input.ip_key, now_ms);
          const existing = db.query("SELECT 1 FROM feedback WHERE request_id = ?").get(input.request_id) !== null;
          db.query(
            `INSERT INTO feedback (request_id, account_id, rating, comment, created_at_ms, updated_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)
             ON CONFLICT (request_id) DO UPDATE SET rating = excluded.rating, comment = excluded.comment,
               updated_at_ms = excluded.updated_at_ms`,
          ).run(input.request_id, input.account_id, input.rating, input.comment, now_ms);
          const feedback = db.query("SELECT * FROM feedback WHERE request_id = ?").get(input.request_id) as FeedbackRow;
          return { ok: true, feedback, replaced: existing };
        })
        .immediate(),

    listFeedback(filter = {}) {
      const where: string[] = [];
      const args: (string | number)[] = [];
      if (filter.account_id !== undefined) {
        where.push("account_id = ?");
        args.push(filter.account_id);
      }
      if (filter.since_ms !== undefined) {
        where.push("updated_at_ms >= ?");
        args.push(filter.since_ms);
      }
      const limit = filter.limit === undefined ? "" : ` LIMIT ${Math.max(0, Math.floor(filter.limit))}`;
      const sql = `SELECT * FROM feedback ${where.length ? `WHERE ${where.join(" AND ")}` : ""}
                    ORDER BY updated_at_ms DESC, request_id${limit}`;
      return db.query(sql).all(...args) as FeedbackRow[];
    },

    feedbackSummary(account_id) {
      const rows = db.query("SELECT rating, COUNT(*) AS n FROM feedback WHERE account_id = ? GROUP BY rating").all(account_id) as {
        rating: FeedbackRating;
        n: number;
      }[];
      const summary = { up: 0, down: 0 };
      for (const r of rows) summary[r.rating] = r.n;
      return summary;
    },
  };
}
