// The v0.4 settlement receipt T (docs/receipts.md): exactly these fields, no more, no fewer.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { AttemptN, ProviderId, RequestId, TerminalState } from "../wire/frames.ts";

const Strict = { additionalProperties: false } as const;

/** `receipt_version` of the v0.4 format. */
export const RECEIPT_VERSION = "4";
export const SIGNATURE_KEY_ALG = "Ed25519";
/** `route_snapshot_policy_version` this gateway writes: it names the verification rules of docs/receipts.md. */
export const SETTLEMENT_POLICY_VERSION = "gw-settlement-v1";

// Receipt numbers are JCS numbers (IEEE doubles): above 2^53 two integers could share one text.
const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Hex64 = Type.String({ pattern: "^[0-9a-f]{64}$" });
/** Empty in observe mode for a model the catalog does not know (docs/receipts.md). */
const Hex64OrEmpty = Type.String({ pattern: "^(?:[0-9a-f]{64})?$" });

export const ReceiptKeyId = Type.String({ pattern: "^ed25519-sha256:[0-9a-f]{64}$" });
export const SnapshotMode = Type.Union([Type.Literal("observe"), Type.Literal("enforce")]);
export type SnapshotMode = Static<typeof SnapshotMode>;

export const ReceiptUsage = Type.Object(
  {
    billable_input_tokens: Count,
    billable_output_tokens: Count,
    delivered_output_bytes: Count,
    observed_input_tokens: Count,
    observed_output_tokens: Count,
  },
  Strict,
);
export type ReceiptUsage = Static<typeof ReceiptUsage>;

export const ReceiptBody = Type.Object(
  {
    receipt_version: Type.Literal(RECEIPT_VERSION),
    request_id: RequestId,
    attempt_n: AttemptN,
    provider_id: ProviderId,
    provider_receipt_key_id: ReceiptKeyId,
    signature_key_alg: Type.Literal(SIGNATURE_KEY_ALG),
    account_scope: Type.String({ maxLength: 256 }),
    model_id: Type.String({ minLength: 1, maxLength: 256 }),
    model_hash: Hex64,
    expected_catalog_model_hash: Hex64OrEmpty,
    catalog_id: Type.String({ maxLength: 128 }),
    catalog_body_digest: Hex64OrEmpty,
    route_snapshot_digest: Hex64,
    route_snapshot_mode: SnapshotMode,
    route_snapshot_policy_version: Type.String({ minLength: 1, maxLength: 64 }),
    prompt_hash: Hex64,
    output_hash: Hex64,
    output_prefix_start_byte: Count,
    output_prefix_end_byte: Count,
    terminal_state: TerminalState,
    terminal_state_ts_unix_ms: Count,
    issued_at_unix_ms: Count,
    usage: ReceiptUsage,
  },
  Strict,
);
export type ReceiptBody = Static<typeof ReceiptBody>;

export const receiptBodyChecker = TypeCompiler.Compile(ReceiptBody);

/** The field names of T, sorted (the order JCS writes them). */
export const RECEIPT_FIELDS: readonly string[] = Object.keys(ReceiptBody.properties).sort();
/** The field names of T.usage, sorted. */
export const RECEIPT_USAGE_FIELDS: readonly string[] = Object.keys(ReceiptUsage.properties).sort();

/**
 * True when `value` is an object with exactly the field set of T (and of T.usage): the
 * `field_set` rule, checked before types so a missing or extra field has its own reason.
 */
export function hasReceiptFieldSet(value: unknown): boolean {
  if (!isPlainObject(value)) return false;
  if (!sameKeys(value, RECEIPT_FIELDS)) return false;
  return isPlainObject(value.usage) && sameKeys(value.usage, RECEIPT_USAGE_FIELDS);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function sameKeys(value: Record<string, unknown>, expected: readonly string[]): boolean {
  const keys = Object.keys(value).sort();
  return keys.length === expected.length && keys.every((k, i) => k === expected[i]);
}
