// The one buyer pipeline behind every inference entrypoint (chat completions and the facades): the
// same admission checks, the same request actor, the same cancellation. An entrypoint only parses its
// own wire shape into a NormalizedChat and supplies a responder that writes its own wire shape back.
import { authenticateBuyer, type AuthResult, type BuyerPrincipal } from "./auth.ts";
import { parseJsonBody, readBodyWithin, type BodyRead } from "./body.ts";
import { failureError, gatewayError, type GatewayError } from "./errors.ts";
import { promptTokenBound } from "./chat/normalize.ts";
import type { ChatOutcome, ChatResponder, NormalizedChat, RequestFailure } from "../chat/contract.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import type { RequestRunner } from "../gateway/requests.ts";
import type { RequestSpec } from "../gateway/requestHandle.ts";
import type { BodyTemplate, FacadeResponder, StreamFlow } from "./output.ts";
import type { Log } from "../log.ts";
import { isAdoptedElsewhere, isStoreUnavailable, type AsyncStore as Store } from "../store/asyncStore.ts";
import type { Settlements } from "../gateway/settlements.ts";
import type { AdmittedPricing } from "../gateway/settlement/pricing.ts";
import { reservationCredits, type Rates } from "../ledger/index.ts";
import { buyerAccount } from "../store/index.ts";
import { payerFor, type Payer } from "../ledger/charges.ts";
import { balanceRefusal, concurrencyRefusal, dailyQuotaRefusal, limitsFor, utcDay, type QuotaPolicy } from "./quotas.ts";
import { replayIdentity, type ReplayCache, type RunTracker } from "./idempotency.ts";
import { CONVERSATION_HEADER, conversationKey, conversationTag } from "../gateway/sticky.ts";
import type { StickyMap } from "../store/sticky.ts";
import type { AdmissionGate } from "./admissionGate.ts";

/** Sticky conversation affinity (docs/routing.md): on when given. */
export interface StickyRouting {
  map: StickyMap;
  /** The gateway secret the conversation keys are HMACs under. */
  secret: Uint8Array;
}

export interface PipelineDeps {
  store: Store;
  runner: RequestRunner;
  maxBodyBytes: number;
  requestTokenCap: number;
  settlementMode: "observe" | "enforce";
  accepting: () => boolean;
  now: () => number;
  /** Route-time pricing and settlement. */
  settlements: Settlements;
  /** Limits per tier (docs/quotas.md): daily tokens, per-request cap, concurrency; absent = none (bare unit apps). */
  quotas?: QuotaPolicy;
  /** Retries replayed instead of re-run (docs/buyer-api.md); absent = every request runs. */
  replays?: ReplayCache;
  /** Sticky routing; absent = off (X-Conversation-ID is ignored). */
  sticky?: StickyRouting;
  /** Concurrency slots shared by every node (a cluster, src/cluster/slots.ts); absent = the store's own. */
  sharedSlots?: SharedSlotPort;
  /** Deadline for the whole request body (default 30 s). */
  requestBodyTimeoutMs?: number;
  /** Bounds on a stream's output waiting for a buyer that does not read (absent = unbounded). */
  stream?: { maxBufferedBytes: number; stallMs: number };
  /** Admissions a turn, live streams first (src/http/admissionGate.ts); absent = no limit. */
  admission?: AdmissionGate;
  log?: Log;
}

/** Slots held in a shared engine: taking one is asynchronous, and may fail when the engine is unreachable. */
export interface SharedSlotPort {
  acquire(account_id: string, request_id: string, limit: number): Promise<{ ok: true } | { ok: false; code: "concurrency_exhausted" | "engine_unavailable" }>;
  release(request_id: string): void;
  /** Slots the account holds on every node now (GET /v1/usage). */
  inUse(account_id: string): Promise<number>;
}

/** The refusal when the shared slots cannot be reached: nothing was taken or written. */
const slotsUnavailable = () =>
  gatewayError("coordinator_unavailable", "The gateway cannot reach its shared state (Redis) right now. Nothing was charged; retry shortly.", {
    retryAfterSeconds: 1,
  });


