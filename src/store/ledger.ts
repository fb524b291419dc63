// Settlements, reservations and the double-entry ledger in SQLite (DESIGN §4, §6).
// Invariants, each enforced in code inside the transaction and again by the schema (migration 3):
// - every ledger change is one synchronous BEGIN IMMEDIATE transaction (no await inside: bun:sqlite
//   would commit at the first one);
// - the entries of a posting sum to zero (checked here, then by the seal trigger);
// - at most one posting per (request_id, attempt_n) (UNIQUE);
// - a settlement's first terminal outcome is final (guarded UPDATE ... WHERE label = 'pending', and a
//   trigger that refuses any write to a settled row);
// - balances are sums of entries; ledger_account_totals mirrors each sum, kept by a trigger inside
//   the transaction that adds the entries (never written by code).
import type { Database } from "bun:sqlite";
import { createHash } from "node:crypto";
import { priceUsage, type Charge } from "../ledger/money.ts";
import type {
  DeliveredRecord,
  LedgerAccountKind,
  LedgerAuditData,
  LedgerBalance,
  LedgerStore,
  NewAttempt,
  PostingRow,
  ReceiptDisposition,
  ReservationRow,
  ReserveInput,
  ReserveResult,
  SettleInput,
  SettleResult,
  SettlementLabel,
  SettlementRow,
} from "./ledgerTypes.ts";

export const PLATFORM_ACCOUNT = "platform";
export const PROMOTION_ACCOUNT = "promotion";
/** The outside world: where granted credits come from, so every posting still sums to zero. */
export const FUNDING_ACCOUNT = "funding";
export const buyerAccount = (account_id: string) => `buyer:${account_id}`;
export const providerAccount = (provider_id: string) => `provider:${provider_id}`;

const isCount = (n: number) => Number.isSafeInteger(n) && n >= 0;

interface SettlementDbRow {
  request_id: string;
  attempt_n: number;
  provider_id: string;
  account_id: string;
  payer: "buyer" | "promotion";
  mode: "observe" | "enforce";
  prompt_credits_per_million: number;
  completion_credits_per_million: number;
  provider_share_bps: number;
  label: SettlementLabel;
  reason: string | null;
  accepted_model_hash: string | null;
  delivered_output_hash: string | null;
  delivered_start_byte: number | null;
  delivered_end_byte: number | null;
  delivered_tokens: number | null;
  delivered_terminal_state: string | null;
  delivered_finish_reason: string | null;
  delivered_tool_calls: number | null;
  reported_input_tokens: number | null;
  ended_at_ms: number | null;
  pending_deadline_at_ms: number | null;
  receipt: string | null;
  receipt_received_at_ms: number | null;
  billed_prompt_tokens: number;
  billed_completion_tokens: number;
  debit_credits: number;
  provider_credits: number;
  platform_credits: number;
  created_at_ms: number;
  settled_at_ms: number | null;
}

function toSettlement(r: SettlementDbRow): SettlementRow {
  const delivered: DeliveredRecord | null =
    r.delivered_output_hash === null
      ? null
      : {
          output_hash: r.delivered_output_hash,
          start_byte: r.delivered_start_byte ?? 0,
          end_byte: r.delivered_end_byte ?? 0,
          tokens: r.delivered_tokens ?? 0,
          terminal_state: r.delivered_terminal_state ?? "",
          finish_reason: r.delivered_finish_reason,
          tool_calls_delivered: r.delivered_tool_calls === 1,
          reported_input_tokens: r.reported_input_tokens,
        };
  return {
    request_id: r.request_id,
    attempt_n: r.attempt_n,
    provider_id: r.provider_id,
    account_id: r.account_id,
    payer: r.payer,
    mode: r.mode,
    rates: {
      prompt_credits_per_million: r.prompt_credits_per_million,
      completion_credits_per_million: r.completion_credits_per_million,
      provider_share_bps: r.provider_share_bps,
    },
    label: r.label,
    reason: r.reason,
    accepted_model_hash: r.accepted_model_hash,
    delivered,
    ended_at_ms: r.ended_at_ms,
    pending_deadline_at_ms: r.pending_deadline_at_ms,
    receipt: r.receipt,
    receipt_received_at_ms: r.receipt_received_at_ms,
    billed_prompt_tokens: r.billed_prompt_tokens,
    billed_completion_tokens: r.billed_completion_tokens,
    debit_credits: r.debit_credits,
    provider_credits: r.provider_credits,
    platform_credits: r.platform_credits,
    created_at_ms: r.created_at_ms,
    settled_at_ms: r.settled_at_ms,
  };
}

