// The buyer HTTP API (Elysia). Every response gets X-Request-ID; every failure the spec's envelope.
import { createHash, timingSafeEqual } from "node:crypto";
import { Elysia } from "elysia";
import { authenticateBuyer, bearerToken } from "./auth.ts";
import { errorResponse, errorTable, gatewayError, messagesErrorResponse } from "./errors.ts";
import { storeUnavailable } from "./pipeline.ts";
import { isStoreUnavailable } from "../store/asyncStore.ts";
import { chatCompletionsHandler, type ChatRouteDeps } from "./chat/route.ts";
import { COUNT_TOKENS_ROUTE, countTokensHandler, messagesHandler, MESSAGES_ROUTE } from "./messages/route.ts";
import { responsesHandler, RESPONSES_ROUTE } from "./responses/route.ts";
import { modelBody, modelPrice, modelsBody, statusBody, type CatalogView, type RoutingStatus } from "./modelsAndStatus.ts";
import { buyerReceiptsBody } from "./receipts.ts";
import { usageBody } from "./usage.ts";
import { FEEDBACK_ROUTE, feedbackHandler } from "./feedback.ts";
import { REPLAYED_HEADER } from "./idempotency.ts";
import { handleCatalog, handleCatalogPublicKey, handleCatalogSignature } from "../catalog/http.ts";
import type { CatalogLive } from "../catalog/live.ts";
import { eligibleModelIds } from "../catalog/state.ts";
import { rateCardHandler, type RateCard } from "../ledger/index.ts";
import { demoRoutes } from "./demo/routes.ts";
import { buildOpenApiDocument, docsPage, DOCS_PATH, DOCS_SCRIPT_PATH, OPENAPI_PATH } from "./docs/openapi.ts";
import { SCALAR_SCRIPT_PATH } from "./docs/assets.ts";
import { signupRoutes, type DemoOptions, type SignupOptions } from "./signup/index.ts";
import type { ProviderView } from "../gateway/routing.ts";
import type { RequestRunner } from "../gateway/requests.ts";
import type { Log } from "../log.ts";
import { noopMetrics, requestLogFields, routeLabel, type MetricsPort } from "../metrics.ts";

export interface HttpDeps extends ChatRouteDeps {
  providerViews: () => ProviderView[];
  /** Engines the node depends on (Redis in a cluster) and whether each is reachable now: /healthz shows them. */
  engines?: () => Record<string, boolean>;
  newRequestId: () => string;
  log: Log;
  metrics?: MetricsPort;
  /** Serves GET /metrics when given; otherwise that route is 404. */
  exposition?: { contentType: string; render(): Promise<string> };
  /** When set, GET /metrics needs `Authorization: Bearer <token>`. */
  metricsToken?: string;
  /** High-resolution clock (ms), shared with the request runner so arrival times compare. */
  monotonicNow?: () => number;
  /** Mount POST /v1/messages (docs/facades.md); off → the path is not_found. */
  messagesFacade?: boolean;
  /** Mount POST /v1/responses (docs/facades.md); off → the path is not_found. */
  responsesFacade?: boolean;
  /** Sign-up and the account page (/auth/<idp>/…, /account); absent → not mounted. */
  signup?: SignupOptions;
  /** Browser demo sessions and page (/auth/demo-session, /demo); absent → not mounted. */
  demo?: DemoOptions;
  /** The signed catalog (served at /v1/catalog*, disclosed in /v1/models); absent → not mounted. */
  catalog?: CatalogLive;
  /** The rate card in force (GET /v1/rate-card); absent → not mounted. */
  rateCard?: () => RateCard;
  /** Configured addresses that reach providers outside settlement, named in the disclosure. */
  excludedEntrypoints?: readonly string[];
  /** POST /v1/feedback submissions per client IP key per hour (default 60). */
  feedbackPerHour?: number;
  /** Routing's part of /v1/status (admission queue depth, cooldowns); absent → not shown. */
  routingStatus?: () => RoutingStatus;
}

const CHAT_ROUTE = "/v1/chat/completions";

