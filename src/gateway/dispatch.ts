// One attempt's dispatch: choose a provider that may serve the model, persist the attempt's route
// snapshot, and send the job once that write is durable; the request actor hears the result by event.
import type { DispatchInput, RequestEvent } from "../../actors/request.ts";
import { encodeFrame } from "../wire/codec.ts";
import { ChunkMeter } from "./chunkMeter.ts";
import { attemptKey, isRemote } from "./registry.ts";
import type { RequestHandle } from "./requestHandle.ts";
import { chooseProvider, type RouteChoice } from "./routing.ts";
import { adoptHedge, armHedge } from "./hedgedAttempt.ts";
import { publicKeyOf, routableViews, type DispatchDeps } from "./dispatchDeps.ts";

export const unavailableMessages = {
  model_not_available: (model: string) => `The model '${model}' is not available. List available models with GET /v1/models.`,
  coordinator_unavailable: () => "No provider is free to serve this model right now. Retry shortly.",
} as const;

/**
 * Chooses a provider and sends it the job once its snapshot committed; answers the actor by event. A
 * request that finds no free slot for a known model waits in the admission queue (docs/routing.md)
 * and is routed when one frees, or answered coordinator_unavailable when its wait runs out.
 */
export function dispatchAttempt(deps: DispatchDeps, handle: RequestHandle, input: DispatchInput, dispatch: { stopped: boolean }): void {
  const sendBack = (event: RequestEvent) => handle.actor.send(event);
  const model = handle.chat.model;
  // The attempt failed while its hedge runs: the hedge becomes the attempt (docs/routing.md, Hedging).
  const adopted = deps.routing ? adoptHedge(deps, handle) : null;
  if (adopted) {
    sendBack({ type: "route.dispatched", attempt: { attemptN: adopted.attemptN, sessionId: adopted.sessionId, providerId: adopted.providerId } });
    return;
  }
  const unavailable = () =>
    sendBack({ type: "route.unavailable", code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() });
  const choice = choose(deps, handle, input);
  if (choice.ok) return dispatchTo(deps, handle, input, dispatch, choice);
  if (choice.code === "coordinator_unavailable" && deps.routing && worthWaiting(deps, model, input.excludedProviders)) {
    const queue = deps.routing.queue;
    const queued = queue.enqueue({
      model,
      accountId: handle.accountId ?? "",
      tryDispatch: () => {
        if (dispatch.stopped) return "gone";
        const again = choose(deps, handle, input);
        if (!again.ok) return again.code === "coordinator_unavailable" ? "no_slot" : (sendBack({ type: "route.unavailable", code: again.code, message: unavailableMessages[again.code](model) }), "gone");
        dispatchTo(deps, handle, input, dispatch, again);
        return "dispatched";
      },
      expire: () => {
        if (!dispatch.stopped) unavailable();
      },
    });
    if (queued) return;
    deps.routing.counters.queue.full++;
  }
  sendBack({ type: "route.unavailable", code: choice.code, message: unavailableMessages[choice.code](model) });
}

/** Whether a slot may free for this request: a provider it has not tried serves the model and is awake. */
function worthWaiting(deps: DispatchDeps, model: string, excluded: readonly string[]): boolean {
  for (const v of routableViews(deps, model)) {
    if (v.warmModels.includes(model) && !excluded.includes(v.providerId) && (v.state === "ready" || v.state === "busy")) return true;
  }
  return false;
}

function choose(deps: DispatchDeps, handle: RequestHandle, input: DispatchInput): RouteChoice {
  const model = handle.chat.model;
  if (!deps.routing) return chooseProvider(routableViews(deps, model), model, input.excludedProviders);
  return deps.routing.choose([...routableViews(deps, model)], model, input.excludedProviders, handle.sticky?.providerId ?? null);
}

