// POST /v1/messages (docs/facades.md; mounted only when the operator enables the facade): credentials
// from x-api-key too, this facade's schema and translation, and a messages responder, on the shared
// entrypoint handler (src/http/entrypoint.ts). Every error uses the messages envelope.
import { authenticateBuyer, type AuthResult } from "../auth.ts";
import { gatewayError, messagesErrorResponse } from "../errors.ts";
import { entrypointHandler, readEntrypointRequest, type EntrypointParser } from "../entrypoint.ts";
import type { PipelineDeps } from "../pipeline.ts";
import type { NormalizeResult } from "../chat/normalize.ts";
import { describeSchemaError } from "../schemaErrors.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import { messagesJsonResponder, messagesStreamResponder } from "./responders.ts";
import { messagesRequestChecker, type MessagesRequest } from "./schema.ts";
import { promptTokenBound } from "../chat/normalize.ts";
import { translateMessagesRequest } from "./translate.ts";

export const MESSAGES_ROUTE = "/v1/messages";
export const COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens";

/**
 * Credentials of the messages facade (docs/buyer-api.md): `x-api-key: <API key>` or `Authorization: Bearer
 * <API key>` (official SDKs send one or the other depending on version); x-api-key wins when both
 * are sent. Demo tokens are not accepted here (docs/buyer-api.md lists them for other endpoints only).
 */
export async function authenticateMessagesBuyer(store: Store, request: Request): Promise<AuthResult> {
  const apiKey = request.headers.get("x-api-key")?.trim();
  if (!apiKey) {
    const auth = await authenticateBuyer(store, request, "api_key_only");
    if (auth.ok || auth.error.code !== "missing_bearer_token") return auth;
    const message = "No API key was sent. Add the header 'x-api-key: <API key>' or 'Authorization: Bearer <API key>'.";
    return { ok: false, error: gatewayError("missing_bearer_token", message) };
  }
  const key = await store.authenticateApiKey(apiKey);
  if (!key) return { ok: false, error: gatewayError("invalid_api_key", "The API key is not valid or has been revoked.") };
  return { ok: true, principal: { kind: "api_key", ...key } };
}

/** How both messages routes read a request; count_tokens reads it as a non-streaming one. */
const messagesRequests = (stream?: false): EntrypointParser<typeof MessagesRequest, NormalizeResult & { ok: true }> => ({
  authenticate: authenticateMessagesBuyer,
  checker: messagesRequestChecker,
  describeSchemaError: (body) => describeSchemaError(messagesRequestChecker, body),
  translate: (body, request, requestTokenCap) =>
    translateMessagesRequest(stream === false ? { ...body, stream } : body, { anthropicBeta: request.headers.get("anthropic-beta") }, requestTokenCap),
  errorResponse: messagesErrorResponse,
});

export function messagesHandler(deps: PipelineDeps) {
  return entrypointHandler(deps, {
    ...messagesRequests(),
    route: MESSAGES_ROUTE,
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
  const parser = messagesRequests(false);
  return async (request: Request, rid: string): Promise<Response> => {
    const read = await readEntrypointRequest(deps, parser, request, rid);
    if (!read.ok) return read.response;
    const { chat } = read.translated;
    const body = { input_tokens: promptTokenBound(chat.messages, chat.params.tools) };
    return new Response(JSON.stringify(body), { headers: { "content-type": "application/json", "x-request-id": rid } });
  };
}