/** decodeURIComponent, or null for a malformed escape. */
const safeDecode = (text: string): string | null => {
  try {
    return decodeURIComponent(text);
  } catch {
    return null;
  }
};

type InferenceHandler = (request: Request, ids: RequestIds) => Promise<Response>;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const corsHeaders = {
  "access-control-allow-origin": "*",
  "access-control-allow-methods": "GET, POST, DELETE, OPTIONS",
  "access-control-allow-headers": "authorization, content-type, x-api-key, x-request-id, idempotency-key, x-stainless-retry-count, anthropic-version, x-conversation-id",
  "access-control-expose-headers": "x-request-id, retry-after, x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, x-ratelimit-scope, idempotent-replayed",
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
  const metrics = deps.metrics ?? noopMetrics;
  const clock = deps.monotonicNow ?? (() => performance.now());

  // Arrival times of inference requests not yet handed to the runner. The runner takes the entry when it
  // starts a request actor; an entry left after the route answered marks a request rejected up front
  // (auth, validation, drain), which still gets its one request_completed line.
  const arrivals = new Map<string, number>();
  const runner: RequestRunner = {
    ...deps.runner,
    start: (spec) => {
      const arrivedAt = spec.arrivedAt ?? arrivals.get(spec.requestId);
      arrivals.delete(spec.requestId);
      return deps.runner.start({ ...spec, arrivedAt });
    },
  };
  // Every inference entrypoint is built on this runner and mounted through `inference`.
  const chat = chatCompletionsHandler({ ...deps, runner });

  /** Runs an inference entrypoint, stamping its arrival and reporting it when rejected up front. */
  const inference = async (route: string, handler: InferenceHandler, request: Request): Promise<Response> => {
    const arrivedAt = clock();
    const ids = idsOf(request);
    arrivals.set(ids.requestId, arrivedAt);
    try {
      const response = await handler(request, ids);
      if (response.status === errorTable.client_closed_request.status) deps.log.info("client_aborted_upload", { request_id: ids.responseRequestId, route });
      // A replayed result (docs/buyer-api.md) ran no request: it is neither a rejection nor a second request.
      if (arrivals.has(ids.requestId) && !response.headers.has(REPLAYED_HEADER)) await reportRejected(route, ids.requestId, response, arrivedAt);
      return response;
    } finally {
      arrivals.delete(ids.requestId);
    }
  };

  async function reportRejected(route: string, requestId: string, response: Response, arrivedAt: number): Promise<void> {
    let errorCode: string | null = null;
    try {
      // Error path only: the envelope is small and says which code the buyer got.
      const body = (await response.clone().json()) as { error?: { code?: unknown } };
      if (typeof body.error?.code === "string") errorCode = body.error.code;
    } catch {}
    const totalMs = clock() - arrivedAt;
    const summary = {
      requestId,
      accountId: null,
      route,
      model: null,
      stream: null,
      outcome: "rejected" as const,
      status: response.status,
      errorCode,
      attempts: 0,
      inputTokens: 0,
      outputTokens: 0,
      ttftMs: null,
      totalMs,
      overheadMs: totalMs,
    };
    metrics.requestCompleted(summary);
    deps.log.info("request_completed", requestLogFields(summary));
  }

  const notFound = (request: Request) => errorResponse(gatewayError("not_found", "The requested route does not exist."), idsOf(request).responseRequestId);
  const catalogRoute = (request: Request, handler: typeof handleCatalog) =>
    deps.catalog ? handler(deps.catalog, request, idsOf(request).responseRequestId) : notFound(request);

  const metricsTokenDigest = deps.metricsToken ? createHash("sha256").update(deps.metricsToken).digest() : null;
  const metricsAuthorized = (request: Request): boolean => {
    if (!metricsTokenDigest) return true;
    const token = bearerToken(request);
    // Digests have equal length, so the comparison is constant-time whatever the caller sent.
    return token !== null && timingSafeEqual(createHash("sha256").update(token).digest(), metricsTokenDigest);
  };

  const coveredEntrypoints = [
    CHAT_ROUTE,
    ...(deps.messagesFacade ? [MESSAGES_ROUTE] : []),
    ...(deps.responsesFacade ? [RESPONSES_ROUTE] : []),
  ];
  const catalogView = (): CatalogView => {
    const state = deps.catalog?.current() ?? null;
    const eligible = state ? eligibleModelIds(state) : [];
    const card = deps.rateCard?.();
    return {
      catalogId: state?.catalog_id ?? null,
      eligible,
      priceOf: (modelId) => (card ? modelPrice(card, state?.body.models.find((m) => m.model_id === modelId)?.rate_card_row) : null),
      coveredEntrypoints,
      excludedEntrypoints: deps.excludedEntrypoints ?? [],
    };
  };
  const rateCard = deps.rateCard
    ? rateCardHandler({
        card: deps.rateCard,
        now: deps.now,
        models: () => deps.catalog?.current()?.body.models ?? [],
      })
    : null;

  /** GET /v1/models/{id}: the percent-decoded rest of the path is the model id. */
  const retrieveModel = async (request: Request, rawId: string): Promise<Response> => {
    const rid = idsOf(request).responseRequestId;
    const auth = await authenticateBuyer(deps.store, request, "demo_allowed");
    if (!auth.ok) return errorResponse(auth.error, rid);
    const id = safeDecode(rawId);
    const model = id === null ? null : modelBody(deps.providerViews(), deps.settlementMode, catalogView(), id);
    if (!model) {
      const message = `The model '${id ?? rawId}' is not served here right now; GET /v1/models lists the models a request can reach.`;
      return errorResponse(gatewayError("model_not_available", message, { param: "model" }), rid);
    }
    return json(model, rid);
  };

  const feedback = feedbackHandler({ store: deps.store, now: deps.now, perHour: deps.feedbackPerHour ?? 60 });

  // Elysia finds the path from index 11 of the URL by default ("http://a.bc"), so a Host shorter than
  // four characters (`a`, `x.y`) made every route 404. Bun.serve here is plain HTTP (TLS ends at the
  // load balancer), so the path starts after "http://" + host: index 7 is always safe.
  const app = new Elysia({ handler: { standardHostname: false } })
    .onError(({ code, request, error }) => {
      const rid = idsOf(request).responseRequestId;
      if (code === "NOT_FOUND") return errorResponse(gatewayError("not_found", "The requested route does not exist."), rid);
      // Any route whose store call found the database unreachable: a clear retryable 503, not a 500.
      if (isStoreUnavailable(error)) return errorResponse(storeUnavailable(), rid);
      // A body read that failed because the client left (any route that reads one) is the client's doing.
      if (request.signal.aborted) {
        deps.log.info("client_aborted_upload", { request_id: rid, code: String(code) });
        return errorResponse(gatewayError("client_closed_request", "The client closed the connection."), rid);
      }
      deps.log.error("http_handler_failed", { request_id: rid, code: String(code), error: String(error) });
      return errorResponse(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."), rid);
    })
    .options("/v1/*", () => new Response(null, { status: 204, headers: corsHeaders }))
    .use(deps.demo ? demoRoutes({ ...deps.demo, requestId: (r) => idsOf(r).responseRequestId }) : new Elysia())
    .use(deps.signup ? signupRoutes({ ...deps.signup, requestId: (r) => idsOf(r).responseRequestId }) : new Elysia())
    .post(CHAT_ROUTE, ({ request }) => inference(CHAT_ROUTE, chat, request), { parse: "none" })
    .get("/v1/models", async ({ request }) => {
      const rid = idsOf(request).responseRequestId;
      const auth = await authenticateBuyer(deps.store, request, "demo_allowed");
      if (!auth.ok) return errorResponse(auth.error, rid);
      return json(modelsBody(deps.providerViews(), deps.settlementMode, catalogView()), rid);
    })
    .get("/v1/models/:id", ({ request, params }) => retrieveModel(request, params.id))
    // Model ids may hold "/" (org/name); SDKs send it as %2F, other clients as a plain slash.
    .get("/v1/models/*", ({ request, params }) => retrieveModel(request, params["*"]), { detail: { hide: true } })
    .get("/v1/status", ({ request }) => {
      const health = deps.catalog?.health(deps.now());
      const catalog = !health || health.status === "ok" ? { status: "ok" as const } : { status: "degraded" as const, reason: health.reason };
      return json(statusBody(deps.providerViews(), deps.accepting(), deps.now(), catalog, deps.routingStatus?.()), idsOf(request).responseRequestId);
    })
    .delete("/v1/sticky", async ({ request }) => {
      // Purges the caller's sticky conversations (docs/routing.md); 0 when sticky routing is off.
      const rid = idsOf(request).responseRequestId;
      const auth = await authenticateBuyer(deps.store, request, "demo_allowed");
      if (!auth.ok) return errorResponse(auth.error, rid);
      const deleted = deps.sticky ? await deps.sticky.map.purgeAccount(auth.principal.account_id, deps.now()) : 0;
      return json({ object: "sticky.purged", deleted }, rid);
    })
    .get("/v1/receipts/:request_id", async ({ request, params }) => {
      const rid = idsOf(request).responseRequestId;
      const auth = await authenticateBuyer(deps.store, request, "api_key_only");
      if (!auth.ok) return errorResponse(auth.error, rid);
      const body = await buyerReceiptsBody(deps.store, auth.principal.account_id, params.request_id, deps.settlementMode);
      return body ? json(body, rid) : errorResponse(gatewayError("not_found", "No request with this id belongs to this account."), rid);
    })
    .get("/v1/usage", async ({ request }) => {
      const rid = idsOf(request).responseRequestId;
      const auth = await authenticateBuyer(deps.store, request, "api_key_only");
      if (!auth.ok) return errorResponse(auth.error, rid);
      if (auth.principal.kind !== "api_key") return notFound(request);
      const body = await usageBody({ ...deps, coveredEntrypoints, excludedEntrypoints: deps.excludedEntrypoints ?? [] }, auth.principal);
      return new Response(JSON.stringify(body), { headers: { "content-type": "application/json", "x-request-id": rid, "cache-control": "no-store" } });
    })
    .post(FEEDBACK_ROUTE, ({ request }) => feedback(request, idsOf(request).responseRequestId), { parse: "none" })
    .get("/v1/catalog", ({ request }) => catalogRoute(request, handleCatalog))
    .get("/v1/catalog.sig", ({ request }) => catalogRoute(request, handleCatalogSignature))
    .get("/v1/catalog/pubkey", ({ request }) => catalogRoute(request, handleCatalogPublicKey))
    .get("/v1/rate-card", ({ request }) => (rateCard ? rateCard() : notFound(request)))
    .get("/healthz", ({ request }) => {
      // 503 while draining, so a load balancer stops sending new requests before the process exits.
      // 503 while an engine it needs (Redis, in a cluster) is unreachable: the node cannot serve.
      const running = deps.accepting();
      // Every engine the node depends on: the durable store (PostgreSQL or SQLite) and, in a cluster,
      // Redis. A node that cannot reach one answers 503, so a load balancer takes it out.
      const store = deps.store.health();
      const engines = deps.engines?.() ?? {};
      const degraded = !store.up || Object.values(engines).some((up) => !up);
      const body = {
        ok: running && !degraded,
        status: !running ? "draining" : degraded ? "degraded" : "running",
        live_requests: deps.runner.liveRequests(),
        providers_admitted: deps.providerViews().length,
        store: { backend: store.backend, up: store.up },
        ...(deps.engines ? { engines: Object.fromEntries(Object.entries(engines).map(([name, up]) => [name, up ? "up" : "down"])) } : {}),
      };
      return json(body, idsOf(request).responseRequestId, running && !degraded ? 200 : 503);
    })
    .get("/metrics", async ({ request }) => {
      const rid = idsOf(request).responseRequestId;
      if (!deps.exposition) return errorResponse(gatewayError("not_found", "The requested route does not exist."), rid);
      if (!metricsAuthorized(request)) {
        return errorResponse(gatewayError("invalid_api_key", "The metrics token is missing or not valid."), rid);
      }
      return new Response(await deps.exposition.render(), { headers: { "content-type": deps.exposition.contentType, "x-request-id": rid } });
    });

  // The compatibility facades run only when the operator enables them (docs/buyer-api.md); both run on the same
  // runner and pipeline as chat. A disabled one still answers, in its own error style, that it exists
  // but is off here, so an SDK user is not left guessing at a bare 404.
  if (deps.messagesFacade) {
    const messages = messagesHandler({ ...deps, runner });
    const countTokens = countTokensHandler({ ...deps, runner });
    app.post(MESSAGES_ROUTE, ({ request }) => inference(MESSAGES_ROUTE, messages, request), { parse: "none" });
    app.post(COUNT_TOKENS_ROUTE, ({ request }) => countTokens(request, idsOf(request).responseRequestId), { parse: "none" });
  } else {
    const disabled = ({ request }: { request: Request }) =>
      messagesErrorResponse(
        gatewayError("endpoint_disabled", `${new URL(request.url).pathname} exists but is disabled on this gateway (the operator turns it on with --messages-facade). POST /v1/chat/completions is always available.`),
        idsOf(request).responseRequestId,
      );
    app.post(MESSAGES_ROUTE, disabled, { parse: "none" });
    app.post(COUNT_TOKENS_ROUTE, disabled, { parse: "none" });
  }
  if (deps.responsesFacade) {
    const responses = responsesHandler({ ...deps, runner });
    app.post(RESPONSES_ROUTE, ({ request }) => inference(RESPONSES_ROUTE, responses, request), { parse: "none" });
  } else {
    app.post(
      RESPONSES_ROUTE,
      ({ request }) =>
        errorResponse(
          gatewayError("endpoint_disabled", `${RESPONSES_ROUTE} exists but is disabled on this gateway (the operator turns it on with --responses-facade). POST /v1/chat/completions is always available.`),
          idsOf(request).responseRequestId,
        ),
      { parse: "none" },
    );
  }

  // The API reference: generated from the routes mounted above, once, on first request.
  let openApiDocument: string | null = null;
  app
    .get(OPENAPI_PATH, () => {
      openApiDocument ??= JSON.stringify(buildOpenApiDocument(app));
      return new Response(openApiDocument, { headers: { "content-type": "application/json" } });
    })
    .get(DOCS_PATH, () => new Response(docsPage(), { headers: { "content-type": "text/html; charset=utf-8" } }))
    .get(
      DOCS_SCRIPT_PATH,
      () => new Response(Bun.file(SCALAR_SCRIPT_PATH), { headers: { "content-type": "text/javascript; charset=utf-8", "cache-control": "public, max-age=86400" } }),
      { detail: { hide: true } },
    );

  // `routes` lists what is mounted, for the test that every public route is in /openapi.json.
  return Object.assign(handle, { routes: () => app.routes.map((r) => ({ method: r.method, path: r.path, hidden: Boolean((r.hooks as { detail?: { hide?: boolean } }).detail?.hide) })) });

  /** Fetch handler: stamps X-Request-ID and CORS on whatever the app answered. */
  async function handle(request: Request): Promise<Response> {
    const response = await app.handle(request);
    const rid = idsOf(request).responseRequestId;
    const pathname = new URL(request.url).pathname;
    if (!response.headers.has("x-request-id")) response.headers.set("x-request-id", rid);
    // The Anthropic SDK reads its request id from `request-id` (error.requestID, response headers).
    if (pathname.startsWith(MESSAGES_ROUTE)) response.headers.set("request-id", response.headers.get("x-request-id")!);
    if (pathname.startsWith("/v1/")) response.headers.set("access-control-allow-origin", "*");
    if (response.status === 405 || (response.status === 404 && !response.headers.get("content-type")?.includes("json"))) {
      metrics.httpResponse(routeLabel(pathname), 404);
      return errorResponse(gatewayError("not_found", "The requested route does not exist."), rid);
    }
    metrics.httpResponse(routeLabel(pathname), response.status);
    return response;
  }
}
