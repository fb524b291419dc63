// Hedged dispatch at the request edge (docs/routing.md, Hedging). When the attempt the request actor
// waits on has no first byte after the hedge delay, a second attempt of the same request goes to
// another provider. The actor never sees the hedge unless it wins: its first chunk then stands in for
// the first attempt's (which is cancelled and settles zero_settled, reason hedge_lost), and from there
// the edge's `live` attempt is the hedge. If the first attempt fails before its first byte while the
// hedge runs, the actor's next dispatch adopts the hedge instead of routing again.
import { encodeFrame } from "../wire/codec.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import type { RequestEvent } from "../../actors/request.ts";
import { attemptVerdict } from "./attemptVerdict.ts";
import { ChunkMeter } from "./chunkMeter.ts";
import { attemptKey, isRemote } from "./registry.ts";
import type { LiveAttempt, RequestHandle } from "./requestHandle.ts";
import type { ActorRefFrom } from "xstate";
import type { RequestLogic } from "../../actors/request.ts";
import { publicKeyOf, routableViews, type DispatchDeps } from "./dispatchDeps.ts";

/** Hedge attempts are numbered this much above the attempt they hedge (the actor numbers its own from 0). */
export const HEDGE_ATTEMPT_OFFSET = 128;

/** Arms the hedge timer for the attempt just sent, when hedging is on and the request can still fail over. */
export function armHedge(deps: DispatchDeps, handle: RequestHandle, live: LiveAttempt): void {
  const routing = deps.routing;
  if (!routing || live.attemptN >= HEDGE_ATTEMPT_OFFSET) return;
  const delay = routing.hedgeDelayMs(handle.chat.model);
  if (delay === null) return;
  disarmHedge(deps, handle);
  handle.hedgeTimer = routing.timers.setTimeout(() => {
    handle.hedgeTimer = null;
    sendHedge(deps, handle, live);
  }, delay);
}

export function disarmHedge(deps: DispatchDeps, handle: RequestHandle): void {
  if (handle.hedgeTimer !== null) deps.routing?.timers.clearTimeout(handle.hedgeTimer);
  handle.hedgeTimer = null;
}

/** The hedge timer fired: send a second attempt if the first still has no first byte and the rules allow. */
function sendHedge(deps: DispatchDeps, handle: RequestHandle, primary: LiveAttempt): void {
  const routing = deps.routing!;
  const { registry, settlements } = deps;
  if (handle.sent !== primary || primary.firstByte || handle.hedge !== null) return;
  const snapshot = handle.actor.getSnapshot();
  if (snapshot.status !== "active" || snapshot.value !== "awaitingFirstByte") return;
  const model = handle.chat.model;
  const views = [...routableViews(deps, model)];
  if (!routing.mayHedge(views, model)) return;
  const choice = routing.choose(views, model, [...snapshot.context.excludedProviders, primary.providerId], null);
  // A hedge onto a provider in cooldown would only add a second slow attempt.
  if (!choice.ok || choice.lastResort) return;
  // In a cluster the hedge may go to another node's provider, as any attempt may.
  const session = registry.sessions.get(choice.provider.sessionId) ?? deps.remote?.session(choice.provider.sessionId);
  if (!session) return;
  const attemptN = HEDGE_ATTEMPT_OFFSET + primary.attemptN;
  const route = settlements.openAttempt({
    requestId: handle.requestId,
    attemptN,
    providerId: choice.provider.providerId,
    providerPublicKey: publicKeyOf(session),
    chat: handle.chat,
    accountId: handle.accountId ?? "",
    payer: handle.payer ?? "promotion",
    requestStartedAtMs: handle.startedAtMs,
    promptBound: handle.promptBound,
    pricing: handle.pricing,
  });
  if (!route) return;
  const job = encodeFrame({
    type: "job",
    request_id: handle.requestId,
    attempt_n: attemptN,
    model_id: model,
    messages: handle.chat.messages,
    params: handle.chat.params,
    route,
    deadline_ms: Math.max(1, deps.requestDeadlineMs - (deps.now() - handle.startedAtMs)),
  });
  const key = attemptKey(handle.requestId, attemptN);
  const hedge: LiveAttempt = {
    key,
    attemptN,
    providerId: choice.provider.providerId,
    sessionId: session.sessionId,
    at: deps.clock(),
    firstByte: false,
    meter: new ChunkMeter(handle.chat.params.max_tokens),
  };
  handle.hedge = hedge;
  handle.hedgeCancel = () => cancelHedge(deps, handle, true);
  // The provider endpoint hands an attempt's frames to `request`: the hedge's go here until it wins.
  const request = { send: (event: RequestEvent) => hedgeEvent(deps, handle, hedge, event) } as unknown as ActorRefFrom<RequestLogic>;
  registry.addAttempt({
    key,
    requestId: handle.requestId,
    attemptN,
    model,
    request,
    session,
    meter: hedge.meter,
    chunk: (frame) => hedgeChunk(deps, handle, hedge, frame),
  });
  routing.dispatched(hedge.providerId, model);
  settlements.afterCommit((committed) => {
    if (!committed || handle.hedge !== hedge) {
      // The request moved on (or the write failed) before the job left: nothing was sent.
      if (handle.hedge === hedge) handle.hedge = null;
      registry.releaseAttempt(key);
      settlements.released(handle.requestId, attemptN);
      return;
    }
    hedge.at = deps.clock();
    if (registry.attempts.has(key)) {
      if (isRemote(session)) session.send(job, key);
      else session.send(job);
    }
    routing.counters.hedges.sent++;
    deps.log.info("hedge_sent", { request_id: handle.requestId, attempt_n: attemptN, provider_id: hedge.providerId, hedged_attempt_n: primary.attemptN });
  }, handle.requestId);
}

