// The settlement and ledger half of the store's interface (docs/receipts.md, docs/ledger.md). Every write is one
// synchronous BEGIN IMMEDIATE transaction; balances are always derived from ledger entries.

import type { FinalLabel, Payer, SettlementLabel, SettlementMode } from "../ledger/charges.ts";
export type { FinalLabel, Payer, SettlementLabel, SettlementMode };

export interface SettlementRates {
  prompt_credits_per_million: number;
  completion_credits_per_million: number;
  provider_share_bps: number;
}

/** What the gateway delivered for one attempt, persisted when the attempt ends (no output text). */
export interface DeliveredRecord {
  output_hash: string;
  start_byte: number;
  end_byte: number;
  tokens: number;
  terminal_state: string;
  finish_reason: string | null;
  tool_calls_delivered: boolean;
  /** UTF-8 bytes of the tool-call deltas delivered (the output-token bound counts them); null in rows written before it was kept. */
  tool_call_bytes: number | null;
  /** `end.usage.input_tokens` as the provider reported it (observe-mode billing); null when no `end` came. */
  reported_input_tokens: number | null;
}

export interface NewAttempt {
  request_id: string;
  attempt_n: number;
  provider_id: string;
  /** Buyer account id, or the demo scope (`demo:<ip>`). */
  account_id: string;
  payer: Payer;
  mode: SettlementMode;
  /** JCS text of the route snapshot; `digest` is sha256 hex of it. */
  snapshot_json: string;
  digest: string;
  rates: SettlementRates;
}

