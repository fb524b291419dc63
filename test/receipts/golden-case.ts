// Loads the golden fixture (test/fixtures/receipts/) and turns it into verifier inputs.
import { createPrivateKey } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { RouteSnapshot, VerifyReceiptInput } from "../../src/receipts/index.ts";
import type { JobMessage, JobParams, TerminalState, ToolCallDelta } from "../../src/wire/frames.ts";

export const FIXTURES = join(import.meta.dir, "..", "fixtures", "receipts");

export interface Golden {
  provider_seed_hex: string;
  provider_public_key: string;
  provider_receipt_key_id: string;
  operator_public_key: string;
  gateway_secret_utf8: string;
  account_id: string;
  job: { request_id: string; attempt_n: number; model_id: string; messages: JobMessage[]; params: JobParams };
  snapshot: RouteSnapshot;
  route_snapshot_digest: string;
  accepted_model_hash: string;
  chunks: { content?: string; tool_calls?: ToolCallDelta[]; tokens: number }[];
  delivered: {
    content: string;
    tool_calls: { index: number; id: string | null; name: string | null; arguments: string }[] | null;
    finish_reason: string | null;
    terminal_state: TerminalState;
    start_byte: number;
    end_byte: number;
    tokens: number;
  };
  observed_input_tokens: number;
  terminal_state_ts_unix_ms: number;
  issued_at_unix_ms: number;
  arrival_unix_ms: number;
  expected: {
    prompt_hash: string;
    output_hash: string;
    account_scope: string;
    verdict: "verified";
    verify_receipt: { result: string; reason: null; verifier_version: string };
    charge: { prompt_tokens: number; completion_tokens: number; debit_credits: number; provider_credits: number; platform_credits: number };
  };
}

export const golden: Golden = JSON.parse(readFileSync(join(FIXTURES, "golden.json"), "utf8"));
export const goldenEnvelope = readFileSync(join(FIXTURES, "receipt.env"), "utf8").trim();
export const goldenHistoryPath = join(FIXTURES, "catalog-history.jsonl");
export const goldenProviderKey = createPrivateKey(readFileSync(join(FIXTURES, "provider-key.pem"), "utf8"));
export const goldenPublicKey = new Uint8Array(Buffer.from(golden.provider_public_key, "base64"));

/** Verifier input for the golden attempt; `envelope` defaults to the golden receipt. */
export function goldenInput(overrides: Partial<VerifyReceiptInput> = {}): VerifyReceiptInput {
  const d = golden.delivered;
  return {
    envelope: goldenEnvelope,
    sessionPublicKey: goldenPublicKey,
    snapshot: golden.snapshot,
    snapshotDigest: golden.route_snapshot_digest,
    acceptedModelHash: golden.accepted_model_hash,
    delivered: {
      output_hash: golden.expected.output_hash,
      start_byte: d.start_byte,
      end_byte: d.end_byte,
      tokens: d.tokens,
      terminal_state: d.terminal_state,
      // The golden chunks' tool-call names and arguments: "get_time" + '{"tz":' + '"UTC"}'.
      tool_calls_delivered: true,
      tool_call_bytes: 8 + 6 + 6,
    },
    promptTokenBound: golden.snapshot.prompt_token_bound,
    requestStartMs: golden.snapshot.request_started_at_unix_ms,
    arrivalMs: golden.arrival_unix_ms,
    expected: {
      request_id: golden.job.request_id,
      attempt_n: golden.job.attempt_n,
      provider_id: golden.snapshot.provider_id,
      account_scope: golden.snapshot.account_scope,
    },
    ...overrides,
  };
}
