// msgpack encoding of protocol frames, with schema validation after decoding.
// Decoding returns a result: the caller closes the socket with `closeCode` on failure.
import { C1, Packr, Unpackr } from "msgpackr";
import type { TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";
import {
  CloseCode,
  gatewayFrameCheckers,
  providerFrameCheckers,
  type GatewayFrame,
  type ProviderFrame,
} from "./frames.ts";
import { decodeChunkFrame } from "./chunkFrame.ts";

// Plain maps only: no msgpackr records or extensions, so any msgpack implementation can speak the protocol.
const packr = new Packr({ useRecords: false, mapsAsObjects: true, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });

export type DecodeResult<F> =
  | { ok: true; frame: F }
  | { ok: false; closeCode: number; reason: "not_binary" | "undecodable" | "unknown_type" | "schema"; frameType?: string };

export function encodeFrame(frame: GatewayFrame | ProviderFrame): Uint8Array {
  return packr.pack(frame);
}

/**
 * True when the decoded value holds msgpackr's stand-in for the byte 0xc1, which msgpack reserves as
 * "never used": msgpackr decodes it to a sentinel object instead of failing, but such bytes are not
 * msgpack (1007, not a schema or type failure).
 */
function holdsNeverUsedByte(value: unknown): boolean {
  const pending: unknown[] = [value];
  while (pending.length > 0) {
    const v = pending.pop();
    if (v === C1) return true;
    if (typeof v !== "object" || v === null || ArrayBuffer.isView(v)) continue;
    for (const child of Array.isArray(v) ? v : Object.values(v)) pending.push(child);
  }
  return false;
}

function decodeWith<F>(
  data: string | ArrayBuffer | Uint8Array,
  checkers: Record<string, TypeCheck<TSchema>>,
): DecodeResult<F> {
  if (typeof data === "string") return { ok: false, closeCode: CloseCode.unsupportedData, reason: "not_binary" };
  let value: unknown;
  try {
    value = unpackr.unpack(data instanceof Uint8Array ? data : new Uint8Array(data));
  } catch {
    return { ok: false, closeCode: CloseCode.invalidPayload, reason: "undecodable" };
  }
  const failure = frameFailure(value, checkers);
  if (!failure) return { ok: true, frame: value as F };
  // The deep walk runs only on failure, keeping it off the hot path: a stray 0xc1 can pass the schema
  // only inside a free-form field, where it is harmless.
  if (holdsNeverUsedByte(value)) return { ok: false, closeCode: CloseCode.invalidPayload, reason: "undecodable" };
  return failure;
}

function frameFailure(value: unknown, checkers: Record<string, TypeCheck<TSchema>>): DecodeResult<never> | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { ok: false, closeCode: CloseCode.policyViolation, reason: "unknown_type" };
  }
  const type = (value as { type?: unknown }).type;
  const checker = typeof type === "string" && Object.hasOwn(checkers, type) ? checkers[type] : undefined;
  if (!checker) return { ok: false, closeCode: CloseCode.policyViolation, reason: "unknown_type" };
  if (!checker.Check(value)) return { ok: false, closeCode: CloseCode.policyViolation, reason: "schema", frameType: type as string };
  return undefined;
}

/**
 * Decodes and validates a frame received by the gateway from a provider. A plain `chunk` frame (the
 * per-token path) is read by its own decoder; everything else, including every frame that decoder
 * leaves alone, takes the general path with the same result it would have had anyway.
 */
export function decodeProviderFrame(data: string | ArrayBuffer | Uint8Array): DecodeResult<ProviderFrame> {
  if (typeof data !== "string") {
    const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
    const chunk = decodeChunkFrame(bytes);
    if (chunk !== undefined) return { ok: true, frame: chunk };
    return decodeWith<ProviderFrame>(bytes, providerFrameCheckers);
  }
  return decodeWith<ProviderFrame>(data, providerFrameCheckers);
}

/** The general path alone: msgpackr and the compiled checkers (the chunk decoder's reference in tests, and what the endpoint uses for every frame the chunk decoder leaves alone). */
export function decodeProviderFrameGeneral(data: string | ArrayBuffer | Uint8Array): DecodeResult<ProviderFrame> {
  return decodeWith<ProviderFrame>(data, providerFrameCheckers);
}

/** Decodes and validates a frame received by a provider runtime from the gateway. */
export function decodeGatewayFrame(data: string | ArrayBuffer | Uint8Array): DecodeResult<GatewayFrame> {
  return decodeWith<GatewayFrame>(data, gatewayFrameCheckers);
}
