// The edge of the request actor: starts one per buyer request and plugs in its effects — choosing a
// provider and sending the job, relaying chunks to the buyer's responder, cancelling and releasing attempts.
// An attempt's chunks after its first never reach the actor: `chunkArrived` checks and counts them with the
// attempt's ChunkMeter and relays them here, sending the actor only what changes its state.
import { createActor, type ActorRefFrom, type InspectionEvent } from "xstate";
import { requestLogic, streamIdleCheckMs, type DispatchInput, type RequestContext, type RequestEvent, type RequestLogic } from "../../actors/request.ts";
import { errorTable, gatewayError, publicCode, type ErrorCode, type GatewayError } from "../http/errors.ts";
import type { ChatResponder } from "../http/chat/responders.ts";
import type { NormalizedChat } from "../http/chat/normalize.ts";
import { encodeFrame } from "../wire/codec.ts";
import type { ChunkFrame, EndFrame } from "../wire/frames.ts";
import { ChunkMeter } from "./chunkMeter.ts";
import { attemptKey, isRemote, type Registry, type RemoteSession, type SessionHandle } from "./registry.ts";
import { chooseProvider, type ProviderView } from "./routing.ts";
import type { Settlements } from "./settlements.ts";
import type { Payer } from "../store/index.ts";
import { requestLogFields, type Log } from "../log.ts";
import { noopMetrics, type AttemptOutcome, type MetricsPort, type RequestOutcome, type RequestSummary } from "../metrics.ts";

export interface RequestSpec {
  requestId: string;
  chat: NormalizedChat;
  promptBound: number;
  responder: ChatResponder;
  /** The buyer's account (logged; never a key). */
  accountId?: string;
  /** When the HTTP request arrived, on the runner's `monotonicNow` clock; default: when `start` runs. */
  arrivedAt?: number;
  /** The buyer route, for metrics labels; default /v1/chat/completions. */
  buyerRoute?: string;
  /** Who pays the request's attempts (the reservation was taken at admission). */
  payer?: Payer;
}

interface RequestHandle extends RequestSpec {
  actor: ActorRefFrom<RequestLogic>;
  startedAtMs: number;
  lastEnd: EndFrame | null;
  timing: RequestTiming;
  /** The current (or last) attempt's chunk count: replaced at each dispatch. */
  meter: ChunkMeter;
  /** Adds a relayed chunk to the current attempt's delivered prefix (settlement); replaced at each dispatch. */
  toPrefix: (frame: ChunkFrame) => void;
  /** The dispatch of the current `routing` visit; `stopped` once the actor left `routing`. */
  dispatch: { stopped: boolean };
}

/**
 * Per-request timing on the monotonic clock, for ttft/overhead. Provider wait = the sum of intervals
 * from "the gateway sent a job or finished relaying a chunk" to "the next provider-driven step of this
 * request ran" (chunk, end, decline, loss, timeout, cancel). Updated in O(1) per chunk.
 */
interface RequestTiming {
  arrivedAt: number;
  firstTokenAt: number | null;
  waitingSince: number | null;
  providerWaitMs: number;
  inputTokens: number;
  errorCode: ErrorCode | null;
  lastAttemptOutcome: AttemptOutcome | null;
}

export interface RequestRunnerDeps {
  registry: Registry;
  now: () => number;
  maxAttempts: number;
  firstByteTimeoutMs: number;
  streamIdleTimeoutMs: number;
  requestDeadlineMs: number;
  inspect?: (event: InspectionEvent) => void;
  onClosed: () => void;
  log: Log;
  metrics?: MetricsPort;
  /** High-resolution clock (ms) for latency metrics; default performance.now. */
  monotonicNow?: () => number;
  /** Route snapshots, delivered prefixes and receipts of every attempt. */
  settlements: Settlements;
  /** A cluster node's view of the other nodes' providers (src/gateway/clusterBridge.ts). */
  remote?: RemoteProviders;
}