function dispatchTo(deps: DispatchDeps, handle: RequestHandle, input: DispatchInput, dispatch: { stopped: boolean }, choice: Extract<RouteChoice, { ok: true }>): void {
  const { registry, settlements } = deps;
  const sendBack = (event: RequestEvent) => handle.actor.send(event);
  const { chat } = handle;
  // A cluster node's choice may be another node's session (docs/scale-out.md).
  const session = registry.sessions.get(choice.provider.sessionId) ?? deps.remote?.session(choice.provider.sessionId);
  if (!session) {
    sendBack({ type: "route.unavailable", code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() });
    return;
  }
  const key = attemptKey(input.requestId, input.attemptN);
  const remaining = Math.max(1, deps.requestDeadlineMs - (deps.now() - handle.startedAtMs));
  const route = settlements.openAttempt({
    requestId: input.requestId,
    attemptN: input.attemptN,
    providerId: choice.provider.providerId,
    providerPublicKey: publicKeyOf(session),
    chat,
    accountId: handle.accountId ?? "",
    payer: handle.payer ?? "promotion",
    requestStartedAtMs: handle.startedAtMs,
    promptBound: handle.promptBound,
    pricing: handle.pricing,
  });
  if (!route) {
    sendBack({ type: "route.unavailable", code: "model_not_available", message: unavailableMessages.model_not_available(chat.model) });
    return;
  }
  // Encoded before the attempt is registered: encoding can throw on pathological buyer input (e.g.
  // deeply nested tool_calls overflow the stack), and a throw after addAttempt would leak the slot.
  const job = encodeFrame({
    type: "job",
    request_id: input.requestId,
    attempt_n: input.attemptN,
    model_id: chat.model,
    messages: chat.messages,
    params: chat.params,
    route,
    deadline_ms: remaining,
  });
  // Each attempt counts its own chunks (seq from 0, its own share of max_tokens).
  const meter = new ChunkMeter(chat.params.max_tokens);
  handle.meter = meter;
  handle.toPrefix = settlements.relayerFor(input.requestId, input.attemptN);
  const attemptN = input.attemptN;
  // The slot is taken now, so requests routed in the same turn see it taken.
  registry.addAttempt({
    key,
    requestId: input.requestId,
    attemptN,
    model: chat.model,
    request: handle.actor,
    session,
    meter,
    chunk: deps.chunkSink(handle, meter),
  });
  // The job leaves only once its reservation and route snapshot are durable — at the end of this
  // event-loop turn, shared with the turn's other writes (src/store/groupCommit.ts).
  const send = (committed: boolean) => {
    const stopped = dispatch.stopped;
    if (stopped || !committed) {
      // Left `routing` meanwhile (buyer gone, deadline) or the commit failed: the job never left,
      // so the attempt ends having delivered nothing.
      registry.releaseAttempt(key);
      settlements.released(input.requestId, input.attemptN);
      if (!stopped) sendBack({ type: "route.unavailable", code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() });
      return;
    }
    // The session closed while the snapshot was committing: its attempts were already lost.
    const lost = !registry.attempts.has(key);
    if (!lost) {
      if (isRemote(session)) session.send(job, key);
      else session.send(job);
    }
    handle.timing.waitingSince = deps.clock();
    handle.sent = { key, attemptN: input.attemptN, providerId: choice.provider.providerId, sessionId: session.sessionId, at: deps.clock(), firstByte: false, meter };
    const routing = deps.routing;
    if (routing) {
      if (!lost) armHedge(deps, handle, handle.sent);
      routing.dispatched(choice.provider.providerId, chat.model);
      // Sticky lookups count once a request, at its first dispatch.
      if (handle.sticky && input.attemptN === 0) routing.counters.sticky[choice.sticky ? "hit" : "miss"]++;
      if (choice.lastResort) deps.log.info("routed_to_cooling_provider", { request_id: input.requestId, provider_id: choice.provider.providerId, model: chat.model });
    }
    if (input.attemptN > 0 && handle.timing.lastAttemptOutcome) deps.metrics.failover(handle.timing.lastAttemptOutcome);
    deps.log.debug("attempt_dispatched", { request_id: input.requestId, attempt_n: input.attemptN, provider_id: choice.provider.providerId });
    sendBack({
      type: "route.dispatched",
      attempt: { attemptN: input.attemptN, sessionId: session.sessionId, providerId: choice.provider.providerId },
    });
    if (lost) sendBack({ type: "provider.lost" });
  };
  settlements.afterCommit(send, input.requestId);
}
