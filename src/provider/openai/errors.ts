// Upstream errors → the provider protocol's decline codes (docs/protocol.md). Pure. Error text is read only
// to classify it and is never logged or forwarded: it may quote the prompt.
import type { DeclineCode } from "../../wire/frames.ts";
import { errorBodyChecker } from "./schema.ts";

// Context overflow as worded by llama.cpp ("exceeds the available context size", type
// exceed_context_size_error), vLLM ("maximum context length is N tokens"), Ollama and others.
const CONTEXT_OVERFLOW =
  /exceed_context_size|context (length|size|window)|maximum context|exceeds? (the )?(available )?context|prompt is too long|too many tokens/i;

interface ErrorFacts {
  message: string;
  type: string;
}

/** The message and type of an error body in any known shape; null when `payload` is not one. */
export function errorFacts(payload: unknown): ErrorFacts | null {
  if (!errorBodyChecker.Check(payload)) return null;
  if ("error" in payload) {
    const detail = payload.error;
    if (typeof detail === "string") return { message: detail, type: "" };
    return { message: detail.message ?? "", type: detail.type ?? "" };
  }
  return { message: payload.message ?? "", type: payload.type ?? "" };
}

/** True when a payload is an error object rather than a chunk (checked before looking at `choices`). */
export function isErrorPayload(payload: unknown): boolean {
  if (typeof payload !== "object" || payload === null) return false;
  const record = payload as Record<string, unknown>;
  return (record.error !== undefined && record.error !== null) || record.object === "error";
}

function isContextOverflow(facts: ErrorFacts | null): boolean {
  return facts !== null && CONTEXT_OVERFLOW.test(`${facts.type} ${facts.message}`);
}

/**
 * The decline code for an upstream error with HTTP `status` (200 for an error inside a stream) and
 * parsed body `payload` (anything; unparsable bodies are `undefined`):
 * 429 and 503 (rate limited, busy, loading) → queue_full; a context-length error (any status: older
 * llama.cpp sent it as 500 or inside a 200 stream) → context_exceeded; 404 (model not found) →
 * model_not_loaded; anything else → internal.
 */
export function declineCodeFor(status: number, payload: unknown): DeclineCode {
  if (status === 429 || status === 503) return "queue_full";
  if (isContextOverflow(errorFacts(payload))) return "context_exceeded";
  if (status === 404) return "model_not_loaded";
  return "internal";
}

/** JSON.parse without throwing: undefined for text that is not JSON. */
export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}
