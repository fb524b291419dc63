// One inference entrypoint's route handler, the same for chat completions and every facade: admit
// (src/http/pipeline.ts) → check the body against the entrypoint's schema → translate it into a
// NormalizedChat → run the shared pipeline with the entrypoint's responder. Each error is rendered
// in the entrypoint's own envelope.
import type { Static, TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";
import type { NormalizedChat } from "../chat/contract.ts";
import { gatewayError, type GatewayError } from "./errors.ts";
import type { FacadeResponder } from "./output.ts";
import type { BuyerPrincipal } from "./auth.ts";
import { admitBuyerRequest, runChatPipeline, type Authenticate, type PipelineDeps, type RequestIds, type ResponderContext } from "./pipeline.ts";
import { requestTokenCapFor } from "./quotas.ts";

/** How an entrypoint reads a request: credentials, schema, translation, and its error envelope. */
export interface EntrypointParser<S extends TSchema, T extends { ok: true; chat: NormalizedChat }> {
  /** Where credentials may come from; default: a bearer API key or demo token. */
  authenticate?: Authenticate;
  checker: TypeCheck<S>;
  describeSchemaError: (body: unknown) => { message: string; param: string | null };
  /** The checked body as a chat request, or the error that refuses it. */
  translate: (body: Static<S>, request: Request, requestTokenCap: number) => T | { ok: false; error: GatewayError };
  errorResponse: (error: GatewayError, requestId: string) => Response;
}

export interface Entrypoint<S extends TSchema, T extends { ok: true; chat: NormalizedChat }> extends EntrypointParser<S, T> {
  /** The buyer route, for logs and metrics labels; default /v1/chat/completions. */
  route?: string;
  responder: (translated: T, context: ResponderContext, ids: RequestIds) => FacadeResponder;
}

/** A request read up to its chat: admitted, checked and translated, or the response that refuses it. */
export async function readEntrypointRequest<S extends TSchema, T extends { ok: true; chat: NormalizedChat }>(
  deps: PipelineDeps,
  parser: EntrypointParser<S, T>,
  request: Request,
  rid: string,
): Promise<{ ok: true; principal: BuyerPrincipal; translated: T } | { ok: false; response: Response }> {
  const admitted = await admitBuyerRequest(deps, request, parser.authenticate);
  if (!admitted.ok) return { ok: false, response: parser.errorResponse(admitted.error, rid) };
  const { json } = admitted;
  if (!parser.checker.Check(json)) {
    const { message, param } = parser.describeSchemaError(json);
    return { ok: false, response: parser.errorResponse(gatewayError("invalid_request", message, { param }), rid) };
  }
  const translated = parser.translate(json, request, requestTokenCapFor(deps, admitted.principal));
  if (!translated.ok) return { ok: false, response: parser.errorResponse(translated.error, rid) };
  return { ok: true, principal: admitted.principal, translated };
}

export function entrypointHandler<S extends TSchema, T extends { ok: true; chat: NormalizedChat }>(deps: PipelineDeps, entry: Entrypoint<S, T>) {
  return async (request: Request, ids: RequestIds): Promise<Response> => {
    const rid = ids.responseRequestId;
    const read = await readEntrypointRequest(deps, entry, request, rid);
    if (!read.ok) return read.response;
    const { translated } = read;
    return runChatPipeline(deps, {
      request,
      ids,
      principal: read.principal,
      chat: translated.chat,
      refuse: (error) => entry.errorResponse(error, rid),
      buyerRoute: entry.route,
      responder: (context) => entry.responder(translated, context, ids),
    });
  };
}
