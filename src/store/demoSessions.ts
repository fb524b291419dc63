// Browser demo sessions, counted per client IP key (docs/quotas.md: 10 per IP per hour). Counted durably, so
// a restart does not hand every address a fresh allowance and several nodes on one database agree.
// Rows exist only for counting: a demo token is verified by its HMAC alone (src/http/demo/token.ts).

import type { Database } from "bun:sqlite";
import type { RandomBytes } from "./ids.ts";

export type DemoSessionResult =
  | { ok: true; session_id: string; issued_at_ms: number; expires_at_ms: number; remaining: number }
  /** `retry_at_ms`: when the oldest session in the window leaves it and one more may be issued. */
  | { ok: false; code: "too_many_sessions"; retry_at_ms: number };

export interface DemoSessionStore {
  /** Issues a session for `ip_key` unless `limit` were already issued to it in the last `window_ms`;
   *  the count and the insert are one transaction, so concurrent requests cannot overshoot. */
  issueDemoSession(input: { ip_key: string; limit: number; window_ms: number; ttl_ms: number }, now_ms?: number): DemoSessionResult;
}

export function demoSessionStore(db: Database, random: RandomBytes, clock: () => number): DemoSessionStore {
  return {
    issueDemoSession: (input, now_ms = clock()) =>
      db
        .transaction((): DemoSessionResult => {
          const since = now_ms - input.window_ms;
          // Rows older than the window count for nothing any more.
          db.query("DELETE FROM demo_sessions WHERE issued_at_ms <= ?").run(since);
          const row = db
            .query("SELECT COUNT(*) AS n, MIN(issued_at_ms) AS oldest FROM demo_sessions WHERE ip_key = ? AND issued_at_ms > ?")
            .get(input.ip_key, since) as { n: number; oldest: number | null };
          if (row.n >= input.limit) {
            return { ok: false, code: "too_many_sessions", retry_at_ms: (row.oldest ?? now_ms) + input.window_ms };
          }
          const session_id = Buffer.from(random(12)).toString("base64url");
          const expires_at_ms = now_ms + input.ttl_ms;
          db.query("INSERT INTO demo_sessions (id, ip_key, issued_at_ms, expires_at_ms) VALUES (?, ?, ?, ?)").run(
            session_id,
            input.ip_key,
            now_ms,
            expires_at_ms,
          );
          return { ok: true, session_id, issued_at_ms: now_ms, expires_at_ms, remaining: input.limit - row.n - 1 };
        })
        .immediate(),
  };
}
