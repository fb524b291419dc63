// An independent v0.4 receipt signer, written from docs/receipts.md's text alone. It imports nothing from
// src/receipts: canonical JSON is built by hand (field names are fixed ASCII, so writing them in
// sorted order and the values with JSON.stringify is RFC 8785 for these objects), hashing and Ed25519
// are node:crypto. If src/receipts and this file disagree, a test fails — they cannot share a bug.
import { createHash, createPrivateKey, createPublicKey, sign, type KeyObject } from "node:crypto";

/** docs/receipts.md's T in JCS order (field names sorted by code unit), values as JSON text. */
export type Fields = [name: string, jsonText: string][];

const sha256 = (text: string | Uint8Array) => createHash("sha256").update(text).digest("hex");

/** Ed25519 key from a 32-byte seed: the fixed PKCS#8 prefix for Ed25519 (RFC 8410) plus the seed. */
export function keyFromSeed(seed: Uint8Array): KeyObject {
  const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), Buffer.from(seed)]);
  return createPrivateKey({ key: der, format: "der", type: "pkcs8" });
}

export function rawPublic(key: KeyObject): Uint8Array {
  // SPKI DER for Ed25519 is a 12-byte header followed by the 32 raw key bytes (RFC 8410).
  const spki = createPublicKey(key).export({ format: "der", type: "spki" });
  return new Uint8Array(spki.subarray(spki.length - 32));
}

/** "ed25519-sha256:" + hex(sha256(raw public key)). */
export const keyIdOf = (raw: Uint8Array) => `ed25519-sha256:${sha256(raw)}`;

/**
 * JSON text of an object whose keys are ASCII and numbers are integers: JSON.stringify with the
 * key list as replacer writes members in that list's order at every depth.
 */
export function sortedJson(value: unknown, keys: string[]): string {
  return JSON.stringify(value, [...keys].sort());
}

export interface ToolCall {
  index: number;
  id: string | null;
  name: string | null;
  arguments: string;
}

/** output_hash per docs/receipts.md (keys: content, finish_reason, output_prefix_end_byte, output_prefix_start_byte, terminal_state, tool_calls). */
export function outputHashOf(o: {
  content: string;
  finish_reason: string | null;
  start: number;
  end: number;
  terminal_state: string;
  tool_calls: ToolCall[] | null;
}): string {
  const calls =
    o.tool_calls === null
      ? "null"
      : `[${o.tool_calls
          .map((c) => `{"arguments":${JSON.stringify(c.arguments)},"id":${JSON.stringify(c.id)},"index":${c.index},"name":${JSON.stringify(c.name)}}`)
          .join(",")}]`;
  const text =
    `{"content":${JSON.stringify(o.content)},"finish_reason":${JSON.stringify(o.finish_reason)},` +
    `"output_prefix_end_byte":${o.end},"output_prefix_start_byte":${o.start},` +
    `"terminal_state":${JSON.stringify(o.terminal_state)},"tool_calls":${calls}}`;
  return sha256(text);
}

export interface ReceiptValues {
  request_id: string;
  attempt_n: number;
  provider_id: string;
  key: KeyObject;
  account_scope: string;
  model_id: string;
  model_hash: string;
  expected_catalog_model_hash: string;
  catalog_id: string;
  catalog_body_digest: string;
  route_snapshot_digest: string;
  route_snapshot_mode: string;
  route_snapshot_policy_version: string;
  prompt_hash: string;
  output_hash: string;
  start: number;
  end: number;
  terminal_state: string;
  terminal_state_ts_unix_ms: number;
  issued_at_unix_ms: number;
  billable_input_tokens: number;
  billable_output_tokens: number;
  delivered_output_bytes: number;
  observed_input_tokens: number;
  observed_output_tokens: number;
}

const s = JSON.stringify;

/** T as ordered (name, JSON text) pairs; attack tests edit this list before signing. */
export function fieldsOf(v: ReceiptValues): Fields {
  const usage =
    `{"billable_input_tokens":${v.billable_input_tokens},"billable_output_tokens":${v.billable_output_tokens},` +
    `"delivered_output_bytes":${v.delivered_output_bytes},"observed_input_tokens":${v.observed_input_tokens},` +
    `"observed_output_tokens":${v.observed_output_tokens}}`;
  return [
    ["account_scope", s(v.account_scope)],
    ["attempt_n", String(v.attempt_n)],
    ["catalog_body_digest", s(v.catalog_body_digest)],
    ["catalog_id", s(v.catalog_id)],
    ["expected_catalog_model_hash", s(v.expected_catalog_model_hash)],
    ["issued_at_unix_ms", String(v.issued_at_unix_ms)],
    ["model_hash", s(v.model_hash)],
    ["model_id", s(v.model_id)],
    ["output_hash", s(v.output_hash)],
    ["output_prefix_end_byte", String(v.end)],
    ["output_prefix_start_byte", String(v.start)],
    ["prompt_hash", s(v.prompt_hash)],
    ["provider_id", s(v.provider_id)],
    ["provider_receipt_key_id", s(keyIdOf(rawPublic(v.key)))],
    ["receipt_version", s("4")],
    ["request_id", s(v.request_id)],
    ["route_snapshot_digest", s(v.route_snapshot_digest)],
    ["route_snapshot_mode", s(v.route_snapshot_mode)],
    ["route_snapshot_policy_version", s(v.route_snapshot_policy_version)],
    ["signature_key_alg", s("Ed25519")],
    ["terminal_state", s(v.terminal_state)],
    ["terminal_state_ts_unix_ms", String(v.terminal_state_ts_unix_ms)],
    ["usage", usage],
  ];
}

/** base64(T) + "." + base64(Ed25519(key, T)); T = the members in the given order. */
export function signFields(fields: Fields, key: KeyObject): string {
  const t = Buffer.from(`{${fields.map(([k, v]) => `${s(k)}:${v}`).join(",")}}`, "utf8");
  return `${t.toString("base64")}.${sign(null, t, key).toString("base64")}`;
}

export const signReceipt = (v: ReceiptValues) => signFields(fieldsOf(v), v.key);

/**
 * docs/receipts.md's prompt-token bound, written from its text: UTF-8 bytes of every message content and of
 * the tools JSON, plus 8 per message, plus 16, plus, for each assistant tool call, the UTF-8 bytes of
 * its function name and arguments plus 8. A name or arguments value that is not a string counts as
 * its JSON text (docs/receipts.md).
 */
export function promptBoundOf(
  messages: readonly { role: string; content: string | null; tool_calls?: readonly unknown[] }[],
  tools?: unknown,
): number {
  const bytes = (v: unknown) => (v === undefined || v === null ? 0 : Buffer.byteLength(typeof v === "string" ? v : JSON.stringify(v), "utf8"));
  let total = 16 + (tools === undefined ? 0 : bytes(JSON.stringify(tools)));
  for (const m of messages) {
    total += 8 + bytes(m.content);
    if (m.role !== "assistant") continue;
    for (const call of m.tool_calls ?? []) {
      const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
      total += 8 + bytes(fn?.name) + bytes(fn?.arguments);
    }
  }
  return total;
}
