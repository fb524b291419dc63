// GET /openapi.json (OpenAPI 3.1) and GET /docs (a rendered reference, served offline). The paths and
// request schemas come from the mounted Elysia routes and the very TypeBox schemas the routes validate
// with, through @elysiajs/openapi's generator; this module adds what the routes cannot say themselves:
// summaries, credentials, the error envelope, and the provider WebSocket (served outside Elysia).
import { toOpenAPISchema } from "@elysiajs/openapi";
import { Type, type TSchema } from "@sinclair/typebox";
import type { AnyElysia } from "elysia";
import pkg from "../../../package.json";
import { ChatCompletionRequest } from "../chat/schema.ts";
import { FeedbackRequest } from "../feedback.ts";
import { MessagesRequest } from "../messages/schema.ts";
import { ResponsesRequest } from "../responses/schema.ts";
import { errorTable } from "../errors.ts";

export const OPENAPI_PATH = "/openapi.json";
export const DOCS_PATH = "/docs";
export const DOCS_SCRIPT_PATH = "/docs/reference.js";
/** The provider WebSocket path; documented here, served by the Bun server before Elysia. */
const PROVIDER_CONNECT = "/v1/provider/connect";

/** The error envelope every JSON failure uses (docs/quotas.md lists the codes). */
export const ErrorEnvelope = Type.Object(
  {
    error: Type.Object({
      message: Type.String({ description: "What went wrong and what is allowed, in plain words." }),
      type: Type.String(),
      param: Type.Union([Type.String(), Type.Null()], { description: "The request field at fault, e.g. messages[0].role." }),
      code: Type.Union(Object.keys(errorTable).filter((c) => c !== "quota_exhausted_request_cap").map((c) => Type.Literal(c))),
      retryable: Type.Boolean(),
    }),
  },
  { title: "ErrorEnvelope" },
);

/** The messages facade's envelope: the same fields under `{type: "error", error}`. */
export const MessagesErrorEnvelope = Type.Object({ type: Type.Literal("error"), error: ErrorEnvelope.properties.error }, { title: "MessagesErrorEnvelope" });

type Credential = "api_key" | "api_key_or_demo" | "messages_key" | "none" | "metrics_token" | "browser_session";

interface RouteDoc {
  summary: string;
  tag: "Inference" | "Models and pool" | "Account" | "Catalog and rates" | "Sign-up and demo" | "Operations";
  credential: Credential;
  description?: string;
}

