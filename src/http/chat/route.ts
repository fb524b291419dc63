// POST /v1/chat/completions: the shared admission checks, this route's schema and normalisation, then
// the shared pipeline with a chat-completions responder.
import { errorResponse, gatewayError } from "../errors.ts";
import { admitBuyerRequest, runChatPipeline, type PipelineDeps, type RequestIds } from "../pipeline.ts";
import { requestTokenCapFor } from "../quotas.ts";
import { chatCompletionRequestChecker, describeChatSchemaError } from "./schema.ts";
import { normalizeChatRequest } from "./normalize.ts";
import { jsonResponder, streamingResponder } from "./responders.ts";

export type ChatRouteDeps = PipelineDeps;

export function chatCompletionsHandler(deps: ChatRouteDeps) {
  return async (request: Request, ids: RequestIds): Promise<Response> => {
    const rid = ids.responseRequestId;
    const admitted = await admitBuyerRequest(deps, request);
    if (!admitted.ok) return errorResponse(admitted.error, rid);
    const { json } = admitted;
    if (!chatCompletionRequestChecker.Check(json)) {
      const { message, param } = describeChatSchemaError(json);
      return errorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const normalized = normalizeChatRequest(json, requestTokenCapFor(deps, admitted.principal));
    if (!normalized.ok) return errorResponse(normalized.error, rid);
    const { chat } = normalized;

    return runChatPipeline(deps, {
      request,
      ids,
      principal: admitted.principal,
      chat,
      refuse: (error) => errorResponse(error, rid),
      responder: (ctx) => {
        const options = {
          completionId: `chatcmpl-${ids.requestId}`,
          model: chat.model,
          created: ctx.created,
          includeUsage: chat.includeUsage,
          headers: ctx.headers,
          requestId: rid,
          onBuyerGone: ctx.onBuyerGone,
          record: ctx.record,
          recordFilled: ctx.recordFilled,
          flow: ctx.flow,
        };
        return chat.stream ? streamingResponder(options) : jsonResponder(options);
      },
    });
  };
}
