// One inference entrypoint's route handler, the same for chat completions and every facade: admit
// (src/http/pipeline.ts) → check the body against the entrypoint's schema → translate it into a
// NormalizedChat → run the shared pipeline with the entrypoint's responder. Each error is rendered
// in the entrypoint's own envelope.
import type { Static, TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";
import type { NormalizedChat } from "../chat/contract.ts";
import { gatewayError, type GatewayError } from "./errors.ts";
import type { FacadeResponder } from "./output.ts";
import { admitBuyerRequest, runChatPipeline, type Authenticate, type PipelineDeps, type RequestIds, type ResponderContext } from "./pipeline.ts";
import { requestTokenCapFor } from "./quotas.ts";

export interface Entrypoint<S extends TSchema, T extends { ok: true; chat: NormalizedChat }> {
  /** The buyer route, for logs and metrics labels; default /v1/chat/completions. */
  route?: string;
  /** Where credentials may come from; default: a bearer API key or demo token. */
  authenticate?: Authenticate;
  checker: TypeCheck<S>;
  describeSchemaError: (body: unknown) => { message: string; param: string | null };
  /** The checked body as a chat request, or the error that refuses it. */
  translate: (body: Static<S>, request: Request, requestTokenCap: number) => T | { ok: false; error: GatewayError };
  errorResponse: (error: GatewayError, requestId: string) => Response;
  responder: (translated: T, context: ResponderContext, ids: RequestIds) => FacadeResponder;
}

export function entrypointHandler<S extends TSchema, T extends { ok: true; chat: NormalizedChat }>(deps: PipelineDeps, entry: Entrypoint<S, T>) {
  return async (request: Request, ids: RequestIds): Promise<Response> => {
    const rid = ids.responseRequestId;
    const admitted = await admitBuyerRequest(deps, request, entry.authenticate);
    if (!admitted.ok) return entry.errorResponse(admitted.error, rid);
    const { json } = admitted;
    if (!entry.checker.Check(json)) {
      const { message, param } = entry.describeSchemaError(json);
      return entry.errorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const translated = entry.translate(json, request, requestTokenCapFor(deps, admitted.principal));
    if (!translated.ok) return entry.errorResponse(translated.error, rid);

    return runChatPipeline(deps, {
      request,
      ids,
      principal: admitted.principal,
      chat: translated.chat,
      refuse: (error) => entry.errorResponse(error, rid),
      buyerRoute: entry.route,
      responder: (context) => entry.responder(translated, context, ids),
    });
  };
}