interface ReservationDbRow extends Omit<ReservationRow, "request_ended"> {
  request_ended: number;
}
const toReservation = (r: ReservationDbRow): ReservationRow => ({ ...r, request_ended: r.request_ended === 1 });

function selectSettlement(db: Database, request_id: string, attempt_n: number): SettlementDbRow | null {
  return db
    .query("SELECT * FROM settlements WHERE request_id = ? AND attempt_n = ?")
    .get(request_id, attempt_n) as SettlementDbRow | null;
}

function accountKind(id: string): LedgerAccountKind {
  if (id.startsWith("buyer:")) return "buyer";
  if (id.startsWith("provider:")) return "provider";
  if (id === PLATFORM_ACCOUNT || id === PROMOTION_ACCOUNT || id === FUNDING_ACCOUNT) return id;
  throw new Error(`not a ledger account id: ${id}`);
}

function balanceOf(db: Database, ledger_account_id: string): number {
  // The trigger-kept total (migrations.ts, ledger_account_totals), equal to SUM(amount) of the account's entries: O(1) on the
  // reservation path instead of a scan of the account's whole history (issue 7).
  const row = db.query("SELECT balance AS b FROM ledger_account_totals WHERE account_id = ?").get(ledger_account_id) as { b: number } | null;
  return row?.b ?? 0;
}

/**
 * Writes one sealed posting. Must run inside a transaction. Zero amounts are left out; the rest must
 * sum to zero — a violation is a bug and throws, rolling the whole transaction back.
 */
function post(
  db: Database,
  kind: "settlement" | "grant",
  key: { request_id: string; attempt_n: number } | null,
  amounts: readonly (readonly [string, number])[],
  memo: string | null,
  now_ms: number,
): number {
  const merged = new Map<string, number>();
  for (const [account, amount] of amounts) {
    if (!Number.isSafeInteger(amount)) throw new Error(`ledger amount ${amount} is not a safe integer`);
    merged.set(account, (merged.get(account) ?? 0) + amount);
  }
  const entries = [...merged].filter(([, amount]) => amount !== 0);
  // Invariant: entries of one posting sum to zero.
  const sum = entries.reduce((s, [, amount]) => s + amount, 0);
  if (sum !== 0 || entries.length < 2) throw new Error(`unbalanced posting (sum ${sum}, ${entries.length} entries)`);

  const posting = db
    .query("INSERT INTO ledger_postings (kind, request_id, attempt_n, memo, created_at_ms) VALUES (?, ?, ?, ?, ?)")
    .run(kind, key?.request_id ?? null, key?.attempt_n ?? null, memo, now_ms);
  const posting_id = Number(posting.lastInsertRowid);
  const ensure = db.query("INSERT OR IGNORE INTO ledger_accounts (id, kind, created_at_ms) VALUES (?, ?, ?)");
  const insert = db.query("INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES (?, ?, ?)");
  for (const [account, amount] of entries) {
    ensure.run(account, accountKind(account), now_ms);
    insert.run(posting_id, account, amount);
  }
  // The seal trigger re-checks the sum in SQL; after it, the posting and its entries are immutable.
  db.query("UPDATE ledger_postings SET sealed = 1 WHERE id = ?").run(posting_id);
  return posting_id;
}

function settlementEntries(row: SettlementDbRow, charge: Charge): [string, number][] {
  const payer = row.payer === "buyer" ? buyerAccount(row.account_id) : PROMOTION_ACCOUNT;
  return [
    [payer, -charge.debit_credits],
    [providerAccount(row.provider_id), charge.provider_credits],
    [PLATFORM_ACCOUNT, charge.platform_credits],
  ];
}

/** Resolves a request's held reservation once the request ended and none of its attempts is pending. */
function resolveReservationIfDone(db: Database, request_id: string, now_ms: number): void {
  const held = db
    .query("SELECT 1 FROM reservations WHERE request_id = ? AND state = 'held' AND request_ended = 1")
    .get(request_id);
  if (held === null) return;
  const pending = db
    .query("SELECT COUNT(*) AS n FROM settlements WHERE request_id = ? AND label = 'pending'")
    .get(request_id) as { n: number };
  if (pending.n > 0) return;
  const used = db
    .query(
      `SELECT COALESCE(SUM(billed_prompt_tokens + billed_completion_tokens), 0) AS tokens,
              COALESCE(SUM(debit_credits), 0) AS credits
         FROM settlements WHERE request_id = ?`,
    )
    .get(request_id) as { tokens: number; credits: number };
  db.query(
    `UPDATE reservations SET state = ?, used_tokens = ?, used_credits = ?, resolved_at_ms = ?
      WHERE request_id = ? AND state = 'held'`,
  ).run(used.tokens > 0 || used.credits > 0 ? "finalised" : "released", used.tokens, used.credits, now_ms, request_id);
}

