// The one table mapping every buyer-facing error code to status, type and retryability (docs/buyer-api.md),
// and the envelope built from it. Messages here are the only error text buyers ever see.
import type { RequestFailure } from "../chat/contract.ts";

export const errorTable = {
  missing_bearer_token: { status: 401, type: "authentication_error", retryable: false },
  invalid_api_key: { status: 401, type: "authentication_error", retryable: false },
  invalid_demo_token: { status: 401, type: "authentication_error", retryable: false },
  invalid_request: { status: 400, type: "invalid_request_error", retryable: false },
  unsupported_content_shape: { status: 400, type: "invalid_request_error", retryable: false },
  request_too_large: { status: 413, type: "invalid_request_error", retryable: false },
  request_timeout: { status: 408, type: "invalid_request_error", retryable: true },
  // The client left while sending its request (nginx's 499): no one reads this response; it exists so
  // metrics and logs count the request as the client's doing, not as a gateway failure.
  client_closed_request: { status: 499, type: "invalid_request_error", retryable: false },
  not_found: { status: 404, type: "not_found_error", retryable: false },
  // A facade the operator has not enabled: the path exists in this build, but not on this gateway.
  endpoint_disabled: { status: 404, type: "not_found_error", retryable: false },
  method_not_allowed: { status: 405, type: "invalid_request_error", retryable: false },
  model_not_available: { status: 404, type: "not_found_error", retryable: false },
  duplicate_request_id: { status: 409, type: "invalid_request_error", retryable: false },
  idempotency_key_reused: { status: 422, type: "invalid_request_error", retryable: false },
  unsupported_parameter: { status: 400, type: "invalid_request_error", retryable: false },
  context_length_exceeded: { status: 400, type: "invalid_request_error", retryable: false },
  quota_exhausted: { status: 429, type: "rate_limit_error", retryable: true },
  quota_exhausted_request_cap: { status: 400, type: "invalid_request_error", retryable: false },
  coordinator_unavailable: { status: 503, type: "service_unavailable", retryable: true },
  provider_disconnected: { status: 502, type: "server_error", retryable: true },
  internal_error: { status: 500, type: "api_error", retryable: true },
  // Browser sign-up and the account page (docs/signup.md); rendered as HTML pages there.
  signin_failed: { status: 400, type: "invalid_request_error", retryable: false },
  signin_required: { status: 401, type: "authentication_error", retryable: false },
  invalid_csrf_token: { status: 403, type: "permission_error", retryable: false },
  too_many_api_keys: { status: 409, type: "invalid_request_error", retryable: false },
  identity_provider_unavailable: { status: 503, type: "service_unavailable", retryable: true },
} as const satisfies Record<string, { status: number; type: string; retryable: boolean }>;

export type ErrorCode = keyof typeof errorTable;

/** An expected failure as a value; `param` names the offending field when there is one. */
export interface GatewayError {
  code: ErrorCode;
  message: string;
  param?: string | null;
  retryAfterSeconds?: number;
  headers?: Record<string, string>;
}

export const gatewayError = (
  code: ErrorCode,
  message: string,
  extra: Omit<GatewayError, "code" | "message"> = {},
): GatewayError => ({ code, message, ...extra });

/**
 * A failure the gateway reported, as this layer's error: retryable unavailability says when to retry,
 * an unknown model names the `model` parameter.
 */
export const failureError = (failure: RequestFailure): GatewayError =>
  gatewayError(failure.code, failure.message, {
    retryAfterSeconds: failure.code === "coordinator_unavailable" ? 1 : undefined,
    param: failure.code === "model_not_available" ? "model" : undefined,
  });

/** The code buyers see: the request-cap variant of quota_exhausted keeps the public code. */
export const publicCode = (code: ErrorCode): string =>
  code === "quota_exhausted_request_cap" ? "quota_exhausted" : code;

export interface ErrorEnvelope {
  error: { message: string; type: string; param: string | null; code: string; retryable: boolean };
}

export function errorEnvelope(err: GatewayError): ErrorEnvelope {
  const row = errorTable[err.code];
  return {
    error: {
      message: err.message,
      type: row.type,
      param: err.param ?? null,
      code: publicCode(err.code),
      retryable: row.retryable,
    },
  };
}

/** A complete JSON error response; `requestId` goes into X-Request-ID. */
export function errorResponse(err: GatewayError, requestId: string): Response {
  const row = errorTable[err.code];
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "x-request-id": requestId,
    ...err.headers,
  };
  if (!row.retryable) headers["x-should-retry"] = "false";
  if (row.retryable && err.retryAfterSeconds !== undefined) headers["retry-after"] = String(err.retryAfterSeconds);
  return new Response(JSON.stringify(errorEnvelope(err)), { status: row.status, headers });
}

/** The in-band SSE frame that ends a stream which failed after its first byte (no [DONE] follows). */
export function inBandErrorFrame(err: GatewayError): string {
  return `data: ${JSON.stringify(errorEnvelope(err))}\n\n`;
}

/**
 * The messages facade's envelope (docs/facades.md): `{type: "error", error: {type, message, code, retryable,
 * param}}` from the same table row, so the gateway's code and retryability survive the translation.
 */
export interface MessagesErrorEnvelope {
  type: "error";
  error: ErrorEnvelope["error"];
}

export function messagesErrorEnvelope(err: GatewayError): MessagesErrorEnvelope {
  const { type, message, code, retryable, param } = errorEnvelope(err).error;
  return { type: "error", error: { type, message, code, retryable, param } };
}

/** errorResponse with the messages envelope: same status and headers. */
export function messagesErrorResponse(err: GatewayError, requestId: string): Response {
  const plain = errorResponse(err, requestId);
  return new Response(JSON.stringify(messagesErrorEnvelope(err)), { status: plain.status, headers: plain.headers });
}
