// POST /v1/chat/completions: this route's schema and normalisation, and a chat-completions responder,
// on the shared entrypoint handler (src/http/entrypoint.ts).
import { entrypointHandler } from "../entrypoint.ts";
import { errorResponse } from "../errors.ts";
import type { PipelineDeps } from "../pipeline.ts";
import { chatCompletionRequestChecker, describeChatSchemaError } from "./schema.ts";
import { normalizeChatRequest } from "./normalize.ts";
import { jsonResponder, streamingResponder } from "./responders.ts";

export type ChatRouteDeps = PipelineDeps;

export function chatCompletionsHandler(deps: ChatRouteDeps) {
  return entrypointHandler(deps, {
    checker: chatCompletionRequestChecker,
    describeSchemaError: describeChatSchemaError,
    translate: (body, _request, requestTokenCap) => normalizeChatRequest(body, requestTokenCap),
    errorResponse,
    responder: ({ chat }, ctx, ids) => {
      const options = {
        completionId: `chatcmpl-${ids.requestId}`,
        model: chat.model,
        created: ctx.created,
        includeUsage: chat.includeUsage,
        headers: ctx.headers,
        requestId: ids.responseRequestId,
        onBuyerGone: ctx.onBuyerGone,
        record: ctx.record,
        recordFilled: ctx.recordFilled,
        flow: ctx.flow,
      };
      return chat.stream ? streamingResponder(options) : jsonResponder(options);
    },
  });
}
