// Turns a schema-valid chat request into what a provider job carries (pure; docs/buyer-api.md request rules).
import { gatewayError, type GatewayError } from "../errors.ts";
import type { JobMessage, JobParams } from "../../wire/frames.ts";
import type { NormalizedChat } from "../../chat/contract.ts";
import type { ChatCompletionRequest } from "./schema.ts";

export type NormalizeResult = { ok: true; chat: NormalizedChat } | { ok: false; error: GatewayError };

const fail = (error: GatewayError): NormalizeResult => ({ ok: false, error });

function textOfParts(parts: unknown[]): string | null {
  let text = "";
  for (const part of parts) {
    if (typeof part !== "object" || part === null) return null;
    const { type, text: t } = part as { type?: unknown; text?: unknown };
    if (type !== "text" || typeof t !== "string") return null;
    text += t;
  }
  return text;
}

function normalizeMessage(m: ChatCompletionRequest["messages"][number], i: number): JobMessage | GatewayError {
  const role = m.role === "developer" ? "system" : m.role;
  const param = `messages[${i}].content`;
  let content: string | null;
  if (typeof m.content === "string") content = m.content;
  else if (Array.isArray(m.content)) {
    if (role !== "system" && role !== "user") {
      return gatewayError("unsupported_content_shape", `Content arrays are accepted for system and user messages only (${param}).`, { param });
    }
    content = textOfParts(m.content);
    if (content === null) {
      return gatewayError("unsupported_content_shape", `Only text content parts are supported in v1 (${param}).`, { param });
    }
  } else if (role === "assistant" && m.tool_calls && m.tool_calls.length > 0) content = null;
  else return gatewayError("unsupported_content_shape", `Content must be a string (${param}).`, { param });

  // Members in canonical (JCS) order, so the prompt hash's canonicalisation takes its fast path.
  const out: JobMessage = m.name === undefined ? { content, role } : { content, name: m.name, role };
  if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
  if (m.tool_calls !== undefined) out.tool_calls = m.tool_calls;
  return out;
}

/** Applies content normalisation, parameter refusals and the per-request token cap. */
export function normalizeChatRequest(body: ChatCompletionRequest, requestTokenCap: number): NormalizeResult {
  if (body.n != null && body.n !== 1) return fail(gatewayError("unsupported_parameter", "Only n = 1 is supported.", { param: "n" }));
  if (body.logprobs === true) return fail(gatewayError("unsupported_parameter", "logprobs is not supported.", { param: "logprobs" }));
  if (body.top_logprobs != null) {
    return fail(gatewayError("unsupported_parameter", "top_logprobs is not supported.", { param: "top_logprobs" }));
  }
  if (body.max_tokens != null && body.max_completion_tokens != null && body.max_tokens !== body.max_completion_tokens) {
    return fail(gatewayError("invalid_request", "max_tokens and max_completion_tokens disagree; send one of them.", { param: "max_tokens" }));
  }
  const asked = body.max_completion_tokens ?? body.max_tokens ?? undefined;
  if (asked !== undefined && asked > requestTokenCap) {
    const param = body.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens";
    return fail(
      gatewayError("quota_exhausted_request_cap", `${param} may be at most ${requestTokenCap} per request.`, { param }),
    );
  }

  const messages: JobMessage[] = [];
  for (let i = 0; i < body.messages.length; i++) {
    const m = normalizeMessage(body.messages[i]!, i);
    if ("code" in m) return fail(m);
    messages.push(m);
  }

  const params: JobParams = { max_tokens: asked ?? requestTokenCap };
  if (body.temperature != null) params.temperature = body.temperature;
  if (body.top_p != null) params.top_p = body.top_p;
  if (body.stop != null) params.stop = body.stop;
  if (body.seed != null) params.seed = body.seed;
  if (body.presence_penalty != null) params.presence_penalty = body.presence_penalty;
  if (body.frequency_penalty != null) params.frequency_penalty = body.frequency_penalty;
  if (body.response_format != null) params.response_format = body.response_format;
  if (body.tools != null) params.tools = body.tools;
  if (body.tool_choice != null) params.tool_choice = body.tool_choice;
  if (body.parallel_tool_calls != null) params.parallel_tool_calls = body.parallel_tool_calls;

  return {
    ok: true,
    chat: {
      model: body.model,
      messages,
      params,
      stream: body.stream === true,
      includeUsage: body.stream === true && body.stream_options?.include_usage === true,
    },
  };
}

// The gateway's own upper bound on prompt tokens (docs/receipts.md) is the receipts module's: one rule for
// admission, snapshots and receipt verification.
export { promptTokenBound } from "../../receipts/hashes.ts";