/** Raw body bytes of admitted requests: what retries are matched on (same body bytes, docs/buyer-api.md). */
const rawBodies = new WeakMap<Request, Uint8Array>();

export interface RequestIds {
  /** The gateway's own id: the settlement key. */
  requestId: string;
  /** What X-Request-ID carries: the client's UUID when it sent one, else ours. */
  responseRequestId: string;
}

export type Authenticate = (store: Store, request: Request) => Promise<AuthResult>;

export type AdmittedBody = { ok: true; principal: BuyerPrincipal; json: unknown } | { ok: false; error: GatewayError };

/**
 * The checks every buyer POST shares, in this order: the gateway is accepting, the credentials are
 * valid, the body arrives within its deadline and byte limit, the body is JSON within the nesting
 * limit. Entrypoints differ only in where credentials may come from (`authenticate`) and in how they
 * render the error.
 */
export async function admitBuyerRequest(
  deps: PipelineDeps,
  request: Request,
  // Chat completions and responses take demo tokens (docs/buyer-api.md); the messages facade passes its own.
  authenticate: Authenticate = (store, req) => authenticateBuyer(store, req, "demo_allowed"),
): Promise<AdmittedBody> {
  if (!deps.accepting()) {
    return { ok: false, error: gatewayError("coordinator_unavailable", "The gateway is shutting down. Retry shortly.", { retryAfterSeconds: 5 }) };
  }
  // Live streams first: past this turn's admissions, the request waits for a later turn (or is shed).
  const turn = deps.admission?.enter() ?? true;
  if (turn !== true) {
    if (!(await turn)) return { ok: false, error: overloaded() };
    // A buyer who hung up while waiting costs no admission work.
    if (request.signal.aborted) return { ok: false, error: bodyReadError("aborted", deps.maxBodyBytes) };
  }
  // Credentials first: a client without them never gets to hold a connection open with a slow body.
  let auth: AuthResult;
  try {
    auth = await authenticate(deps.store, request);
  } catch (error) {
    if (isStoreUnavailable(error)) return { ok: false, error: storeUnavailable() };
    throw error;
  }
  if (!auth.ok) return auth;
  const read = await readBodyWithin(request, deps.maxBodyBytes, deps.requestBodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS);
  if (!read.ok) return { ok: false, error: bodyReadError(read.reason, deps.maxBodyBytes) };
  const body = read.body;
  const parsed = parseJsonBody(body);
  if (!parsed.ok) return parsed;
  rawBodies.set(request, body);
  return { ok: true, principal: auth.principal, json: parsed.json };
}

/** The refusal of a request shed because admissions are far behind (`admissionQueueMs`): nothing was taken. */
const overloaded = () =>
  gatewayError("coordinator_unavailable", "The gateway is at capacity right now. Nothing was charged; retry shortly.", { retryAfterSeconds: 1 });

/** The `requestBodyTimeoutMs` setting's default, for apps built without it. */
const DEFAULT_BODY_TIMEOUT_MS = 30_000;

function bodyReadError(reason: Extract<BodyRead, { ok: false }>["reason"], limit: number): GatewayError {
  switch (reason) {
    case "too_large":
      return gatewayError("request_too_large", `The request body is larger than ${limit} bytes.`);
    case "timeout":
      return gatewayError("request_timeout", "The request body did not arrive in time.");
    case "aborted":
      return gatewayError("client_closed_request", "The client closed the connection before the request body arrived.");
  }
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
  /** The responder passes every piece of the body it writes, in order (the retry-replay copy). */
  record: (text: string) => void;
  /** The same for a templated piece (src/http/output.ts BodyTemplate), which the copy keeps smaller. */
  recordFilled?: (template: BodyTemplate, hole: string) => void;
  /** Backpressure bounds for a streamed body (src/http/output.ts StreamFlow). */
  flow?: StreamFlow;
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
  responder: (context: ResponderContext) => FacadeResponder;
}

/**
 * Runs one normalised chat request: builds the route, starts the request actor (routing, failover,
 * relay, cancellation) and resolves with the buyer's response once it can start. Every inference
 * entrypoint goes through here, so what is decided here (routing, billing, quotas) holds for all.
 */
