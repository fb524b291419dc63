// A route-snapshot attempt over the golden receipt case, as the ledger tests record it.
import { snapshotDigest } from "../../src/receipts/index.ts";
import { canonicalize } from "../../src/receipts/jcs.ts";
import type { DeliveredRecord, NewAttempt } from "../../src/store/index.ts";
import { golden } from "../receipts/golden-case.ts";

export const rates = { prompt_credits_per_million: 200_000, completion_credits_per_million: 600_000, provider_share_bps: 9000 };

export function attempt(request_id: string, attempt_n = 0, over: Partial<NewAttempt> = {}): NewAttempt {
  const snapshot = { ...golden.snapshot, request_id, attempt_n };
  return {
    request_id,
    attempt_n,
    provider_id: snapshot.provider_id,
    account_id: "acct_1",
    payer: "buyer",
    mode: "enforce",
    snapshot_json: canonicalize(snapshot),
    digest: snapshotDigest(snapshot),
    rates,
    ...over,
  };
}

/** A normal end's delivered record of 4 tokens (11 bytes) after a 30-token prompt. */
export const delivered: DeliveredRecord = {
  output_hash: "2".repeat(64),
  start_byte: 0,
  end_byte: 11,
  tokens: 4,
  terminal_state: "normal_done",
  finish_reason: "stop",
  tool_calls_delivered: false,
  tool_call_bytes: 0,
  reported_input_tokens: 30,
};
