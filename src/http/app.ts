// The buyer HTTP API (Elysia). Every response gets X-Request-ID; every failure the spec's envelope.
import { Elysia } from "elysia";
import { authenticateBuyer } from "./auth.ts";
import { errorResponse, gatewayError } from "./errors.ts";
import { chatCompletionsHandler, type ChatRouteDeps } from "./chat/route.ts";
import { modelsBody, statusBody } from "./pool.ts";
import type { ProviderView } from "../gateway/routing.ts";
import type { Log } from "../log.ts";

export interface HttpDeps extends ChatRouteDeps {
  providerViews: () => ProviderView[];
  newRequestId: () => string;
  log: Log;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const corsHeaders = {
  "access-control-allow-origin": "*",
  "access-control-allow-methods": "GET, POST, OPTIONS",
  "access-control-allow-headers": "authorization, content-type, x-api-key, x-request-id, idempotency-key, x-stainless-retry-count, anthropic-version",
  "access-control-expose-headers": "x-request-id, retry-after, x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset",
  "access-control-max-age": "86400",
};

interface RequestIds {
  /** The gateway's own id: the settlement key. */
  requestId: string;
  /** What X-Request-ID carries: the client's UUID when it sent one, else ours. */
  responseRequestId: string;
}

const json = (body: unknown, rid: string, status = 200) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", "x-request-id": rid } });

export function createHttpApp(deps: HttpDeps) {
  const ids = new WeakMap<Request, RequestIds>();
  const idsOf = (request: Request): RequestIds => {
    let found = ids.get(request);
    if (!found) {
      const requestId = deps.newRequestId();
      const client = request.headers.get("x-request-id");
      found = { requestId, responseRequestId: client && UUID.test(client) ? client : requestId };
      ids.set(request, found);
    }
    return found;
  };
  const chat = chatCompletionsHandler(deps);

  const app = new Elysia()
    .onError(({ code, request, error }) => {
      const rid = idsOf(request).responseRequestId;
      if (code === "NOT_FOUND") return errorResponse(gatewayError("not_found", "The requested route does not exist."), rid);
      deps.log.error("http_handler_failed", { request_id: rid, code: String(code), error: String(error) });
      return errorResponse(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."), rid);
    })
    .options("/v1/*", () => new Response(null, { status: 204, headers: corsHeaders }))
    .post("/v1/chat/completions", ({ request }) => chat(request, idsOf(request)), { parse: "none" })
    .get("/v1/models", ({ request }) => {
      const rid = idsOf(request).responseRequestId;
      const auth = authenticateBuyer(deps.store, request);
      if (!auth.ok) return errorResponse(auth.error, rid);
      return json(modelsBody(deps.providerViews(), deps.settlementMode), rid);
    })
    .get("/v1/status", ({ request }) => json(statusBody(deps.providerViews(), deps.accepting(), deps.now()), idsOf(request).responseRequestId))
    .get("/healthz", ({ request }) => json({ ok: true }, idsOf(request).responseRequestId));

  /** Fetch handler: stamps X-Request-ID and CORS on whatever the app answered. */
  return async function handle(request: Request): Promise<Response> {
    const response = await app.handle(request);
    const rid = idsOf(request).responseRequestId;
    if (!response.headers.has("x-request-id")) response.headers.set("x-request-id", rid);
    if (new URL(request.url).pathname.startsWith("/v1/")) response.headers.set("access-control-allow-origin", "*");
    if (response.status === 405 || (response.status === 404 && !response.headers.get("content-type")?.includes("json"))) {
      return errorResponse(gatewayError("not_found", "The requested route does not exist."), rid);
    }
    return response;
  };
}
