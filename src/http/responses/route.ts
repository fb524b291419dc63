// POST /v1/responses (docs/facades.md; mounted only when the operator enables the responses flag):
// bearer credentials, this facade's schema and translation, and a responses responder, on the shared
// entrypoint handler (src/http/entrypoint.ts). Errors use the chat-completions envelope.
import { entrypointHandler } from "../entrypoint.ts";
import { errorResponse } from "../errors.ts";
import type { PipelineDeps } from "../pipeline.ts";
import { describeSchemaError } from "../schemaErrors.ts";
import { responsesJsonResponder, responsesStreamResponder } from "./responders.ts";
import { responsesRequestChecker } from "./schema.ts";
import { translateResponsesRequest } from "./translate.ts";

export const RESPONSES_ROUTE = "/v1/responses";

export function responsesHandler(deps: PipelineDeps) {
  return entrypointHandler(deps, {
    route: RESPONSES_ROUTE,
    checker: responsesRequestChecker,
    describeSchemaError: (body) => describeSchemaError(responsesRequestChecker, body),
    translate: (body, _request, requestTokenCap) => translateResponsesRequest(body, requestTokenCap),
    errorResponse,
    responder: ({ chat, echo }, context) => {
      const options = { context, model: chat.model, echo };
      return chat.stream ? responsesStreamResponder(options) : responsesJsonResponder(options);
    },
  });
}
