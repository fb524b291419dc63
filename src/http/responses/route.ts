// POST /v1/responses (spec §4.3, mounted only when the operator enables the responses flag): the
// shared admission checks (bearer credentials), this facade's schema and translation, then the shared
// pipeline with a responses responder. Errors use the chat-completions envelope (spec §7.1).
import { errorResponse, gatewayError } from "../errors.ts";
import { admitBuyerRequest, runChatPipeline, type PipelineDeps, type RequestIds } from "../pipeline.ts";
import { requestTokenCapFor } from "../quotas.ts";
import { describeSchemaError } from "../schemaErrors.ts";
import { responsesJsonResponder, responsesStreamResponder } from "./responders.ts";
import { responsesRequestChecker } from "./schema.ts";
import { translateResponsesRequest } from "./translate.ts";

export const RESPONSES_ROUTE = "/v1/responses";

export function responsesHandler(deps: PipelineDeps) {
  return async (request: Request, ids: RequestIds): Promise<Response> => {
    const rid = ids.responseRequestId;
    const admitted = await admitBuyerRequest(deps, request);
    if (!admitted.ok) return errorResponse(admitted.error, rid);
    const { json } = admitted;
    if (!responsesRequestChecker.Check(json)) {
      const { message, param } = describeSchemaError(responsesRequestChecker, json);
      return errorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const translated = translateResponsesRequest(json, requestTokenCapFor(deps, admitted.principal));
    if (!translated.ok) return errorResponse(translated.error, rid);
    const { chat, echo } = translated;

    return runChatPipeline(deps, {
      request,
      ids,
      principal: admitted.principal,
      chat,
      refuse: (error) => errorResponse(error, rid),
      buyerRoute: RESPONSES_ROUTE,
      responder: (context) => {
        const options = { context, model: chat.model, echo };
        return chat.stream ? responsesStreamResponder(options) : responsesJsonResponder(options);
      },
    });
  };
}
