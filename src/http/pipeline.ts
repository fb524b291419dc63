// The one buyer pipeline behind every inference entrypoint (chat completions and the facades): the
// same admission checks, the same request actor, the same cancellation. An entrypoint only parses its
// own wire shape into a NormalizedChat and supplies a responder that writes its own wire shape back.
import { createHmac } from "node:crypto";
import { authenticateBuyer, type AuthResult, type BuyerPrincipal } from "./auth.ts";
import { parseJsonBody, readBody } from "./body.ts";
import { gatewayError, type GatewayError } from "./errors.ts";
import { promptTokenBound, type NormalizedChat } from "./chat/normalize.ts";
import type { ChatResponder } from "./chat/responders.ts";
import type { RequestRunner } from "../gateway/requests.ts";
import type { Store } from "../store/index.ts";
import type { JobRoute } from "../wire/frames.ts";
import type { Settlements } from "../gateway/settlements.ts";
import { reservationCredits, type Rates } from "../ledger/index.ts";
import type { Payer } from "../store/index.ts";

export interface PipelineDeps {
  store: Store;
  runner: RequestRunner;
  maxBodyBytes: number;
  requestTokenCap: number;
  settlementMode: "observe" | "enforce";
  gatewaySecret: Uint8Array;
  accepting: () => boolean;
  now: () => number;
  /** Route-time pricing and settlement; absent in bare unit apps (no catalog, no reservation). */
  settlements?: Settlements;
  /** Daily token quotas (UTC day) taken at admission. */
  dailyTokens?: { free: number; demo: number };
}

export interface RequestIds {
  /** The gateway's own id: the settlement key. */
  requestId: string;
  /** What X-Request-ID carries: the client's UUID when it sent one, else ours. */
  responseRequestId: string;
}

export const ROUTE_POLICY_VERSION = "gw-settlement-v1";

export type Authenticate = (store: Store, request: Request) => AuthResult;

export type AdmittedBody = { ok: true; principal: BuyerPrincipal; json: unknown } | { ok: false; error: GatewayError };

/**
 * The checks every buyer POST shares, in this order: the gateway is accepting, the body is within the
 * byte limit, the credentials are valid, the body is JSON within the nesting limit. Entrypoints differ
 * only in where credentials may come from (`authenticate`) and in how they render the error.
 */
export async function admitBuyerRequest(
  deps: PipelineDeps,
  request: Request,
  // Chat completions and responses take demo tokens (spec §5); the messages facade passes its own.
  authenticate: Authenticate = (store, req) => authenticateBuyer(store, req, "demo_allowed"),
): Promise<AdmittedBody> {
  if (!deps.accepting()) {
    return { ok: false, error: gatewayError("coordinator_unavailable", "The gateway is shutting down. Retry shortly.", { retryAfterSeconds: 5 }) };
  }
  const body = await readBody(request, deps.maxBodyBytes);
  if (!body) {
    return { ok: false, error: gatewayError("request_too_large", `The request body is larger than ${deps.maxBodyBytes} bytes.`) };
  }
  const auth = authenticate(deps.store, request);
  if (!auth.ok) return auth;
  const parsed = parseJsonBody(body);
  if (!parsed.ok) return parsed;
  return { ok: true, principal: auth.principal, json: parsed.json };
}

/** What the pipeline hands an entrypoint's responder factory. */
export interface ResponderContext {
  ids: RequestIds;
  /** Unix seconds at the request's start, for `created` / `created_at` fields. */
  created: number;
  /** Headers every successful response carries. */
  headers: Record<string, string>;
  /** The responder calls this when the buyer goes away before the response ended. */
  onBuyerGone: () => void;
}

export interface PipelineRequest {
  /** The buyer's HTTP request: its abort signal cancels the provider job. */
  request: Request;
  ids: RequestIds;
  /** An API key's account or a demo principal (account id `demo:<ip key>`). */
  principal: BuyerPrincipal;
  chat: NormalizedChat;
  /** The buyer route, for logs and metrics labels; default /v1/chat/completions. */
  buyerRoute?: string;
  /** Renders a refusal before dispatch (unknown model, quota) in the entrypoint's error envelope. */
  refuse: (error: GatewayError) => Response;
  /** Builds the entrypoint's wire-format responder. */
  responder: (context: ResponderContext) => ChatResponder;
}