export function runChatPipeline(deps: PipelineDeps, input: PipelineRequest): Promise<Response> {
  const body = rawBodies.get(input.request);
  // Read once: the body bytes need not live as long as the request (a stream's whole life).
  rawBodies.delete(input.request);
  if (!deps.replays || !body) return runFresh(deps, input, null);
  const identity = replayIdentity(input.request, input.principal.account_id, input.buyerRoute ?? "/v1/chat/completions", body);
  return deps.replays.run(identity, (tracker) => runFresh(deps, input, tracker), input.refuse);
}

/** Where the body copy goes when there is no replay cache to keep it. */
const ignoreBody = (_text: string) => {};
const ignoreFilled = (_template: BodyTemplate, _hole: string) => {};

/**
 * Runs the request as a new one. With sticky routing on, a tagged request first looks its conversation
 * up (a bad tag is refused; a lookup that fails routes normally: stickiness never fails a request).
 */
function runFresh(deps: PipelineDeps, input: PipelineRequest, tracker: RunTracker | null): Promise<Response> {
  if (!deps.sticky) return runAdmitted(deps, input, tracker, undefined);
  const tag = conversationTag(input.request.headers.get(CONVERSATION_HEADER));
  if (tag === null) return runAdmitted(deps, input, tracker, undefined);
  if (tag === "invalid") {
    tracker?.outcome(false);
    const message = "The X-Conversation-ID header must be 1 to 128 characters from A-Z, a-z, 0-9, '.', '_', ':' and '-'.";
    return Promise.resolve(input.refuse(gatewayError("invalid_request", message, { param: "X-Conversation-ID" })));
  }
  const key = conversationKey(deps.sticky.secret, input.principal.account_id, tag);
  return deps.sticky.map
    .get(key, deps.now())
    .catch(() => null)
    .then((providerId) => runAdmitted(deps, input, tracker, { key, providerId }));
}

/** Its concurrency slot (the cluster's shared one, or the store's), then the rest of the run. */
function runAdmitted(deps: PipelineDeps, input: PipelineRequest, tracker: RunTracker | null, sticky: RequestSpec["sticky"]): Promise<Response> {
  const { ids, principal } = input;
  const slotLimit = deps.quotas ? limitsFor(deps.quotas, principal).concurrentRequests : null;
  if (slotLimit === null) return runHoldingSlot(deps, input, tracker, null, sticky);
  const shared = deps.sharedSlots;
  if (shared) {
    return shared.acquire(principal.account_id, ids.requestId, slotLimit).then((slot) => {
      if (slot.ok) return runHoldingSlot(deps, input, tracker, slotRelease(shared.release.bind(shared), ids.requestId), sticky);
      tracker?.outcome(false);
      return input.refuse(slot.code === "engine_unavailable" ? slotsUnavailable() : concurrencyRefusal(slotLimit, deps.now()));
    });
  }
  if (!deps.store.acquireRequestSlot(principal.account_id, ids.requestId, slotLimit).ok) {
    return Promise.resolve(input.refuse(concurrencyRefusal(slotLimit, deps.now())));
  }
  return runHoldingSlot(deps, input, tracker, slotRelease(deps.store.releaseRequestSlot.bind(deps.store), ids.requestId), sticky);
}

/**
 * Frees the slot. Made here, not in runAdmitted: a closure keeps its whole making scope, and that one
 * holds the request (prompt included) for its `.then`, while this lives as long as the response.
 */
function slotRelease(release: (requestId: string) => unknown, requestId: string): () => void {
  return () => {
    release(requestId);
  };
}

/**
 * The rest of a new run, once its concurrency slot (if any) is held; `releaseSlot` frees it. It makes
 * no closure itself: an async function's variables (the prompt among them) live in one heap scope that
 * every closure made in it keeps, and the closures below live as long as the response — a stream's
 * prompt must not (docs/architecture.md, "What a live request holds").
 */