/** One entry per public route ("METHOD /path" as Elysia mounts it); a test checks none is missing. */
export const ROUTE_DOCS: Record<string, RouteDoc> = {
  "POST /v1/chat/completions": { summary: "Create a chat completion (JSON or SSE with stream: true)", tag: "Inference", credential: "api_key_or_demo" },
  "POST /v1/messages": {
    summary: "Create a message (messages-style facade)",
    tag: "Inference",
    credential: "messages_key",
    description: "Mounted when the operator starts the gateway with --messages-facade; otherwise 404 endpoint_disabled. Errors use the messages envelope. docs/facades.md.",
  },
  "POST /v1/messages/count_tokens": {
    summary: "Count a message request's prompt tokens (the gateway's upper bound)",
    tag: "Inference",
    credential: "messages_key",
    description: "Answers {input_tokens} from the gateway's prompt-token bound (UTF-8 bytes + 8 per message + 16): what admission reserves, never below a model's real count. docs/facades.md.",
  },
  "POST /v1/responses": {
    summary: "Create a response (stateless responses facade)",
    tag: "Inference",
    credential: "api_key_or_demo",
    description: "Mounted when the operator starts the gateway with --responses-facade; otherwise 404 endpoint_disabled. docs/facades.md.",
  },
  "GET /v1/models": { summary: "List the models a request can reach, with their prices and the tier-1 disclosure", tag: "Models and pool", credential: "api_key_or_demo" },
  "GET /v1/models/{id}": { summary: "Retrieve one model (OpenAI shape, with pricing)", tag: "Models and pool", credential: "api_key_or_demo" },
  "GET /v1/status": { summary: "Public pool status: up, degraded, idle or down", tag: "Models and pool", credential: "none" },
  "GET /v1/usage": { summary: "Quota, balance, spend, keys and per-model usage of the calling key's account", tag: "Account", credential: "api_key", description: "docs/usage.md" },
  "GET /v1/receipts/{request_id}": { summary: "Settlement labels of one of your own requests", tag: "Account", credential: "api_key", description: "docs/receipts.md" },
  "DELETE /v1/sticky": {
    summary: "Forget the calling account's sticky conversations (X-Conversation-ID pins)",
    tag: "Account",
    credential: "api_key_or_demo",
    description: "Answers {object: \"sticky.purged\", deleted: N}; 0 when the operator runs without --sticky-routing. docs/routing.md.",
  },
  "POST /v1/feedback": { summary: "Rate one of your own requests", tag: "Account", credential: "api_key_or_demo", description: "docs/usage.md" },
  "GET /v1/rate-card": { summary: "Prices per rate-card row and the provider share", tag: "Catalog and rates", credential: "none", description: "docs/ledger.md" },
  "GET /v1/catalog": { summary: "The operator-signed model catalog (exact signed bytes)", tag: "Catalog and rates", credential: "none", description: "docs/catalog.md" },
  "GET /v1/catalog.sig": { summary: "The catalog's Ed25519 signature (base64)", tag: "Catalog and rates", credential: "none" },
  "GET /v1/catalog/pubkey": { summary: "The catalog operator's public key", tag: "Catalog and rates", credential: "none" },
  "POST /auth/demo-session": { summary: "Issue a browser demo token (per client IP and hour)", tag: "Sign-up and demo", credential: "none", description: "docs/demo.md" },
  "GET /demo": { summary: "The browser demo page", tag: "Sign-up and demo", credential: "none" },
  "GET /demo/app.js": { summary: "The demo page's script", tag: "Sign-up and demo", credential: "none" },
  "GET /auth/{idp}/start": { summary: "Start sign-up or sign-in through an identity provider", tag: "Sign-up and demo", credential: "none", description: "docs/signup.md" },
  "GET /auth/{idp}/callback": { summary: "The identity provider's redirect back", tag: "Sign-up and demo", credential: "none" },
  "GET /account": { summary: "The account page: keys, the one-time key reveal", tag: "Sign-up and demo", credential: "browser_session" },
  "POST /account/keys": { summary: "Issue a new API key (account page form)", tag: "Sign-up and demo", credential: "browser_session" },
  "POST /account/keys/{key_id}/rotate": { summary: "Rotate an API key (account page form)", tag: "Sign-up and demo", credential: "browser_session" },
  "POST /account/keys/{key_id}/revoke": { summary: "Revoke an API key (account page form)", tag: "Sign-up and demo", credential: "browser_session" },
  "POST /account/logout": { summary: "Sign out of the account page", tag: "Sign-up and demo", credential: "browser_session" },
  "GET /openapi.json": { summary: "This document (OpenAPI 3.1)", tag: "Operations", credential: "none" },
  "GET /docs": { summary: "This document rendered as a reference page (no outside assets)", tag: "Operations", credential: "none" },
  "GET /healthz": { summary: "Liveness: 200 while running, 503 while draining", tag: "Operations", credential: "none" },
  "GET /metrics": { summary: "Prometheus metrics (Bearer token when the operator set one)", tag: "Operations", credential: "metrics_token", description: "docs/operator.md" },
  [`GET ${PROVIDER_CONNECT}`]: {
    summary: "Provider machines' WebSocket (protocol v1, msgpack frames)",
    tag: "Operations",
    credential: "none",
    description: "Upgrade to a WebSocket; the provider proves its key in the handshake. Not for buyers. docs/protocol.md.",
  },
};

/** Request bodies, by path and method: the schemas the routes check bodies against. */
const REQUEST_BODIES: Record<string, TSchema> = {
  "POST /v1/chat/completions": ChatCompletionRequest,
  "POST /v1/messages": MessagesRequest,
  "POST /v1/messages/count_tokens": MessagesRequest,
  "POST /v1/responses": ResponsesRequest,
  "POST /v1/feedback": FeedbackRequest,
};

const SECURITY: Record<Credential, Record<string, string[]>[] | undefined> = {
  api_key: [{ apiKey: [] }],
  api_key_or_demo: [{ apiKey: [] }, { demoToken: [] }],
  messages_key: [{ xApiKey: [] }, { apiKey: [] }],
  metrics_token: [{ metricsToken: [] }, {}],
  browser_session: [{ accountSession: [] }],
  none: [],
};

type Operation = Record<string, unknown> & { responses?: Record<string, unknown> };
type Document = { paths: Record<string, Record<string, Operation>>; components: { schemas?: Record<string, unknown> } };

/** JSON Schema from a TypeBox schema: TypeBox's own markers are symbols, which JSON drops. */
const jsonSchema = (schema: TSchema): unknown => JSON.parse(JSON.stringify(schema));

/** "/v1/receipts/:request_id" → "/v1/receipts/{request_id}" */
const openApiPath = (elysiaPath: string) => elysiaPath.replace(/:([^/]+)/g, "{$1}");