/** Other nodes' provider sessions, routed to like local ones (docs/scale-out.md). */
export interface RemoteProviders {
  /** Views of remote sessions that may serve `model` (advertising `expectedHash` when not null). */
  views(model: string, expectedHash: string | null): Iterable<ProviderView>;
  /** Every remote session's view (status, models list, metrics). */
  all(): Iterable<ProviderView>;
  /** The link to a remote session by id, while its node is alive. */
  session(sessionId: string): RemoteSession | undefined;
}

/** How the attempt being released ended, from the event that ended it (see actors/request.ts). */
function attemptOutcome(event: RequestEvent | { type: string }, context: RequestContext): AttemptOutcome {
  switch (event.type) {
    case "provider.ended":
      return (event as Extract<RequestEvent, { type: "provider.ended" }>).frame.terminal_state === "normal_done" ? "completed" : "provider_error";
    case "provider.chunk":
      return context.lengthLimited ? "length_limited" : "bad_sequence";
    case "stream.lengthLimited":
      return "length_limited";
    case "stream.seqError":
      return "bad_sequence";
    case "provider.declined":
      return "declined";
    case "provider.lost":
      return "lost";
    case "buyer.aborted":
      return "cancelled";
    default:
      // xstate.after.* — firstByteTimeout, streamIdleTimeout or requestDeadline.
      return "timeout";
  }
}

const noPrefix = (_frame: ChunkFrame): void => {};

/** A request's chat without what only a dispatch reads: the messages and every parameter but the cap. */
const withoutPrompt = (chat: NormalizedChat): NormalizedChat => ({ ...chat, messages: [], params: { max_tokens: chat.params.max_tokens } });

const OUTCOME_BY_STATE: Record<string, RequestOutcome> = {
  succeeded: "succeeded",
  failed: "failed",
  failedMidStream: "failed_mid_stream",
  cancelled: "cancelled",
};

const unavailableMessages = {
  model_not_available: (model: string) => `The model '${model}' is not available. List available models with GET /v1/models.`,
  coordinator_unavailable: () => "No provider is free to serve this model right now. Retry shortly.",
} as const;

