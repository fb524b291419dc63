// The receipt envelope (docs/receipts.md): base64(JCS(T)) + "." + base64(Ed25519(key, JCS(T))), standard
// padded base64. All cryptography is node:crypto, except the gateway's signature check, WebCrypto's
// (off the main thread). Expected failures come back as values.
import { sign, verify, type KeyObject } from "node:crypto";
import { publicKeyFromRaw } from "../wire/handshake.ts";
import { canonicalize } from "./jcs.ts";
import { hasReceiptFieldSet, receiptBodyChecker, type ReceiptBody } from "./schema.ts";

/** Longest envelope accepted, the `receipt` field limit of the wire frames. */
export const MAX_ENVELOPE_CHARS = 16384;

/** Why an envelope could not even be read as a v0.4 receipt. */
export type EnvelopeError =
  /** Not two canonical padded-base64 parts, a signature that is not 64 bytes, or too long. */
  | "malformed"
  /** The payload is not UTF-8 JSON, or not in its RFC 8785 canonical form (e.g. a duplicate key). */
  | "not_canonical"
  /** Missing or extra field in T or T.usage. */
  | "field_set"
  /** Right fields, wrong type or value (e.g. receipt_version other than "4", a non-hex hash). */
  | "field_invalid";

export interface ParsedEnvelope {
  body: ReceiptBody;
  /** The exact signed bytes: UTF-8 of JCS(T). */
  signed: Uint8Array<ArrayBuffer>;
  signature: Uint8Array<ArrayBuffer>;
}

export type ParseEnvelopeResult = { ok: true; envelope: ParsedEnvelope } | { ok: false; code: EnvelopeError };

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Standard padded base64 to bytes, or null for any other form (the round trip rejects stray bits). */
function decodeBase64(text: string): Uint8Array<ArrayBuffer> | null {
  if (text.length === 0 || !BASE64.test(text)) return null;
  const bytes = Buffer.from(text, "base64");
  return bytes.toString("base64") === text ? new Uint8Array(bytes) : null;
}

/** Signs T: JCS, Ed25519, and the envelope text. Throws on a body JCS cannot express (a bug). */
export function encodeEnvelope(body: ReceiptBody, privateKey: KeyObject): string {
  const signed = Buffer.from(canonicalize(body), "utf8");
  const signature = sign(null, signed, privateKey);
  return `${signed.toString("base64")}.${signature.toString("base64")}`;
}

/**
 * Reads an envelope: format, canonical JSON, field set, then field types — in that order, so each
 * failure has its own reason. The signature is NOT checked here (verifySignature does that, against a
 * key the caller trusts, never one named inside the receipt).
 */
export function parseEnvelope(envelope: string): ParseEnvelopeResult {
  const fail = (code: EnvelopeError): ParseEnvelopeResult => ({ ok: false, code });
  if (envelope.length > MAX_ENVELOPE_CHARS) return fail("malformed");
  const parts = envelope.split(".");
  if (parts.length !== 2) return fail("malformed");
  const signed = decodeBase64(parts[0]!);
  const signature = decodeBase64(parts[1]!);
  if (signed === null || signature === null || signature.byteLength !== 64) return fail("malformed");

  let text: string;
  let parsed: unknown;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(signed);
    parsed = JSON.parse(text);
  } catch {
    return fail("not_canonical");
  }
  // Re-canonicalising must give back the very bytes: this refuses duplicate keys, whitespace, other
  // number spellings and escapes — any second text for the same T.
  let canonical: string;
  try {
    canonical = canonicalize(parsed);
  } catch {
    return fail("not_canonical");
  }
  if (canonical !== text) return fail("not_canonical");
  if (!hasReceiptFieldSet(parsed)) return fail("field_set");
  if (!receiptBodyChecker.Check(parsed)) return fail("field_invalid");
  return { ok: true, envelope: { body: parsed, signed, signature } };
}

/** True when `signature` is a valid Ed25519 signature of `signed` under the raw 32-byte key. Never throws. */
export function verifySignature(envelope: Pick<ParsedEnvelope, "signed" | "signature">, publicKeyRaw: Uint8Array): boolean {
  try {
    return verify(null, envelope.signed, publicKeyFromRaw(publicKeyRaw), envelope.signature);
  } catch {
    return false;
  }
}

/** Imported verification keys by raw key (base64): importing costs more than verifying; bounded. */
const verifyKeys = new Map<string, Promise<CryptoKey | null>>();
const VERIFY_KEY_LIMIT = 1024;

function verifyKeyOf(publicKeyRaw: Uint8Array): Promise<CryptoKey | null> {
  const id = Buffer.from(publicKeyRaw).toString("base64");
  let key = verifyKeys.get(id);
  if (key === undefined) {
    key = crypto.subtle.importKey("raw", new Uint8Array(publicKeyRaw), { name: "Ed25519" }, false, ["verify"]).catch(() => null);
    if (verifyKeys.size >= VERIFY_KEY_LIMIT) verifyKeys.clear();
    verifyKeys.set(id, key);
  }
  return key;
}

/**
 * `verifySignature` with WebCrypto: the same answer for every input (test/receipts/signature-async.test.ts
 * compares them), but the Ed25519 work runs off the main thread. Never rejects.
 */
export async function verifySignatureAsync(envelope: Pick<ParsedEnvelope, "signed" | "signature">, publicKeyRaw: Uint8Array): Promise<boolean> {
  try {
    const key = await verifyKeyOf(publicKeyRaw);
    return key !== null && (await crypto.subtle.verify("Ed25519", key, envelope.signature, envelope.signed));
  } catch {
    return false;
  }
}
