// msgpack encoding of protocol frames, with schema validation after decoding.
// Decoding returns a result: the caller closes the socket with `closeCode` on failure.
import { Packr, Unpackr } from "msgpackr";
import type { TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";
import {
  CloseCode,
  gatewayFrameCheckers,
  providerFrameCheckers,
  type GatewayFrame,
  type ProviderFrame,
} from "./frames.ts";

// Plain maps only: no msgpackr records or extensions, so any msgpack implementation can speak the protocol.
const packr = new Packr({ useRecords: false, mapsAsObjects: true, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });

export type DecodeResult<F> =
  | { ok: true; frame: F }
  | { ok: false; closeCode: number; reason: "not_binary" | "undecodable" | "unknown_type" | "schema"; frameType?: string };

export function encodeFrame(frame: GatewayFrame | ProviderFrame): Uint8Array {
  return packr.pack(frame);
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
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { ok: false, closeCode: CloseCode.policyViolation, reason: "unknown_type" };
  }
  const type = (value as { type?: unknown }).type;
  const checker = typeof type === "string" && Object.hasOwn(checkers, type) ? checkers[type] : undefined;
  if (!checker) return { ok: false, closeCode: CloseCode.policyViolation, reason: "unknown_type" };
  if (!checker.Check(value)) return { ok: false, closeCode: CloseCode.policyViolation, reason: "schema", frameType: type as string };
  return { ok: true, frame: value as F };
}

/** Decodes and validates a frame received by the gateway from a provider. */
export function decodeProviderFrame(data: string | ArrayBuffer | Uint8Array): DecodeResult<ProviderFrame> {
  return decodeWith<ProviderFrame>(data, providerFrameCheckers);
}

/** Decodes and validates a frame received by a provider runtime from the gateway. */
export function decodeGatewayFrame(data: string | ArrayBuffer | Uint8Array): DecodeResult<GatewayFrame> {
  return decodeWith<GatewayFrame>(data, gatewayFrameCheckers);
}