export interface SettlementRow {
  request_id: string;
  attempt_n: number;
  provider_id: string;
  account_id: string;
  payer: Payer;
  mode: SettlementMode;
  rates: SettlementRates;
  label: SettlementLabel;
  reason: string | null;
  accepted_model_hash: string | null;
  delivered: DeliveredRecord | null;
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

export interface SettleInput {
  request_id: string;
  attempt_n: number;
  label: FinalLabel;
  /** null for verified; a word of SETTLEMENT_REASONS otherwise. */
  reason: string | null;
  /**
   * The envelope that decided the outcome, and when it arrived. With `arrival_id` (its row in the
   * arrival log, from recordReceiptArrival) the settlement refers to that row instead of storing the
   * envelope a second time.
   */
  receipt?: { envelope: string; received_at_ms: number; arrival_id?: number };
  /**
   * Tokens to bill at the attempt's route-time rates, or null for no charge. Allowed only for
   * `verified`, or in observe mode (billing follows observed usage there). The store prices them.
   */
  billed?: { prompt_tokens: number; completion_tokens: number } | null;
  /**
   * The attempt's delivered record, when it ends in the same breath as it settles: written with the
   * outcome, as recordAttemptEnd would have (ignored when a record was already written).
   */
  ended?: { delivered: DeliveredRecord; ended_at_ms: number; pending_deadline_at_ms: number };
  /**
   * The attempt's `accepted` measurement, written with the outcome unless one is written already
   * (the first one wins, as with recordAcceptedMeasurement).
   */
  accepted_model_hash?: string | null;
  /**
   * The request starts no more attempts: marked ended in the same transaction, after the outcome, as
   * markRequestEnded would (its reservation then resolves unless another attempt is pending). Applied
   * only with a written outcome: on any refusal the caller still owes markRequestEnded.
   */
  end_request?: boolean;
}

export type SettleResult =
  | { ok: true; settlement: SettlementRow; posting_id: number | null }
  | { ok: false; code: "unknown_attempt" }
  /** The first terminal outcome stands; nothing was written. */
  | { ok: false; code: "already_settled"; settlement: SettlementRow }
  | { ok: false; code: "charge_not_allowed" | "invalid_amount" };

export type ReceiptDisposition = "judged" | "after_final" | "unknown_attempt";

export interface ReservationRow {
  request_id: string;
  account_id: string;
  payer: Payer;
  day: string;
  tokens: number;
  credits: number;
  state: "held" | "finalised" | "released";
  request_ended: boolean;
  used_tokens: number;
  used_credits: number;
  created_at_ms: number;
  resolved_at_ms: number | null;
}

export interface ReserveInput {
  request_id: string;
  account_id: string;
  payer: Payer;
  /** UTC day (YYYY-MM-DD) the daily quota counts against. */
  day: string;
  /** Prompt bound + max_tokens. */
  tokens: number;
  /** The most the request can cost (reservationCredits). Checked against the balance for `buyer`. */
  credits: number;
  /** Daily token quota of the account; omitted = none. Held and used tokens of `day` count. */
  daily_token_limit?: number;
}

export type ReserveResult =
  | { ok: true; reservation: ReservationRow }
  | { ok: false; code: "insufficient_balance"; available_credits: number }
  | { ok: false; code: "quota_exhausted"; used_tokens: number }
  | { ok: false; code: "duplicate_request" | "invalid_amount" };

export type LedgerAccountKind = "buyer" | "provider" | "platform" | "promotion" | "funding";

export interface LedgerBalance {
  account_id: string;
  kind: LedgerAccountKind;
  balance: number;
}

export interface PostingRow {
  id: number;
  kind: "settlement" | "grant";
  request_id: string | null;
  attempt_n: number | null;
  sealed: boolean;
  memo: string | null;
  created_at_ms: number;
  entries: { account_id: string; amount: number }[];
}

/** Everything `gateway ledger audit` reads, in one consistent read transaction. */
export interface LedgerAuditData {
  postings: PostingRow[];
  settlements: (SettlementRow & { snapshot_json: string | null; snapshot_digest: string | null })[];
  reservations: ReservationRow[];
}

export interface LedgerStore {
  /** Persists the route snapshot and opens the attempt's settlement (`pending`), before dispatch. */
  recordRouteSnapshot(
    input: NewAttempt,
    now_ms?: number,
  ): { ok: true } | { ok: false; code: "duplicate_attempt" | "digest_mismatch" };
  getRouteSnapshot(request_id: string, attempt_n: number): { snapshot_json: string; digest: string } | null;
  /** Persists `accepted.model_hash` (first one wins). False for an unknown attempt. */
  recordAcceptedMeasurement(request_id: string, attempt_n: number, model_hash: string): boolean;
  /**
   * Persists the delivered prefix and the pending deadline when the attempt ends (first one wins),
   * and the `accepted` measurement when given and none is written yet.
   */
  recordAttemptEnd(
    request_id: string,
    attempt_n: number,
    delivered: DeliveredRecord,
    pending_deadline_at_ms: number,
    now_ms?: number,
    accepted_model_hash?: string | null,
  ): boolean;
  /** Logs a received receipt envelope (every arrival, including late and duplicate ones); returns its row id. */
  recordReceiptArrival(
    input: { request_id: string; attempt_n: number; provider_id: string; envelope: string; disposition: ReceiptDisposition },
    now_ms?: number,
  ): number;
  /**
   * The terminal outcome of a pending attempt, its ledger posting (when charged) and the request's
   * reservation resolution, in one BEGIN IMMEDIATE transaction. Only the first call for an attempt
   * writes anything.
   */
  settleAttempt(input: SettleInput, now_ms?: number): SettleResult;
  getSettlement(request_id: string, attempt_n: number): SettlementRow | null;
  /** Ordered by creation, then request id and attempt. */
  listSettlements(filter?: { request_id?: string; label?: SettlementLabel }): SettlementRow[];

  /** Holds quota and balance for a request at admission, atomically. */
  reserve(input: ReserveInput, now_ms?: number): ReserveResult;
  /** The request will start no more attempts; its reservation resolves once no attempt is pending. */
  markRequestEnded(request_id: string, now_ms?: number): void;
  /** Requests whose reservation is held and not yet marked ended (after a restart: requests the crash cut). */
  unendedHeldReservations(): string[];
  getReservation(request_id: string): ReservationRow | null;
  /** Tokens of `day` counted against the account's daily quota (held + finalised usage). */
  tokensCountedOn(account_id: string, day: string): number;

  /** Credits a paid buyer's balance (posting: funding → buyer). */
  grantCredits(
    account_id: string,
    credits: number,
    memo?: string,
    now_ms?: number,
  ): { ok: true; posting_id: number } | { ok: false; code: "invalid_amount" };
  /** Balance of one ledger account (`buyer:<id>`, `provider:<id>`, `platform`, `promotion`, `funding`), from entries. */
  ledgerBalance(ledger_account_id: string): number;
  ledgerBalances(): LedgerBalance[];
  /** A paid buyer's balance less credits held by reservations. */
  availableCredits(account_id: string): number;

  ledgerAuditData(): LedgerAuditData;
}