/** The whole OpenAPI 3.1 document of `app` (every route mounted by then). */
export function buildOpenApiDocument(app: AnyElysia): Record<string, unknown> {
  const generated = toOpenAPISchema(app, { methods: ["options"], staticFile: false }, undefined, undefined, "3.1.1") as Document;
  const paths: Document["paths"] = {};
  for (const [rawPath, methods] of Object.entries(generated.paths)) {
    const path = openApiPath(rawPath);
    for (const [method, generatedOperation] of Object.entries(methods)) {
      const key = `${method.toUpperCase()} ${path}`;
      const doc = ROUTE_DOCS[key];
      if (!doc) continue; // hidden helpers (the raw /v1/models/* alias, the docs pages themselves)
      paths[path] ??= {};
      paths[path][method] = operation(key, doc, generatedOperation);
    }
  }
  paths[PROVIDER_CONNECT] = { get: operation(`GET ${PROVIDER_CONNECT}`, ROUTE_DOCS[`GET ${PROVIDER_CONNECT}`]!, {}) };
  paths[PROVIDER_CONNECT].get!.responses = { "101": { description: "Switching to the WebSocket protocol." }, "400": errorResponse("Not a WebSocket upgrade.") };
  return {
    openapi: "3.1.1",
    info: {
      title: "Inference gateway",
      version: pkg.version,
      description:
        "Chat completions in the OpenAI wire format, routed to provider machines. Prompts and outputs are processed as plaintext on provider hardware; no private inference, attestation or verified provider honesty is claimed. Errors: docs/quotas.md.",
    },
    tags: ["Inference", "Models and pool", "Account", "Catalog and rates", "Sign-up and demo", "Operations"].map((name) => ({ name })),
    paths,
    components: {
      schemas: { ...generated.components.schemas, ErrorEnvelope: jsonSchema(ErrorEnvelope), MessagesErrorEnvelope: jsonSchema(MessagesErrorEnvelope) },
      securitySchemes: {
        apiKey: { type: "http", scheme: "bearer", description: "An API key (gw_…) as `Authorization: Bearer KEY`." },
        demoToken: { type: "http", scheme: "bearer", description: "A browser demo token from POST /auth/demo-session." },
        xApiKey: { type: "apiKey", in: "header", name: "x-api-key", description: "The messages facade also takes the key in x-api-key." },
        metricsToken: { type: "http", scheme: "bearer", description: "The operator's metricsToken, when set." },
        accountSession: { type: "apiKey", in: "cookie", name: "gw_session", description: "The account page's session cookie (browser sign-up)." },
      },
    },
  };
}

function errorResponse(description: string, messagesStyle = false) {
  return { description, content: { "application/json": { schema: { $ref: `#/components/schemas/${messagesStyle ? "MessagesErrorEnvelope" : "ErrorEnvelope"}` } } } };
}

function operation(key: string, doc: RouteDoc, generated: Operation): Operation {
  const [method, path] = key.split(" ") as [string, string];
  const body = REQUEST_BODIES[key];
  const messagesStyle = path.startsWith("/v1/messages");
  const op: Operation = {
    ...generated,
    operationId: key.replace(/[^A-Za-z0-9]+/g, "_").replace(/^_|_$/g, ""),
    summary: doc.summary,
    tags: [doc.tag],
    ...(doc.description ? { description: doc.description } : {}),
    ...(SECURITY[doc.credential]!.length > 0 ? { security: SECURITY[doc.credential] } : { security: [] }),
  };
  if (body) op.requestBody = { required: true, content: { "application/json": { schema: jsonSchema(body) } } };
  else delete op.requestBody;
  const responses: Record<string, unknown> = { "200": { description: method === "POST" && path.startsWith("/account") ? "An HTML page or redirect." : "Success." } };
  if (body) responses["400"] = errorResponse("The body is not valid: the message names the field and what it allows.", messagesStyle);
  if (doc.credential !== "none" && doc.credential !== "browser_session") responses["401"] = errorResponse("Missing or invalid credentials.", messagesStyle);
  if (path.startsWith("/v1/")) responses["404"] = errorResponse("Not found, or a facade that is disabled on this gateway (endpoint_disabled).", messagesStyle);
  if (path === "/v1/chat/completions" || messagesStyle || path === "/v1/responses") {
    responses["429"] = errorResponse("A quota or concurrency limit; Retry-After says when to retry.", messagesStyle);
    responses["503"] = errorResponse("No provider can take the request now, or the gateway is draining.", messagesStyle);
  }
  op.responses = responses;
  return op;
}

/** The /docs page: the reference renderer, loaded from this gateway, reading /openapi.json. */
export function docsPage(): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Inference gateway API reference</title></head>
<body>
<noscript>The reference needs JavaScript. The raw document is at <a href="${OPENAPI_PATH}">${OPENAPI_PATH}</a>.</noscript>
<script id="api-reference" data-url="${OPENAPI_PATH}" data-configuration='{"withDefaultFonts":false,"hideClientButton":true,"telemetry":false}'></script>
<script src="${DOCS_SCRIPT_PATH}"></script>
</body></html>`;
}
