// Per-account usage read for GET /v1/usage (docs/usage.md), in one read transaction so the quota, the
// labels, the models and the spend are seen at the same instant. Counts and sums only: nothing here
// reads prompts or outputs (the store holds no prompt text; route snapshots hold a prompt hash).

import type { Database } from "bun:sqlite";
import type { SettlementLabel } from "./ledgerTypes.ts";

export interface ModelUsage {
  /** The model id routed (from the attempt's route snapshot). */
  model: string;
  /** Distinct requests with at least one attempt routed to the model. */
  requests: number;
  attempts: number;
  billed_prompt_tokens: number;
  billed_completion_tokens: number;
  /** Debits of this account's own balance (paid tier); free and demo usage is paid by promotion. */
  charged_credits: number;
}

export interface AccountUsage {
  /** UTC day the quota figures are for. */
  day: string;
  /** Tokens of finalised reservations of `day`: what settlement actually counted. */
  daily_tokens_used: number;
  /** Tokens still held for `day`: requests in flight and receipts pending. */
  daily_tokens_reserved: number;
  /** Credits held by this account's unresolved reservations (paid tier). */
  held_credits: number;
  /** Credits this account's balance was charged: all time, and for requests admitted on `day`. */
  spent_credits_total: number;
  spent_credits_day: number;
  /** Attempts of this account by settlement label (every label present, zero when none). */
  labels: Record<SettlementLabel, number>;
  models: ModelUsage[];
}

export interface UsageStore {
  accountUsage(account_id: string, day: string): AccountUsage;
  /** The quota half of accountUsage alone: finalised and held tokens of `day`. */
  dailyTokens(account_id: string, day: string): { used: number; reserved: number };
}

const dayQuery = (db: Database, account_id: string, day: string) =>
  db
    .query(
      `SELECT COALESCE(SUM(CASE state WHEN 'finalised' THEN used_tokens ELSE 0 END), 0) AS used,
              COALESCE(SUM(CASE state WHEN 'held' THEN tokens ELSE 0 END), 0) AS reserved,
              COALESCE(SUM(CASE WHEN state = 'finalised' AND payer = 'buyer' THEN used_credits ELSE 0 END), 0) AS spent_day
         FROM reservations WHERE account_id = ? AND day = ?`,
    )
    .get(account_id, day) as { used: number; reserved: number; spent_day: number };

export function usageStore(db: Database): UsageStore {
  return {
    dailyTokens(account_id, day) {
      const { used, reserved } = dayQuery(db, account_id, day);
      return { used, reserved };
    },

    accountUsage: (account_id, day) =>
      db.transaction((): AccountUsage => {
        const quota = dayQuery(db, account_id, day);
        const held = db
          .query("SELECT COALESCE(SUM(credits), 0) AS c FROM reservations WHERE account_id = ? AND payer = 'buyer' AND state = 'held'")
          .get(account_id) as { c: number };
        const labels: Record<SettlementLabel, number> = { pending: 0, verified: 0, quarantined: 0, zero_settled: 0 };
        const labelRows = db.query("SELECT label, COUNT(*) AS n FROM settlements WHERE account_id = ? GROUP BY label").all(account_id) as {
          label: SettlementLabel;
          n: number;
        }[];
        for (const r of labelRows) labels[r.label] = r.n;
        const models = db
          .query(
            `SELECT json_extract(r.snapshot, '$.model_id') AS model,
                    COUNT(DISTINCT s.request_id) AS requests,
                    COUNT(*) AS attempts,
                    COALESCE(SUM(s.billed_prompt_tokens), 0) AS billed_prompt_tokens,
                    COALESCE(SUM(s.billed_completion_tokens), 0) AS billed_completion_tokens,
                    COALESCE(SUM(CASE s.payer WHEN 'buyer' THEN s.debit_credits ELSE 0 END), 0) AS charged_credits
               FROM settlements s JOIN route_snapshots r USING (request_id, attempt_n)
              WHERE s.account_id = ?
              GROUP BY model ORDER BY model`,
          )
          .all(account_id) as ModelUsage[];
        const spent = models.reduce((n, m) => n + m.charged_credits, 0);
        return {
          day,
          daily_tokens_used: quota.used,
          daily_tokens_reserved: quota.reserved,
          held_credits: held.c,
          spent_credits_total: spent,
          spent_credits_day: quota.spent_day,
          labels,
          models,
        };
      })(),
  };
}
