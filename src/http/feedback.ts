// POST /v1/feedback (docs/usage.md): a buyer rates one of their own requests for operator review. API
// keys and demo tokens (docs/buyer-api.md). Idempotent per request id: sending it again replaces the rating,
// never adds a second one. Limited per client IP key (feedbackPerHour), counted durably in SQLite.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { authenticateBuyer, clientIpOf } from "./auth.ts";
import { parseJsonBody, readBody } from "./body.ts";
import { ipKey } from "./clientIp.ts";
import { errorResponse, gatewayError } from "./errors.ts";
import { describeSchemaError } from "./schemaErrors.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";

export const FEEDBACK_ROUTE = "/v1/feedback";
const WINDOW_MS = 60 * 60_000;
/** Feedback bodies are small; anything bigger is not a rating. */
const MAX_FEEDBACK_BYTES = 16 * 1024;

export const FeedbackRequest = Type.Object(
  {
    /** The id of a response (`chatcmpl-req_<hex>`, `resp_<hex>`, `msg_<hex>`) or the gateway's `req_…`. */
    request_id: Type.String({ minLength: 1, maxLength: 128 }),
    rating: Type.Union([Type.Literal("up"), Type.Literal("down")]),
    comment: Type.Optional(Type.Union([Type.String({ maxLength: 2000 }), Type.Null()])),
  },
  { additionalProperties: false },
);
export type FeedbackRequest = Static<typeof FeedbackRequest>;
const feedbackChecker = TypeCompiler.Compile(FeedbackRequest);

/** Ids buyers see all end with the gateway's request id. */
const REQUEST_ID_IN = /(req_[0-9a-f]+)$/;

export interface FeedbackDeps {
  store: Store;
  now: () => number;
  /** Submissions per client IP key per hour. */
  perHour: number;
}

const seconds = (ms: number) => Math.floor(ms / 1000);

export function feedbackHandler(deps: FeedbackDeps) {
  return async (request: Request, rid: string): Promise<Response> => {
    const body = await readBody(request, MAX_FEEDBACK_BYTES);
    if (!body) return errorResponse(gatewayError("request_too_large", `A feedback body is at most ${MAX_FEEDBACK_BYTES} bytes.`), rid);
    const auth = await authenticateBuyer(deps.store, request, "demo_allowed");
    if (!auth.ok) return errorResponse(auth.error, rid);
    const parsed = parseJsonBody(body);
    if (!parsed.ok) return errorResponse(parsed.error, rid);
    if (!feedbackChecker.Check(parsed.json)) {
      const { message, param } = describeSchemaError(feedbackChecker, parsed.json);
      return errorResponse(gatewayError("invalid_request", message, { param }), rid);
    }
    const input = parsed.json;
    const requestId = REQUEST_ID_IN.exec(input.request_id)?.[1];
    const unknown = () => errorResponse(gatewayError("not_found", "No request with this id belongs to this account.", { param: "request_id" }), rid);
    if (!requestId) return unknown();
    const ip = clientIpOf(request);
    const nowMs = deps.now();
    const result = await deps.store.recordFeedback(
      {
        request_id: requestId,
        account_id: auth.principal.account_id,
        rating: input.rating,
        comment: input.comment ?? null,
        ip_key: (ip === null ? null : ipKey(ip)) ?? "unknown",
        limit: deps.perHour,
        window_ms: WINDOW_MS,
      },
      nowMs,
    );
    if (!result.ok) {
      if (result.code === "unknown_request") return unknown();
      const retryAfterSeconds = Math.max(1, Math.ceil((result.retry_at_ms - nowMs) / 1000));
      return errorResponse(
        gatewayError("quota_exhausted", `At most ${deps.perHour} feedback submissions per network address per hour. Retry in ${retryAfterSeconds} s.`, {
          retryAfterSeconds,
          headers: {
            "x-ratelimit-limit": String(deps.perHour),
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": String(Math.ceil(result.retry_at_ms / 1000)),
            "x-ratelimit-scope": "feedback_per_hour",
          },
        }),
        rid,
      );
    }
    const f = result.feedback;
    const out = {
      object: "feedback",
      request_id: f.request_id,
      rating: f.rating,
      comment: f.comment,
      created_at: seconds(f.created_at_ms),
      updated_at: seconds(f.updated_at_ms),
      replaced: result.replaced,
    };
    return new Response(JSON.stringify(out), {
      status: result.replaced ? 200 : 201,
      headers: { "content-type": "application/json", "x-request-id": rid },
    });
  };
}
