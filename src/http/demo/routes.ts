// Browser demo mode: POST /auth/demo-session issues a demo token bound to the client's IP key (at most
// `sessionsPerHour` per IP key, counted in SQLite), GET /demo serves the page that uses it.
import { Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { Elysia } from "elysia";
import { clientIpOf, demoAccountId } from "../auth.ts";
import { parseJsonBody, readBody } from "../body.ts";
import { ipKey } from "../clientIp.ts";
import { errorResponse, gatewayError } from "../errors.ts";
import { demoTokenKey, signDemoToken } from "./token.ts";
import { DEMO_PAGE_SCRIPT, demoPageHtml } from "./page.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";

/** The hourly window of the per-IP session limit (docs/quotas.md). */
export const DEMO_SESSION_WINDOW_MS = 60 * 60_000;
/** A demo token lives as long as the window it was counted in. */
export const DEMO_TOKEN_TTL_MS = 60 * 60_000;

export interface DemoRouteDeps {
  store: Store;
  gatewaySecret: Uint8Array;
  now: () => number;
  sessionsPerHour: number;
  /** Sign-up through an identity provider is configured: the page links to /account. */
  signupEnabled: boolean;
  /** The X-Request-ID value of a request (error envelopes carry it). */
  requestId: (request: Request) => string;
}

/** The request body is optional; when sent it must be an empty JSON object (room for options later). */
const DemoSessionRequest = Type.Object({}, { additionalProperties: false });
const demoSessionRequestChecker = TypeCompiler.Compile(DemoSessionRequest);

const MAX_BODY_BYTES = 1024;

const PAGE_HEADERS = {
  "cache-control": "no-store",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "content-security-policy":
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
};

export function demoRoutes(deps: DemoRouteDeps) {
  const key = demoTokenKey(deps.gatewaySecret);
  const pageHtml = demoPageHtml({ signupEnabled: deps.signupEnabled });

  async function issue(request: Request): Promise<Response> {
    const rid = deps.requestId(request);
    // A JSON content type makes a cross-site call a CORS preflight, which this route never grants:
    // other sites cannot spend a visitor's session allowance.
    if (!(request.headers.get("content-type") ?? "").toLowerCase().startsWith("application/json")) {
      return errorResponse(gatewayError("invalid_request", "Send the request with 'Content-Type: application/json' (the body may be {} or empty)."), rid);
    }
    const body = await readBody(request, MAX_BODY_BYTES);
    if (!body) return errorResponse(gatewayError("request_too_large", `The request body is larger than ${MAX_BODY_BYTES} bytes.`), rid);
    if (body.length > 0) {
      const parsed = parseJsonBody(body);
      if (!parsed.ok) return errorResponse(parsed.error, rid);
      if (!demoSessionRequestChecker.Check(parsed.json)) {
        return errorResponse(gatewayError("invalid_request", "The request body must be an empty JSON object."), rid);
      }
    }
    const ip = clientIpOf(request);
    const ip_key = ip === null ? null : ipKey(ip);
    if (ip_key === null) {
      return errorResponse(gatewayError("internal_error", "The gateway could not tell your network address. Retry the request."), rid);
    }
    const now = deps.now();
    const issued = await deps.store.issueDemoSession(
      { ip_key, limit: deps.sessionsPerHour, window_ms: DEMO_SESSION_WINDOW_MS, ttl_ms: DEMO_TOKEN_TTL_MS },
      now,
    );
    if (!issued.ok) {
      const resetSeconds = Math.ceil(issued.retry_at_ms / 1000);
      return errorResponse(
        gatewayError(
          "quota_exhausted",
          `This network address has started ${deps.sessionsPerHour} demo sessions in the last hour. Retry after the time in Retry-After, or sign up for an API key.`,
          {
            retryAfterSeconds: Math.max(1, Math.ceil((issued.retry_at_ms - now) / 1000)),
            headers: rateLimitHeaders(deps.sessionsPerHour, 0, resetSeconds),
          },
        ),
        rid,
      );
    }
    const token = signDemoToken(key, { v: 1, sid: issued.session_id, ip: ip_key, iat: issued.issued_at_ms, exp: issued.expires_at_ms });
    const response = {
      object: "demo_session",
      token,
      token_type: "bearer",
      account_id: demoAccountId(ip_key),
      expires_at: Math.floor(issued.expires_at_ms / 1000),
      sessions_remaining: issued.remaining,
    };
    return new Response(JSON.stringify(response), {
      status: 201,
      headers: {
        "content-type": "application/json",
        "cache-control": "no-store",
        "x-request-id": rid,
        ...rateLimitHeaders(deps.sessionsPerHour, issued.remaining, Math.ceil((now + DEMO_SESSION_WINDOW_MS) / 1000)),
      },
    });
  }

  return new Elysia()
    .post("/auth/demo-session", ({ request }) => issue(request), { parse: "none" })
    .get("/demo", () => new Response(pageHtml, { headers: { "content-type": "text/html; charset=utf-8", ...PAGE_HEADERS } }))
    .get("/demo/app.js", () => new Response(DEMO_PAGE_SCRIPT, { headers: { "content-type": "text/javascript; charset=utf-8", ...PAGE_HEADERS } }));
}

const rateLimitHeaders = (limit: number, remaining: number, resetUnixSeconds: number): Record<string, string> => ({
  "x-ratelimit-limit": String(limit),
  "x-ratelimit-remaining": String(remaining),
  "x-ratelimit-reset": String(resetUnixSeconds),
});
