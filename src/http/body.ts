// Buyer request bodies: a byte limit whatever the framing, and JSON with a nesting-depth limit.
import { gatewayError, type GatewayError } from "./errors.ts";

/** Deeper than any real chat request; deep enough nesting overflows recursive walkers (schema checks, stringify). */
export const MAX_JSON_DEPTH = 64;

/**
 * Reads the body, refusing more than `limit` bytes whatever the framing; null when over. Reads the
 * stream itself so that chunked bodies stop at the limit instead of being buffered whole.
 */
export async function readBody(request: Request, limit: number): Promise<Uint8Array | null> {
  const declared = Number(request.headers.get("content-length") ?? "NaN");
  if (declared > limit) return null;
  if (!request.body) return new Uint8Array(0);
  // A body framed by its declared length alone is already bounded by it: one native read instead of a
  // stream loop (a promise per part). Chunked framing still goes through the loop below.
  if (declared >= 0 && !request.headers.has("transfer-encoding")) {
    const body = new Uint8Array(await request.arrayBuffer());
    return body.byteLength > limit ? null : body;
  }
  const parts: Uint8Array[] = [];
  let size = 0;
  const reader = request.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      reader.cancel().catch(() => {});
      return null;
    }
    parts.push(value);
  }
  if (parts.length === 1) return parts[0]!;
  const body = new Uint8Array(size);
  let at = 0;
  for (const part of parts) {
    body.set(part, at);
    at += part.byteLength;
  }
  return body;
}

export type BodyRead = { ok: true; body: Uint8Array } | { ok: false; reason: "too_large" | "timeout" | "aborted" };

/**
 * readBody with a deadline for the whole body, so a client that sends headers and never finishes the
 * body cannot hold the request open. A read that fails is the client's connection going away
 * (`aborted`): the client's doing, not the gateway's.
 */
export async function readBodyWithin(request: Request, limit: number, deadlineMs: number): Promise<BodyRead> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), deadlineMs)));
  try {
    const read = await Promise.race([readBody(request, limit), expired]);
    if (read === "timeout") return { ok: false, reason: "timeout" };
    return read === null ? { ok: false, reason: "too_large" } : { ok: true, body: read };
  } catch {
    return { ok: false, reason: "aborted" };
  } finally {
    clearTimeout(timer);
  }
}

/** Nesting depth of JSON text, counted outside strings; stops counting past `max`. */
export function jsonDepthExceeds(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** Stateless for whole-buffer decodes, so one serves every request. */
const utf8 = new TextDecoder("utf-8", { fatal: true });

export type JsonBody = { ok: true; json: unknown } | { ok: false; error: GatewayError };

/** Decodes UTF-8 JSON, refusing invalid text and nesting deeper than MAX_JSON_DEPTH. */
export function parseJsonBody(body: Uint8Array): JsonBody {
  let text: string;
  try {
    text = utf8.decode(body);
  } catch {
    return { ok: false, error: gatewayError("invalid_request", "The request body is not valid UTF-8.") };
  }
  if (jsonDepthExceeds(text, MAX_JSON_DEPTH)) {
    return { ok: false, error: gatewayError("invalid_request", `The request body nests deeper than ${MAX_JSON_DEPTH} levels.`) };
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { ok: false, error: gatewayError("invalid_request", "The request body is not valid JSON.") };
  }
  // Valid UTF-8 cannot encode a surrogate, so a lone one can only come from a \uD800–\uDFFF escape:
  // the walk runs only for bodies that have one. Such a string cannot be UTF-8 encoded for a provider
  // (it was a 500 that SDKs retried).
  if (SURROGATE_ESCAPE.test(text)) {
    const param = loneSurrogatePath(json, "");
    if (param !== null) {
      return { ok: false, error: gatewayError("invalid_request", `The field '${param}' holds a lone UTF-16 surrogate (not valid Unicode text).`, { param }) };
    }
  }
  return { ok: true, json };
}

const SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/;

/** The path (`messages[0].content`) of the first string or key holding a lone surrogate; null when none. */
export function loneSurrogatePath(value: unknown, path: string): string | null {
  if (typeof value === "string") return value.isWellFormed() ? null : path;
  if (typeof value !== "object" || value === null) return null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = loneSurrogatePath(value[i], `${path}[${i}]`);
      if (found !== null) return found;
    }
    return null;
  }
  for (const [key, item] of Object.entries(value)) {
    const at = path === "" ? key : `${path}.${key}`;
    if (!key.isWellFormed()) return at;
    const found = loneSurrogatePath(item, at);
    if (found !== null) return found;
  }
  return null;
}