async function runHoldingSlot(
  deps: PipelineDeps,
  input: PipelineRequest,
  tracker: RunTracker | null,
  releaseSlot: (() => void) | null,
  sticky: RequestSpec["sticky"],
): Promise<Response> {
  const { ids, principal, chat } = input;
  const promptBound = promptTokenBound(chat.messages, chat.params.tools);
  const end = requestEnd(releaseSlot, tracker);
  const admission = deps.settlements.admitModel(chat.model);
  if (!admission.ok) {
    end(false);
    return Promise.resolve(
      input.refuse(
        gatewayError("model_not_available", `The model '${chat.model}' is not available. List available models with GET /v1/models.`, { param: "model" }),
      ),
    );
  }
  let reserved: Awaited<ReturnType<typeof reserveForRequest>>;
  try {
    reserved = await reserveForRequest(deps, principal, ids.requestId, promptBound, chat.params.max_tokens, admission.rates);
  } catch (error) {
    end(false);
    // Refused as a reaped writer's (docs/scale-out.md, "Fencing"): nothing written, and the next
    // request is this node's to write again.
    if (isStoreUnavailable(error) || isAdoptedElsewhere(error)) {
      // The reservation is one transaction, but a connection lost after its COMMIT left it written
      // with nobody to end it: the request's end is written (tried again until the database answers).
      deps.settlements.requestEnded(ids.requestId);
      return input.refuse(storeUnavailable());
    }
    throw error;
  }
  if (!reserved.ok) {
    end(false);
    return input.refuse(reserved.error);
  }
  return startRequest(deps, input, tracker, end, { promptBound, payer: reserved.payer, pricing: admission, sticky });
}

/**
 * Once, when the buyer's response ended (or never started): frees the concurrency slot
 * (docs/buyer-api.md) and tells the replay cache whether this is a result a retry may get.
 */
function requestEnd(releaseSlot: (() => void) | null, tracker: RunTracker | null): (ok: boolean) => void {
  let ended = false;
  return (ok) => {
    if (ended) return;
    ended = true;
    releaseSlot?.();
    tracker?.outcome(ok);
  };
}

/** Starts the request actor with the entrypoint's responder, tied to the buyer's connection. */
function startRequest(
  deps: PipelineDeps,
  input: PipelineRequest,
  tracker: RunTracker | null,
  end: (ok: boolean) => void,
  admitted: { promptBound: number; payer: Payer; pricing: AdmittedPricing; sticky: RequestSpec["sticky"] },
): Promise<Response> {
  const { request, ids } = input;
  const cancel = { abort: () => {} };
  const responder = observeEnd(input.responder(responderContext(deps, ids, tracker, end, cancel)), end, tracker);
  const { signal } = request;
  signal.addEventListener("abort", () => end(false), { once: true });
  let started: { abort: () => void };
  try {
    started = deps.runner.start({
      requestId: ids.requestId,
      chat: input.chat,
      promptBound: admitted.promptBound,
      responder,
      accountId: input.principal.account_id,
      payer: admitted.payer,
      pricing: admitted.pricing,
      buyerRoute: input.buyerRoute,
      sticky: admitted.sticky,
    });
  } catch (error) {
    end(false);
    throw error;
  }
  cancel.abort = started.abort;
  // The buyer hanging up before or during the response cancels the provider job.
  signal.addEventListener("abort", started.abort, { once: true });
  // The buyer may have hung up while the reservation was being written: the signal already fired.
  if (signal.aborted) {
    end(false);
    started.abort();
  }
  return responder.response;
}

/** What the responder is given; `cancel.abort` is the started request's (set once it started). */
function responderContext(
  deps: PipelineDeps,
  ids: RequestIds,
  tracker: RunTracker | null,
  end: (ok: boolean) => void,
  cancel: { abort: () => void },
): ResponderContext {
  return {
    ids,
    created: Math.floor(deps.now() / 1000),
    headers: { "x-request-id": ids.responseRequestId },
    onBuyerGone: () => {
      end(false);
      cancel.abort();
    },
    record: tracker ? tracker.record : ignoreBody,
    recordFilled: tracker ? tracker.recordFilled : ignoreFilled,
    flow: deps.stream && {
      ...deps.stream,
      now: deps.now,
      onStalled: (why) => deps.log?.info("buyer_stream_stalled", { request_id: ids.requestId, why }),
    },
  };
}

