// POST /v1/chat/completions: auth, body limits and validation, then one request actor per request.
import { createHmac } from "node:crypto";
import { authenticateBuyer } from "../auth.ts";
import { parseJsonBody, readBody } from "../body.ts";
import { errorResponse, gatewayError } from "../errors.ts";
import { chatCompletionRequestChecker, describeChatSchemaError } from "./schema.ts";
import { normalizeChatRequest, promptTokenBound } from "./normalize.ts";
import { jsonResponder, streamingResponder } from "./responders.ts";
import type { RequestRunner } from "../../gateway/requests.ts";
import type { Store } from "../../store/index.ts";
import type { JobRoute } from "../../wire/frames.ts";

export interface ChatRouteDeps {
  store: Store;
  runner: RequestRunner;
  maxBodyBytes: number;
  requestTokenCap: number;
  settlementMode: "observe" | "enforce";
  gatewaySecret: Uint8Array;
  accepting: () => boolean;
  now: () => number;
}

export const ROUTE_POLICY_VERSION = "gw-settlement-v1";

export function chatCompletionsHandler(deps: ChatRouteDeps) {
  return async (request: Request, ids: { requestId: string; responseRequestId: string }): Promise<Response> => {
    const rid = ids.responseRequestId;
    if (!deps.accepting()) {
      return errorResponse(gatewayError("coordinator_unavailable", "The gateway is shutting down. Retry shortly.", { retryAfterSeconds: 5 }), rid);
    }
    const body = await readBody(request, deps.maxBodyBytes);
    if (!body) {
      return errorResponse(gatewayError("request_too_large", `The request body is larger than ${deps.maxBodyBytes} bytes.`), rid);
    }
    const auth = authenticateBuyer(deps.store, request);
    if (!auth.ok) return errorResponse(auth.error, rid);

    const parsed = parseJsonBody(body);
    if (!parsed.ok) return errorResponse(parsed.error, rid);
    const json = parsed.json;
    if (!chatCompletionRequestChecker.Check(json)) {
      const { message, param } = describeChatSchemaError(json);
      return errorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const normalized = normalizeChatRequest(json, deps.requestTokenCap);
    if (!normalized.ok) return errorResponse(normalized.error, rid);
    const { chat } = normalized;

    const route: JobRoute = {
      account_scope: createHmac("sha256", deps.gatewaySecret).update(auth.key.account_id).digest("hex"),
      catalog_id: "",
      catalog_body_digest: "",
      expected_catalog_model_hash: "",
      route_snapshot_digest: "",
      route_snapshot_mode: deps.settlementMode,
      route_snapshot_policy_version: ROUTE_POLICY_VERSION,
      prompt_hash: "",
    };
    let abort = () => {};
    const options = {
      completionId: `chatcmpl-${ids.requestId}`,
      model: chat.model,
      created: Math.floor(deps.now() / 1000),
      includeUsage: chat.includeUsage,
      headers: { "x-request-id": rid },
      requestId: rid,
      onBuyerGone: () => abort(),
    };
    const responder = chat.stream ? streamingResponder(options) : jsonResponder(options);
    const started = deps.runner.start({
      requestId: ids.requestId,
      chat,
      route,
      promptBound: promptTokenBound(chat.messages, chat.params.tools),
      responder,
    });
    abort = started.abort;
    // The buyer hanging up before or during the response cancels the provider job.
    request.signal.addEventListener("abort", started.abort, { once: true });
    return responder.response;
  };
}
