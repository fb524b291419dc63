// POST /v1/messages (docs/facades.md; mounted only when the operator enables the facade): credentials
// from x-api-key too, this facade's schema and translation, and a messages responder, on the shared
// entrypoint handler (src/http/entrypoint.ts). Every error uses the messages envelope.
import { authenticateBuyer, type AuthResult } from "../auth.ts";
import { gatewayError, messagesErrorResponse } from "../errors.ts";
import { entrypointHandler } from "../entrypoint.ts";
import { admitBuyerRequest, type PipelineDeps } from "../pipeline.ts";
import { requestTokenCapFor } from "../quotas.ts";
import { describeSchemaError } from "../schemaErrors.ts";
import type { Store } from "../../store/index.ts";
import { messagesJsonResponder, messagesStreamResponder } from "./responders.ts";
import { messagesRequestChecker } from "./schema.ts";
import { promptTokenBound } from "../chat/normalize.ts";
import { translateMessagesRequest } from "./translate.ts";

export const MESSAGES_ROUTE = "/v1/messages";
export const COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens";

/**
 * Credentials of the messages facade (spec §5): `x-api-key: <API key>` or `Authorization: Bearer
 * <API key>` (official SDKs send one or the other depending on version); x-api-key wins when both
 * are sent. Demo tokens are not accepted here (spec §5 lists them for other endpoints only).
 */
export function authenticateMessagesBuyer(store: Store, request: Request): AuthResult {
  const apiKey = request.headers.get("x-api-key")?.trim();
  if (!apiKey) {
    const auth = authenticateBuyer(store, request, "api_key_only");
    if (auth.ok || auth.error.code !== "missing_bearer_token") return auth;
    const message = "No API key was sent. Add the header 'x-api-key: <API key>' or 'Authorization: Bearer <API key>'.";
    return { ok: false, error: gatewayError("missing_bearer_token", message) };
  }
  const key = store.authenticateApiKey(apiKey);
  if (!key) return { ok: false, error: gatewayError("invalid_api_key", "The API key is not valid or has been revoked.") };
  return { ok: true, principal: { kind: "api_key", ...key } };
}

export function messagesHandler(deps: PipelineDeps) {
  return entrypointHandler(deps, {
    route: MESSAGES_ROUTE,
    authenticate: authenticateMessagesBuyer,
    checker: messagesRequestChecker,
    describeSchemaError: (body) => describeSchemaError(messagesRequestChecker, body),
    translate: (body, request, requestTokenCap) =>
      translateMessagesRequest(body, { anthropicBeta: request.headers.get("anthropic-beta") }, requestTokenCap),
    errorResponse: messagesErrorResponse,
    responder: ({ chat }, context) =>
      chat.stream ? messagesStreamResponder({ context, model: chat.model }) : messagesJsonResponder({ context, model: chat.model }),
  });
}

/**
 * POST /v1/messages/count_tokens: the gateway's own prompt-token bound of the request as it would be
 * sent (docs/facades.md). It is the number admission reserves against, not a tokenizer's count: a
 * model's real count is lower or equal, never higher.
 */
export function countTokensHandler(deps: PipelineDeps) {
  return async (request: Request, rid: string): Promise<Response> => {
    const admitted = await admitBuyerRequest(deps, request, authenticateMessagesBuyer);
    if (!admitted.ok) return messagesErrorResponse(admitted.error, rid);
    const { json } = admitted;
    if (!messagesRequestChecker.Check(json)) {
      const { message, param } = describeSchemaError(messagesRequestChecker, json);
      return messagesErrorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const translated = translateMessagesRequest({ ...json, stream: false }, { anthropicBeta: request.headers.get("anthropic-beta") }, requestTokenCapFor(deps, admitted.principal));
    if (!translated.ok) return messagesErrorResponse(translated.error, rid);
    const { chat } = translated;
    const body = { input_tokens: promptTokenBound(chat.messages, chat.params.tools) };
    return new Response(JSON.stringify(body), { headers: { "content-type": "application/json", "x-request-id": rid } });
  };
}
