// Rows of either database (bun:sqlite, Bun.SQL) to the store's types: one mapping for both. Bun.SQL
// returns int8 and numeric as strings (they may exceed 2^53), bytea as Buffer and booleans as booleans;
// SQLite returns numbers and 0/1. The store's values are integers well inside 2^53.
import type { DeliveredRecord, ReservationRow, SettlementRow } from "./ledgerTypes.ts";

type Row = Record<string, unknown>;

export const num = (v: unknown): number => (typeof v === "number" ? v : Number(v));
export const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v));

/** A settlements row (its rates and delivered record as columns; the deciding envelope in `receipt` or `receipt_envelope`). */
export function toSettlement(row: object): SettlementRow {
  const r = row as Row;
  const delivered: DeliveredRecord | null =
    r.delivered_output_hash === null || r.delivered_output_hash === undefined
      ? null
      : {
          output_hash: r.delivered_output_hash as string,
          start_byte: num(r.delivered_start_byte ?? 0),
          end_byte: num(r.delivered_end_byte ?? 0),
          tokens: num(r.delivered_tokens ?? 0),
          terminal_state: (r.delivered_terminal_state as string | null) ?? "",
          finish_reason: (r.delivered_finish_reason as string | null) ?? null,
          tool_calls_delivered: r.delivered_tool_calls === true || r.delivered_tool_calls === 1,
          tool_call_bytes: numOrNull(r.delivered_tool_call_bytes),
          reported_input_tokens: numOrNull(r.reported_input_tokens),
        };
  return {
    request_id: r.request_id as string,
    attempt_n: num(r.attempt_n),
    provider_id: r.provider_id as string,
    account_id: r.account_id as string,
    payer: r.payer as SettlementRow["payer"],
    mode: r.mode as SettlementRow["mode"],
    rates: {
      prompt_credits_per_million: num(r.prompt_credits_per_million),
      completion_credits_per_million: num(r.completion_credits_per_million),
      provider_share_bps: num(r.provider_share_bps),
    },
    label: r.label as SettlementRow["label"],
    reason: (r.reason as string | null) ?? null,
    accepted_model_hash: (r.accepted_model_hash as string | null) ?? null,
    delivered,
    ended_at_ms: numOrNull(r.ended_at_ms),
    pending_deadline_at_ms: numOrNull(r.pending_deadline_at_ms),
    receipt: ((r.receipt as string | null) ?? (r.receipt_envelope as string | null | undefined)) ?? null,
    receipt_received_at_ms: numOrNull(r.receipt_received_at_ms),
    billed_prompt_tokens: num(r.billed_prompt_tokens),
    billed_completion_tokens: num(r.billed_completion_tokens),
    debit_credits: num(r.debit_credits),
    provider_credits: num(r.provider_credits),
    platform_credits: num(r.platform_credits),
    created_at_ms: num(r.created_at_ms),
    settled_at_ms: numOrNull(r.settled_at_ms),
  };
}

/** A reservations row. */
export const toReservation = (row: object): ReservationRow => {
  const r = row as Row;
  return {
  request_id: r.request_id as string,
  account_id: r.account_id as string,
  payer: r.payer as ReservationRow["payer"],
  day: r.day as string,
  tokens: num(r.tokens),
  credits: num(r.credits),
  state: r.state as ReservationRow["state"],
  request_ended: r.request_ended === true || r.request_ended === 1,
  used_tokens: num(r.used_tokens),
  used_credits: num(r.used_credits),
  created_at_ms: num(r.created_at_ms),
  resolved_at_ms: numOrNull(r.resolved_at_ms),
  };
};

/** The reservation a successful reserve() inserts, as the schema's defaults make it (not read back). */
export function heldReservation(
  input: Pick<ReservationRow, "request_id" | "account_id" | "payer" | "day" | "tokens" | "credits">,
  now_ms: number,
): ReservationRow {
  const { request_id, account_id, payer, day, tokens, credits } = input;
  return { request_id, account_id, payer, day, tokens, credits, state: "held", request_ended: false, used_tokens: 0, used_credits: 0, created_at_ms: now_ms, resolved_at_ms: null };
}
