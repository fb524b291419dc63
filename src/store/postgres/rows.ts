// PostgreSQL rows to the store's types. Bun.SQL returns int8 and numeric as strings (they may exceed
// 2^53) and bytea as Buffer; the store's values are integers well inside 2^53 and plain Uint8Arrays.

import type { DeliveredRecord, ReservationRow, SettlementRow } from "../ledgerTypes.ts";
import type { CatalogHistoryEntry, ProviderBinding } from "../types.ts";

type Row = Record<string, unknown>;

export const num = (v: unknown): number => (typeof v === "number" ? v : Number(v));
export const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v));
export const bytes = (v: unknown): Uint8Array => new Uint8Array(v as Uint8Array);
export const bytesOrNull = (v: unknown): Uint8Array | null => (v === null || v === undefined ? null : bytes(v));

export const toBinding = (r: Row): ProviderBinding => ({
  provider_id: r.provider_id as string,
  public_key: bytesOrNull(r.public_key),
  pinned: r.pinned as boolean,
  banned: r.banned as boolean,
  first_admitted_at_ms: numOrNull(r.first_admitted_at_ms),
  updated_at_ms: num(r.updated_at_ms),
});

export const toCatalogEntry = (r: Row): CatalogHistoryEntry => ({
  seq: num(r.seq),
  catalog_id: r.catalog_id as string,
  body: bytes(r.body),
  signature: r.signature as string,
  body_digest: r.body_digest as string,
  public_key: bytes(r.public_key),
  issued_at_ms: num(r.issued_at_ms),
  expires_at_ms: num(r.expires_at_ms),
  accepted_at_ms: num(r.accepted_at_ms),
});

export function toSettlement(r: Row): SettlementRow {
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
          tool_calls_delivered: r.delivered_tool_calls === true,
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

export const toReservation = (r: Row): ReservationRow => ({
  request_id: r.request_id as string,
  account_id: r.account_id as string,
  payer: r.payer as ReservationRow["payer"],
  day: r.day as string,
  tokens: num(r.tokens),
  credits: num(r.credits),
  state: r.state as ReservationRow["state"],
  request_ended: r.request_ended as boolean,
  used_tokens: num(r.used_tokens),
  used_credits: num(r.used_credits),
  created_at_ms: num(r.created_at_ms),
  resolved_at_ms: numOrNull(r.resolved_at_ms),
});