/** A chunk of the hedge: its first one, before the first attempt's, wins the race. */
function hedgeChunk(deps: DispatchDeps, handle: RequestHandle, hedge: LiveAttempt, frame: ChunkFrame): void {
  if (handle.hedge === hedge && !hedge.meter.started) {
    // A first chunk claiming more tokens than its bytes can hold never wins: the hedge is let go.
    if (ChunkMeter.inflatesFirst(frame)) {
      deps.log.warn("output_tokens_inflated", { request_id: frame.request_id, attempt_n: frame.attempt_n, tokens: frame.tokens });
      deps.registry.attempts.get(hedge.key)?.session.send(
        encodeFrame({ type: "cancel", request_id: handle.requestId, attempt_n: hedge.attemptN, reason: "gateway_timeout", delivered_output_bytes: 0 }),
      );
      deps.settlements.cancelSent(handle.requestId, hedge.attemptN, "gateway_timeout");
      hedgeEvent(deps, handle, hedge, { type: "provider.rejected" });
      return;
    }
    const primary = handle.sent;
    handle.hedge = null;
    handle.hedgeCancel = null;
    if (primary) letGo(deps, handle, primary, "hedge_lost");
    handle.sent = hedge;
    handle.meter = hedge.meter;
    handle.toPrefix = deps.settlements.relayerFor(handle.requestId, hedge.attemptN);
    deps.routing!.counters.hedges.won++;
    deps.log.info("hedge_won", { request_id: handle.requestId, attempt_n: hedge.attemptN, provider_id: hedge.providerId });
  }
  if (handle.sent === hedge) deps.chunkSink(handle, hedge.meter)(frame);
}

/** Any other frame of the hedge: the actor's once the hedge is the live attempt; before, a failed hedge is let go. */
function hedgeEvent(deps: DispatchDeps, handle: RequestHandle, hedge: LiveAttempt, event: RequestEvent): void {
  if (handle.sent === hedge) {
    handle.actor.send(event);
    return;
  }
  if (handle.hedge !== hedge) return;
  handle.hedge = null;
  handle.hedgeCancel = null;
  deps.registry.releaseAttempt(hedge.key);
  deps.settlements.released(handle.requestId, hedge.attemptN);
  deps.routing!.attemptEnded(hedge.providerId, handle.chat.model, attemptVerdict(event, false), deps.clock() - hedge.at);
}

/**
 * The first attempt delivered first (or the request ended): the hedge is cancelled at once and
 * settles zero_settled, reason hedge_lost.
 */
export function cancelHedge(deps: DispatchDeps, handle: RequestHandle, lost: boolean): void {
  disarmHedge(deps, handle);
  const hedge = handle.hedge;
  if (!hedge) return;
  handle.hedge = null;
  handle.hedgeCancel = null;
  letGo(deps, handle, hedge, "hedge_lost");
  if (lost) deps.routing!.counters.hedges.lost++;
}

/**
 * The first attempt failed before its first byte while the hedge runs: the hedge becomes the attempt
 * (no new dispatch). Returns it, or null when there is none to adopt.
 */
export function adoptHedge(deps: DispatchDeps, handle: RequestHandle): LiveAttempt | null {
  disarmHedge(deps, handle);
  const hedge = handle.hedge;
  if (!hedge || !deps.registry.attempts.has(hedge.key)) return null;
  handle.hedge = null;
  handle.hedgeCancel = null;
  handle.sent = hedge;
  handle.meter = hedge.meter;
  handle.toPrefix = deps.settlements.relayerFor(handle.requestId, hedge.attemptN);
  return hedge;
}

/** Cancels an attempt that delivered nothing to the buyer, releases it, and records no verdict on its provider. */
function letGo(deps: DispatchDeps, handle: RequestHandle, attempt: LiveAttempt, why: "hedge_lost"): void {
  const { registry, settlements } = deps;
  const registered = registry.attempts.get(attempt.key);
  if (registered) {
    registered.session.send(
      encodeFrame({ type: "cancel", request_id: handle.requestId, attempt_n: attempt.attemptN, reason: "gateway_timeout", delivered_output_bytes: 0 }),
    );
    settlements.cancelSent(handle.requestId, attempt.attemptN, "gateway_timeout");
  }
  settlements.hedgeLost(handle.requestId, attempt.attemptN);
  registry.releaseAttempt(attempt.key);
  settlements.released(handle.requestId, attempt.attemptN);
  deps.routing!.attemptEnded(attempt.providerId, handle.chat.model, { kind: "no_verdict" }, attempt.firstByte ? null : deps.clock() - attempt.at);
  deps.metrics.attemptFinished("cancelled");
  deps.log.debug("attempt_cancelled", { request_id: handle.requestId, attempt_n: attempt.attemptN, reason: why });
}
