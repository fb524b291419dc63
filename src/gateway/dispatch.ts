// One attempt's dispatch: choose a provider that may serve the model, persist the attempt's route
// snapshot, and send the job once that write is durable; the request actor hears the result by event.
import type { DispatchInput, RequestEvent } from "../../actors/request.ts";
import type { Log } from "../log.ts";
import type { MetricsPort } from "../metrics.ts";
import { encodeFrame } from "../wire/codec.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import { ChunkMeter } from "./chunkMeter.ts";
import { attemptKey, type Registry } from "./registry.ts";
import type { RequestHandle } from "./requestHandle.ts";
import { chooseProvider, type ProviderView } from "./routing.ts";
import type { Settlements } from "./settlements.ts";

export interface DispatchDeps {
  registry: Registry;
  settlements: Settlements;
  now: () => number;
  requestDeadlineMs: number;
  log: Log;
  metrics: MetricsPort;
  clock: () => number;
  /** The handler of a live attempt's chunks. */
  chunkSink: (handle: RequestHandle, meter: ChunkMeter) => (frame: ChunkFrame) => void;
}

export const unavailableMessages = {
  model_not_available: (model: string) => `The model '${model}' is not available. List available models with GET /v1/models.`,
  coordinator_unavailable: () => "No provider is free to serve this model right now. Retry shortly.",
} as const;

/**
 * Sessions that may serve `model`: when the catalog knows the model, only those advertising its
 * hash and not caught measuring another one on this session (docs/catalog.md).
 */
function routableViews(deps: DispatchDeps, model: string): Iterable<ProviderView> {
  const { registry } = deps;
  const views = registry.providerViews();
  const expected = deps.settlements.expectedHash(model);
  if (expected === null) return views;
  return [...views].filter((view) => {
    const session = registry.sessions.get(view.sessionId);
    if (!session || session.refusedModels.has(model)) return false;
    return session.actor.getSnapshot().context.models.some((m) => m.model_id === model && m.model_hash === expected);
  });
}

/** Chooses a provider and sends it the job once its snapshot committed; answers the actor by event. */
export function dispatchAttempt(deps: DispatchDeps, handle: RequestHandle, input: DispatchInput, dispatch: { stopped: boolean }): void {
  const { registry, settlements } = deps;
  const sendBack = (event: RequestEvent) => handle.actor.send(event);
  const { chat } = handle;
  const choice = chooseProvider(routableViews(deps, chat.model), chat.model, input.excludedProviders);
  if (!choice.ok) {
    sendBack({ type: "route.unavailable", code: choice.code, message: unavailableMessages[choice.code](chat.model) });
    return;
  }
  const session = registry.sessions.get(choice.provider.sessionId)!;
  const key = attemptKey(input.requestId, input.attemptN);
  const remaining = Math.max(1, deps.requestDeadlineMs - (deps.now() - handle.startedAtMs));
  const route = settlements.openAttempt({
    requestId: input.requestId,
    attemptN: input.attemptN,
    providerId: choice.provider.providerId,
    providerPublicKey: session.actor.getSnapshot().context.hello!.receipt_public_key,
    chat,
    accountId: handle.accountId ?? "",
    payer: handle.payer ?? "promotion",
    requestStartedAtMs: handle.startedAtMs,
    promptBound: handle.promptBound,
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
    if (!lost) session.send(job);
    handle.timing.waitingSince = deps.clock();
    if (input.attemptN > 0 && handle.timing.lastAttemptOutcome) deps.metrics.failover(handle.timing.lastAttemptOutcome);
    deps.log.debug("attempt_dispatched", { request_id: input.requestId, attempt_n: input.attemptN, provider_id: choice.provider.providerId });
    sendBack({
      type: "route.dispatched",
      attempt: { attemptN: input.attemptN, sessionId: session.sessionId, providerId: choice.provider.providerId },
    });
    if (lost) sendBack({ type: "provider.lost" });
  };
  settlements.afterCommit(send);
}