/**
 * Runs one normalised chat request: builds the route, starts the request actor (routing, failover,
 * relay, cancellation) and resolves with the buyer's response once it can start. Every inference
 * entrypoint goes through here, so what is decided here (routing, billing, quotas) holds for all.
 */
export function runChatPipeline(deps: PipelineDeps, input: PipelineRequest): Promise<Response> {
  const { request, ids, principal, chat } = input;
  const rid = ids.responseRequestId;
  const promptBound = promptTokenBound(chat.messages, chat.params.tools);
  let payer: Payer = "promotion";
  if (deps.settlements) {
    const admission = deps.settlements.admitModel(chat.model);
    if (!admission.ok) {
      return Promise.resolve(
        input.refuse(
          gatewayError("model_not_available", `The model '${chat.model}' is not available. List available models with GET /v1/models.`, { param: "model" }),
        ),
      );
    }
    const reserved = reserveForRequest(deps, principal, ids.requestId, promptBound, chat.params.max_tokens, admission.rates);
    if (!reserved.ok) return Promise.resolve(input.refuse(reserved.error));
    payer = reserved.payer;
  }
  const route: JobRoute = {
    account_scope: createHmac("sha256", deps.gatewaySecret).update(principal.account_id).digest("hex"),
    catalog_id: "",
    catalog_body_digest: "",
    expected_catalog_model_hash: "",
    route_snapshot_digest: "",
    route_snapshot_mode: deps.settlementMode,
    route_snapshot_policy_version: ROUTE_POLICY_VERSION,
    prompt_hash: "",
  };
  let abort = () => {};
  const responder = input.responder({
    ids,
    created: Math.floor(deps.now() / 1000),
    headers: { "x-request-id": rid },
    onBuyerGone: () => abort(),
  });
  const started = deps.runner.start({
    requestId: ids.requestId,
    chat,
    route,
    promptBound,
    responder,
    accountId: principal.account_id,
    payer,
    buyerRoute: input.buyerRoute,
  });
  abort = started.abort;
  // The buyer hanging up before or during the response cancels the provider job.
  request.signal.addEventListener("abort", started.abort, { once: true });
  return responder.response;
}

/**
 * Holds the request's worst case at admission (DESIGN §6): prompt bound + max_tokens against the
 * daily token quota, and its price against a paid account's balance. Free-tier and demo traffic is
 * paid from the operator's promotion account.
 */
function reserveForRequest(
  deps: PipelineDeps,
  principal: BuyerPrincipal,
  requestId: string,
  promptBound: number,
  maxTokens: number,
  rates: Rates,
): { ok: true; payer: Payer } | { ok: false; error: GatewayError } {
  const paid = principal.kind === "api_key" && principal.tier === "paid";
  const payer: Payer = paid ? "buyer" : "promotion";
  const price = reservationCredits(promptBound, maxTokens, rates);
  if (!price.ok) return { ok: false, error: gatewayError("invalid_request", "The request is too large to price.") };
  const limit = paid ? undefined : principal.kind === "demo" ? deps.dailyTokens?.demo : deps.dailyTokens?.free;
  const day = new Date(deps.now()).toISOString().slice(0, 10);
  const reserved = deps.store.reserve(
    {
      request_id: requestId,
      account_id: principal.account_id,
      payer,
      day,
      tokens: promptBound + maxTokens,
      credits: price.charge.debit_credits,
      daily_token_limit: limit,
    },
    deps.now(),
  );
  if (reserved.ok) return { ok: true, payer };
  switch (reserved.code) {
    case "insufficient_balance":
      return { ok: false, error: gatewayError("quota_exhausted", "The account's credit balance does not cover this request. Add credits or lower max_tokens.", { retryAfterSeconds: 60 }) };
    case "quota_exhausted":
      return { ok: false, error: gatewayError("quota_exhausted", "The daily token quota is used up. It resets at 00:00 UTC.", { retryAfterSeconds: secondsToUtcMidnight(deps.now()) }) };
    default:
      return { ok: false, error: gatewayError("internal_error", "The gateway hit an internal error. Retry the request.") };
  }
}

const secondsToUtcMidnight = (nowMs: number): number => {
  const midnight = new Date(nowMs);
  midnight.setUTCHours(24, 0, 0, 0);
  return Math.max(1, Math.ceil((midnight.getTime() - nowMs) / 1000));
};