/** The refusal when the durable store (PostgreSQL) cannot be reached: nothing was written. */
export const storeUnavailable = () =>
  gatewayError("coordinator_unavailable", "The gateway cannot reach its database right now. Nothing was charged; retry shortly.", {
    retryAfterSeconds: 1,
  });

/**
 * Holds the request's worst case at admission (docs/ledger.md): prompt bound + max_tokens against the
 * daily token quota, and its price against a paid account's balance. Free-tier and demo traffic is
 * paid from the operator's promotion account.
 */
async function reserveForRequest(
  deps: PipelineDeps,
  principal: BuyerPrincipal,
  requestId: string,
  promptBound: number,
  maxTokens: number,
  rates: Rates,
): Promise<{ ok: true; payer: Payer } | { ok: false; error: GatewayError }> {
  const payer = payerFor(principal.kind === "api_key" && principal.tier === "paid");
  const price = reservationCredits(promptBound, maxTokens, rates);
  if (!price.ok) return { ok: false, error: gatewayError("invalid_request", "The request is too large to price.") };
  const limit = deps.quotas ? limitsFor(deps.quotas, principal).dailyTokens : undefined;
  const day = utcDay(deps.now());
  const tokens = promptBound + maxTokens;
  const reserved = await deps.store.reserve(
    {
      request_id: requestId,
      account_id: principal.account_id,
      payer,
      day,
      tokens,
      credits: price.charge.debit_credits,
      daily_token_limit: limit,
    },
    deps.now(),
  );
  if (reserved.ok) return { ok: true, payer };
  switch (reserved.code) {
    case "insufficient_balance": {
      const balance = await deps.store.ledgerBalance(buyerAccount(principal.account_id));
      return { ok: false, error: balanceRefusal({ balance, available: reserved.available_credits, needed: price.charge.debit_credits, nowMs: deps.now() }) };
    }
    case "quota_exhausted": {
      const usedOnly = (await deps.store.dailyTokens(principal.account_id, day)).used;
      return { ok: false, error: dailyQuotaRefusal({ limit: limit ?? 0, counted: reserved.used_tokens, usedOnly, tokens, nowMs: deps.now() }) };
    }
    default:
      return { ok: false, error: gatewayError("internal_error", "The gateway hit an internal error. Retry the request.") };
  }
}

/**
 * The facade's responder as the gateway drives it: the gateway's failure codes become this layer's
 * errors (src/http/errors.ts), and how the response ended (success or failure) is reported to `end`.
 */
function observeEnd(r: FacadeResponder, end: (ok: boolean) => void, tracker: RunTracker | null): ChatResponder {
  return new EndObserved(r, end, tracker);
}

/** One per live request, so a class: shared methods instead of closures made per request. */
class EndObserved implements ChatResponder {
  constructor(
    private readonly r: FacadeResponder,
    private readonly end: (ok: boolean) => void,
    private readonly tracker: RunTracker | null,
  ) {}

  get response(): Promise<Response> {
    return this.r.response;
  }

  relay(frame: ChunkFrame): void {
    this.r.relay(frame);
  }

  discard(): void {
    this.r.discard();
  }

  prepare(outcome: ChatOutcome): void | Promise<void> {
    const whole = this.r.prepare?.(outcome);
    // Kept for a retry now, before the commit that charges for it releases the response.
    if (whole !== undefined) return this.tracker?.result(whole);
  }

  unsent(): Promise<void> | null {
    return this.r.unsent?.() ?? null;
  }

  succeed(outcome: ChatOutcome): void {
    this.r.succeed(outcome);
    this.end(true);
  }

  fail(failure: RequestFailure): void {
    this.r.fail(failureError(failure));
    this.end(false);
  }

  failMidStream(failure: RequestFailure): void {
    this.r.failMidStream(failureError(failure));
    this.end(false);
  }
}