export function createRequestRunner(deps: RequestRunnerDeps) {
  const { registry, log, settlements } = deps;

  /**
   * Sessions that may serve `model`: when the catalog knows the model, only those advertising its
   * hash and not caught measuring another one on this session (DESIGN §3).
   */
  const routableViews = (model: string): Iterable<ProviderView> => {
    const views = registry.providerViews();
    const expected = settlements.expectedHash(model);
    const local =
      expected === null
        ? views
        : [...views].filter((view) => {
            const session = registry.sessions.get(view.sessionId);
            if (!session || session.refusedModels.has(model)) return false;
            return session.actor.getSnapshot().context.models.some((m) => m.model_id === model && m.model_hash === expected);
          });
    return deps.remote ? [...local, ...deps.remote.views(model, expected)] : local;
  };
  const sessionOf = (sessionId: string): SessionHandle | RemoteSession | undefined => registry.sessions.get(sessionId) ?? deps.remote?.session(sessionId);
  const publicKeyOf = (session: SessionHandle | RemoteSession): Uint8Array =>
    isRemote(session) ? session.publicKey : session.actor.getSnapshot().context.hello!.receipt_public_key;
  const metrics = deps.metrics ?? noopMetrics;
  const clock = deps.monotonicNow ?? (() => performance.now());
  const handles = new Map<string, RequestHandle>();

  /** Closes an open provider-wait interval (a provider-driven step is starting now). */
  const stopWaiting = (t: RequestTiming, at: number) => {
    if (t.waitingSince !== null) {
      t.providerWaitMs += at - t.waitingSince;
      t.waitingSince = null;
    }
  };

  const currentKey = (c: RequestContext) => (c.current ? attemptKey(c.requestId, c.current.attemptN) : null);

  /** Writes one accepted chunk to the buyer and the attempt's delivered prefix, and times it (O(1) per chunk). */
  const relay = (handle: RequestHandle, frame: ChunkFrame) => {
    const t = handle.timing;
    const at = clock();
    stopWaiting(t, at);
    t.firstTokenAt ??= at;
    handle.responder.relay(frame);
    handle.toPrefix(frame);
    t.waitingSince = clock();
  };

  /**
   * A chunk of a live attempt, from the provider endpoint. The first one is the actor's to judge (it
   * changes state); later ones are judged by the meter, and the actor hears only of a bad seq, the
   * length cap, and the first chunk of each idle-check window.
   */
  const chunkArrived = (handle: RequestHandle, meter: ChunkMeter, frame: ChunkFrame) => {
    if (!meter.started) {
      handle.actor.send({ type: "provider.chunk", frame });
      return;
    }
    switch (meter.accept(frame)) {
      case "relay":
        relay(handle, frame);
        if (meter.markProgress()) handle.actor.send({ type: "stream.progress" });
        return;
      case "seq_error":
        handle.actor.send({ type: "stream.seqError" });
        return;
      case "length_limited":
        handle.actor.send({ type: "stream.lengthLimited" });
        return;
    }
  };

  /**
   * The attempt's chunk handler. Made outside dispatchAttempt, whose closures share one scope: one
   * made there would keep the encoded job (the whole prompt) alive for as long as the attempt runs.
   */
  const chunkSink = (handle: RequestHandle, meter: ChunkMeter) => (frame: ChunkFrame) => chunkArrived(handle, meter, frame);

  /** Chooses a provider and sends it the job once its snapshot committed; answers the actor by event. */
  const dispatchAttempt = (handle: RequestHandle, input: DispatchInput, dispatch: { stopped: boolean }): void => {
    const sendBack = (event: RequestEvent) => handle.actor.send(event);
    const { chat } = handle;
    const choice = chooseProvider(routableViews(chat.model), chat.model, input.excludedProviders);
    if (!choice.ok) {
      sendBack({ type: "route.unavailable", code: choice.code, message: unavailableMessages[choice.code](chat.model) });
      return;
    }
    const session = sessionOf(choice.provider.sessionId);
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
      chunk: chunkSink(handle, meter),
    });
    // Group commit (src/store/groupCommit.ts): the job leaves only once its reservation and route
    // snapshot are durable — at the end of this event-loop turn, shared with the turn's other writes.
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
      handle.timing.waitingSince = clock();
      if (input.attemptN > 0 && handle.timing.lastAttemptOutcome) metrics.failover(handle.timing.lastAttemptOutcome);
      log.debug("attempt_dispatched", { request_id: input.requestId, attempt_n: input.attemptN, provider_id: choice.provider.providerId });
      sendBack({
        type: "route.dispatched",
        attempt: { attemptN: input.attemptN, sessionId: session.sessionId, providerId: choice.provider.providerId },
      });
      if (lost) sendBack({ type: "provider.lost" });
    };
    settlements.afterCommit(send);
  };

  const logic = requestLogic(
    {
      dispatchAttempt: ({ context }, input) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        const dispatch = { stopped: false };
        handle.dispatch = dispatch;
        try {
          dispatchAttempt(handle, input, dispatch);
        } catch {
          // As an invoked actor's error did: this request fails as an internal error, the process goes on.
          handle.actor.send({ type: "route.failed" });
        }
      },
      abandonDispatch: ({ context }) => {
        const handle = handles.get(context.requestId);
        if (handle) handle.dispatch.stopped = true;
      },
      relayChunk: ({ context }, { frame }) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        // The machine's first-chunk guards passed, so the meter accepts it; it now counts the attempt's
        // output, and this window's progress is already known to the machine.
        handle.meter.accept(frame);
        handle.meter.markProgress();
        relay(handle, frame);
        // A stream commits at this chunk and never dispatches again (no failover after the first
        // byte, DESIGN §1): its prompt, up to the whole body limit, need not live as long as it does.
        if (handle.chat.stream) handle.chat = withoutPrompt(handle.chat);
      },
      openProgressWindow: ({ context }) => handles.get(context.requestId)?.meter.openWindow(),
      discardPartialOutput: ({ context }) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        // The discarded attempt's first token was never the answer's.
        handle.timing.firstTokenAt = null;
        handle.meter.discard();
        handle.responder.discard();
        if (context.current) settlements.discarded(context.requestId, context.current.attemptN);
      },
      finishSuccess: ({ context, event }) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        stopWaiting(handle.timing, clock());
        const end = event.type === "provider.ended" ? event.frame : null;
        const finishReason = context.lengthLimited ? "length" : (end?.finish_reason ?? "stop");
        // Prompt tokens as the provider reports them, never above the gateway's own bound.
        const promptTokens = Math.min(end?.usage.input_tokens ?? 0, handle.promptBound);
        handle.timing.inputTokens = promptTokens;
        handle.responder.succeed({ finishReason, usage: { prompt_tokens: promptTokens, completion_tokens: handle.meter.deliveredTokens } });
      },
      finishFailure: ({ context }) => {
        const failure = context.failure ?? { code: "coordinator_unavailable" as const, message: unavailableMessages.coordinator_unavailable() };
        const error: GatewayError = gatewayError(failure.code, failure.message, {
          retryAfterSeconds: failure.code === "coordinator_unavailable" ? 1 : undefined,
          param: failure.code === "model_not_available" ? "model" : undefined,
        });
        const handle = handles.get(context.requestId);
        if (!handle) return;
        stopWaiting(handle.timing, clock());
        handle.timing.errorCode = failure.code;
        handle.responder.fail(error);
      },
      finishMidStreamError: ({ context }) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        stopWaiting(handle.timing, clock());
        handle.timing.errorCode = "provider_disconnected";
        handle.responder.failMidStream(
          gatewayError("provider_disconnected", "The provider disconnected after the stream started. Retrying sends a new, separately billed request."),
        );
      },
      cancelAttempt: ({ context, event }, { reason }) => {
        const key = currentKey(context);
        const attempt = key ? registry.attempts.get(key) : undefined;
        if (!attempt || !context.current) return;
        // A non-streaming body is written only on success, and the only cancel on the way to success
        // is the length cap (a chunk past max_tokens). Any other cancel (buyer gone, deadline, stall,
        // bad seq) abandons the buffered output: nothing reached the buyer, so nothing may be charged
        // (DESIGN §6). A first chunk's cancel is either the cap or a bad seq with nothing counted yet.
        const lengthCap = event.type === "stream.lengthLimited" || event.type === "provider.chunk";
        const abandoned = !context.streaming && !lengthCap;
        if (abandoned) settlements.discarded(context.requestId, context.current.attemptN);
        attempt.session.send(
          encodeFrame({
            type: "cancel",
            request_id: context.requestId,
            attempt_n: context.current.attemptN,
            reason,
            delivered_output_bytes: abandoned ? 0 : attempt.meter.deliveredBytes,
          }),
        );
        settlements.cancelSent(context.requestId, context.current.attemptN, reason);
        log.debug("attempt_cancelled", { request_id: context.requestId, attempt_n: context.current.attemptN, reason });
      },
      releaseAttempt: ({ context, event }) => {
        const key = currentKey(context);
        if (!key) return;
        registry.releaseAttempt(key);
        settlements.released(context.requestId, context.current!.attemptN);
        // Invariant: `current` is cleared after every release, so each attempt is counted once here.
        const handle = handles.get(context.requestId);
        const outcome = attemptOutcome(event, context);
        if (handle) {
          stopWaiting(handle.timing, clock());
          handle.timing.lastAttemptOutcome = outcome;
        }
        metrics.attemptFinished(outcome);
      },
    },
    {
      firstByteTimeout: deps.firstByteTimeoutMs,
      streamIdleCheck: streamIdleCheckMs(deps.streamIdleTimeoutMs),
      requestDeadline: deps.requestDeadlineMs,
    },
  );

  /** Starts the request actor; the responder's `response` settles when the buyer can be answered. */
  function start(spec: RequestSpec): { abort: () => void } {
    const actor = createActor(logic, {
      input: { requestId: spec.requestId, streaming: spec.chat.stream, maxTokens: spec.chat.params.max_tokens, maxAttempts: deps.maxAttempts },
      inspect: deps.inspect,
    });
    const timing: RequestTiming = {
      arrivedAt: spec.arrivedAt ?? clock(),
      firstTokenAt: null,
      waitingSince: null,
      providerWaitMs: 0,
      inputTokens: 0,
      errorCode: null,
      lastAttemptOutcome: null,
    };
    const handle: RequestHandle = { ...spec, actor, startedAtMs: deps.now(), lastEnd: null, timing, meter: new ChunkMeter(spec.chat.params.max_tokens), toPrefix: noPrefix, dispatch: { stopped: true } };
    handles.set(spec.requestId, handle);
    // The closures below name `handle`, never `spec`: the request's prompt must be able to go with
    // handle.chat's (see relayChunk).
    actor.subscribe({
      complete: () => {
        handles.delete(handle.requestId);
        settlements.requestEnded(handle.requestId);
        report(handle);
        deps.onClosed();
      },
      error: (err) => {
        // A bug in one request ends that request only.
        log.error("request_actor_failed", { request_id: handle.requestId, error: String(err) });
        const context = actor.getSnapshot().context;
        const key = currentKey(context);
        if (key) registry.releaseAttempt(key);
        if (context.current) settlements.released(handle.requestId, context.current.attemptN);
        settlements.requestEnded(handle.requestId);
        handle.responder.fail(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."));
        handles.delete(handle.requestId);
        timing.errorCode = "internal_error";
        report(handle, "failed");
        deps.onClosed();
      },
    });
    actor.start();
    return { abort: () => actor.send({ type: "buyer.aborted" }) };
  }

  /** One `request_completed` log line and the request's metrics, once per request. */
  function report(handle: RequestHandle, forced?: RequestOutcome): void {
    const snapshot = handle.actor.getSnapshot();
    const c = snapshot.context;
    const t = handle.timing;
    const end = clock();
    stopWaiting(t, end);
    const outcome = forced ?? OUTCOME_BY_STATE[String(snapshot.value)] ?? "failed";
    const stream = handle.chat.stream;
    // What the buyer's status line said: streams commit 200 at their first delta.
    const streamed = stream && c.committed;
    let status: number;
    if (outcome === "succeeded") status = 200;
    else if (outcome === "cancelled") status = streamed ? 200 : 499;
    else if (streamed) status = 200;
    else status = errorTable[t.errorCode ?? "internal_error"].status;
    const totalMs = end - t.arrivedAt;
    const summary: RequestSummary = {
      requestId: handle.requestId,
      accountId: handle.accountId ?? null,
      route: handle.buyerRoute ?? "/v1/chat/completions",
      model: handle.chat.model,
      stream,
      outcome,
      status,
      errorCode: t.errorCode === null ? null : publicCode(t.errorCode),
      attempts: c.nextAttemptN,
      inputTokens: t.inputTokens,
      outputTokens: handle.meter.deliveredTokens,
      ttftMs: t.firstTokenAt === null ? null : t.firstTokenAt - t.arrivedAt,
      totalMs,
      overheadMs: Math.max(0, totalMs - t.providerWaitMs),
    };
    metrics.requestCompleted(summary);
    log.info("request_completed", requestLogFields(summary));
  }

  return { start, liveRequests: () => handles.size };
}

export type RequestRunner = ReturnType<typeof createRequestRunner>;