function heldCredits(db: Database, account_id: string): number {
  const row = db
    .query("SELECT COALESCE(SUM(credits), 0) AS c FROM reservations WHERE account_id = ? AND payer = 'buyer' AND state = 'held'")
    .get(account_id) as { c: number };
  return row.c;
}

function tokensCountedOn(db: Database, account_id: string, day: string): number {
  const row = db
    .query(
      `SELECT COALESCE(SUM(CASE state WHEN 'held' THEN tokens WHEN 'finalised' THEN used_tokens ELSE 0 END), 0) AS t
         FROM reservations WHERE account_id = ? AND day = ?`,
    )
    .get(account_id, day) as { t: number };
  return row.t;
}

/** The ledger half of the Store, over an open database. `clock` supplies times not given by the caller. */
export function ledgerStore(db: Database, clock: () => number): LedgerStore {
  return {
    recordRouteSnapshot(input: NewAttempt, now_ms = clock()) {
      // The digest is what the receipt echoes: a row whose text does not hash to it could never settle.
      if (createHash("sha256").update(input.snapshot_json).digest("hex") !== input.digest) {
        return { ok: false as const, code: "digest_mismatch" as const };
      }
      return db
        .transaction(() => {
          const exists = db
            .query("SELECT 1 FROM route_snapshots WHERE request_id = ? AND attempt_n = ?")
            .get(input.request_id, input.attempt_n);
          if (exists !== null) return { ok: false as const, code: "duplicate_attempt" as const };
          db.query(
            "INSERT INTO route_snapshots (request_id, attempt_n, digest, snapshot, created_at_ms) VALUES (?, ?, ?, ?, ?)",
          ).run(input.request_id, input.attempt_n, input.digest, input.snapshot_json, now_ms);
          db.query(
            `INSERT INTO settlements (request_id, attempt_n, provider_id, account_id, payer, mode,
               prompt_credits_per_million, completion_credits_per_million, provider_share_bps, created_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
          ).run(
            input.request_id,
            input.attempt_n,
            input.provider_id,
            input.account_id,
            input.payer,
            input.mode,
            input.rates.prompt_credits_per_million,
            input.rates.completion_credits_per_million,
            input.rates.provider_share_bps,
            now_ms,
          );
          return { ok: true as const };
        })
        .immediate();
    },

    getRouteSnapshot(request_id, attempt_n) {
      return db
        .query("SELECT snapshot AS snapshot_json, digest FROM route_snapshots WHERE request_id = ? AND attempt_n = ?")
        .get(request_id, attempt_n) as { snapshot_json: string; digest: string } | null;
    },

    recordAcceptedMeasurement(request_id, attempt_n, model_hash) {
      // `label = 'pending'` keeps a settled row untouched (its trigger would refuse the write anyway).
      const res = db
        .query(
          `UPDATE settlements SET accepted_model_hash = ?
            WHERE request_id = ? AND attempt_n = ? AND label = 'pending' AND accepted_model_hash IS NULL`,
        )
        .run(model_hash, request_id, attempt_n);
      return res.changes === 1;
    },

    recordAttemptEnd(request_id, attempt_n, d, pending_deadline_at_ms, now_ms = clock()) {
      const res = db
        .query(
          `UPDATE settlements SET delivered_output_hash = ?, delivered_start_byte = ?, delivered_end_byte = ?,
             delivered_tokens = ?, delivered_terminal_state = ?, delivered_finish_reason = ?, delivered_tool_calls = ?,
             reported_input_tokens = ?, ended_at_ms = ?, pending_deadline_at_ms = ?
            WHERE request_id = ? AND attempt_n = ? AND label = 'pending' AND ended_at_ms IS NULL`,
        )
        .run(
          d.output_hash,
          d.start_byte,
          d.end_byte,
          d.tokens,
          d.terminal_state,
          d.finish_reason,
          d.tool_calls_delivered ? 1 : 0,
          d.reported_input_tokens,
          now_ms,
          pending_deadline_at_ms,
          request_id,
          attempt_n,
        );
      return res.changes === 1;
    },

    recordReceiptArrival(input, now_ms = clock()) {
      db.query(
        `INSERT INTO receipts_received (request_id, attempt_n, provider_id, envelope, received_at_ms, disposition)
         VALUES (?, ?, ?, ?, ?, ?)`,
      ).run(input.request_id, input.attempt_n, input.provider_id, input.envelope, now_ms, input.disposition satisfies ReceiptDisposition);
    },

    settleAttempt(input: SettleInput, now_ms = clock()): SettleResult {
      return db
        .transaction((): SettleResult => {
          const row = selectSettlement(db, input.request_id, input.attempt_n);
          if (row === null) return { ok: false, code: "unknown_attempt" };
          if (row.label !== "pending") return { ok: false, code: "already_settled", settlement: toSettlement(row) };

          let charge: Charge | null = null;
          const billed = input.billed ?? null;
          if (billed !== null && (billed.prompt_tokens !== 0 || billed.completion_tokens !== 0)) {
            // enforce: only verified work is charged; observe: observed usage is (DESIGN §4). Never zero_settled.
            const allowed = input.label === "verified" || (row.mode === "observe" && input.label === "quarantined");
            if (!allowed) return { ok: false, code: "charge_not_allowed" };
            const priced = priceUsage(billed.prompt_tokens, billed.completion_tokens, {
              prompt_credits_per_million: row.prompt_credits_per_million,
              completion_credits_per_million: row.completion_credits_per_million,
              provider_share_bps: row.provider_share_bps,
            });
            if (!priced.ok) return { ok: false, code: "invalid_amount" };
            charge = priced.charge;
          }

          const res = db
            .query(
              `UPDATE settlements SET label = ?, reason = ?, receipt = COALESCE(?, receipt),
                 receipt_received_at_ms = COALESCE(?, receipt_received_at_ms),
                 billed_prompt_tokens = ?, billed_completion_tokens = ?,
                 debit_credits = ?, provider_credits = ?, platform_credits = ?, settled_at_ms = ?
                WHERE request_id = ? AND attempt_n = ? AND label = 'pending'`,
            )
            .run(
              input.label,
              input.reason,
              input.receipt?.envelope ?? null,
              input.receipt?.received_at_ms ?? null,
              charge?.prompt_tokens ?? 0,
              charge?.completion_tokens ?? 0,
              charge?.debit_credits ?? 0,
              charge?.provider_credits ?? 0,
              charge?.platform_credits ?? 0,
              now_ms,
              input.request_id,
              input.attempt_n,
            );
          if (res.changes !== 1) {
            // Unreachable under BEGIN IMMEDIATE (we hold the write lock), kept as the race guard it is.
            return { ok: false, code: "already_settled", settlement: toSettlement(selectSettlement(db, input.request_id, input.attempt_n)!) };
          }
          let posting_id: number | null = null;
          if (charge !== null && charge.debit_credits > 0) {
            posting_id = post(
              db,
              "settlement",
              { request_id: input.request_id, attempt_n: input.attempt_n },
              settlementEntries(row, charge),
              null,
              now_ms,
            );
          }
          resolveReservationIfDone(db, input.request_id, now_ms);
          return {
            ok: true,
            settlement: toSettlement(selectSettlement(db, input.request_id, input.attempt_n)!),
            posting_id,
          };
        })
        .immediate();
    },

    getSettlement(request_id, attempt_n) {
      const row = selectSettlement(db, request_id, attempt_n);
      return row === null ? null : toSettlement(row);
    },

    listSettlements(filter = {}) {
      const where: string[] = [];
      const args: string[] = [];
      if (filter.request_id !== undefined) {
        where.push("request_id = ?");
        args.push(filter.request_id);
      }
      if (filter.label !== undefined) {
        where.push("label = ?");
        args.push(filter.label);
      }
      const sql = `SELECT * FROM settlements ${where.length ? `WHERE ${where.join(" AND ")}` : ""}
                    ORDER BY created_at_ms, request_id, attempt_n`;
      return (db.query(sql).all(...args) as SettlementDbRow[]).map(toSettlement);
    },

    reserve(input: ReserveInput, now_ms = clock()): ReserveResult {
      if (!isCount(input.tokens) || !isCount(input.credits)) return { ok: false, code: "invalid_amount" };
      return db
        .transaction((): ReserveResult => {
          if (db.query("SELECT 1 FROM reservations WHERE request_id = ?").get(input.request_id) !== null) {
            return { ok: false, code: "duplicate_request" };
          }
          if (input.daily_token_limit !== undefined) {
            const used = tokensCountedOn(db, input.account_id, input.day);
            if (used + input.tokens > input.daily_token_limit) return { ok: false, code: "quota_exhausted", used_tokens: used };
          }
          if (input.payer === "buyer") {
            const available = balanceOf(db, buyerAccount(input.account_id)) - heldCredits(db, input.account_id);
            if (available < input.credits) return { ok: false, code: "insufficient_balance", available_credits: available };
          }
          db.query(
            `INSERT INTO reservations (request_id, account_id, payer, day, tokens, credits, created_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)`,
          ).run(input.request_id, input.account_id, input.payer, input.day, input.tokens, input.credits, now_ms);
          const row = db.query("SELECT * FROM reservations WHERE request_id = ?").get(input.request_id) as ReservationDbRow;
          return { ok: true, reservation: toReservation(row) };
        })
        .immediate();
    },

    markRequestEnded(request_id, now_ms = clock()) {
      return db
        .transaction(() => {
          db.query("UPDATE reservations SET request_ended = 1 WHERE request_id = ? AND state = 'held'").run(request_id);
          resolveReservationIfDone(db, request_id, now_ms);
          const row = db.query("SELECT * FROM reservations WHERE request_id = ?").get(request_id) as ReservationDbRow | null;
          return row === null ? null : toReservation(row);
        })
        .immediate();
    },

    unendedHeldReservations() {
      return (db.query("SELECT request_id FROM reservations WHERE state = 'held' AND request_ended = 0").all() as { request_id: string }[]).map(
        (r) => r.request_id,
      );
    },

    getReservation(request_id) {
      const row = db.query("SELECT * FROM reservations WHERE request_id = ?").get(request_id) as ReservationDbRow | null;
      return row === null ? null : toReservation(row);
    },

    tokensCountedOn: (account_id, day) => tokensCountedOn(db, account_id, day),

    grantCredits(account_id, credits, memo, now_ms = clock()) {
      if (!isCount(credits) || credits === 0) return { ok: false, code: "invalid_amount" };
      return db
        .transaction(() => {
          const posting_id = post(
            db,
            "grant",
            null,
            [
              [FUNDING_ACCOUNT, -credits],
              [buyerAccount(account_id), credits],
            ],
            memo ?? null,
            now_ms,
          );
          return { ok: true as const, posting_id };
        })
        .immediate();
    },

    ledgerBalance: (id) => balanceOf(db, id),

    ledgerBalances(): LedgerBalance[] {
      return db
        .query(
          `SELECT a.id AS account_id, a.kind, COALESCE(SUM(e.amount), 0) AS balance
             FROM ledger_accounts a LEFT JOIN ledger_entries e ON e.account_id = a.id
            GROUP BY a.id ORDER BY a.id`,
        )
        .all() as LedgerBalance[];
    },

    availableCredits: (account_id) => balanceOf(db, buyerAccount(account_id)) - heldCredits(db, account_id),

    ledgerAuditData(): LedgerAuditData {
      // One read transaction: postings, entries and settlements are seen at the same instant.
      return db.transaction(() => {
        const postings = db.query("SELECT * FROM ledger_postings ORDER BY id").all() as (Omit<PostingRow, "sealed" | "entries"> & {
          sealed: number;
        })[];
        const entries = db.query("SELECT posting_id, account_id, amount FROM ledger_entries ORDER BY posting_id, account_id").all() as {
          posting_id: number;
          account_id: string;
          amount: number;
        }[];
        const byPosting = new Map<number, { account_id: string; amount: number }[]>();
        for (const e of entries) {
          const list = byPosting.get(e.posting_id) ?? [];
          list.push({ account_id: e.account_id, amount: e.amount });
          byPosting.set(e.posting_id, list);
        }
        const settlements = (
          db
            .query(
              `SELECT s.*, r.snapshot AS snapshot_json, r.digest AS snapshot_digest
                 FROM settlements s LEFT JOIN route_snapshots r USING (request_id, attempt_n)
                ORDER BY s.created_at_ms, s.request_id, s.attempt_n`,
            )
            .all() as (SettlementDbRow & { snapshot_json: string | null; snapshot_digest: string | null })[]
        ).map((r) => ({ ...toSettlement(r), snapshot_json: r.snapshot_json, snapshot_digest: r.snapshot_digest }));
        const reservations = (db.query("SELECT * FROM reservations ORDER BY created_at_ms").all() as ReservationDbRow[]).map(
          toReservation,
        );
        return {
          postings: postings.map((p) => ({ ...p, sealed: p.sealed === 1, entries: byPosting.get(p.id) ?? [] })),
          settlements,
          reservations,
        };
      })();
    },
  };
}
