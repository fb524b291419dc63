// The edge of the request actor: starts one per buyer request and plugs in its effects — choosing a
// provider and sending the job (dispatch.ts), relaying chunks to the buyer's responder, cancelling and
// releasing attempts. An attempt's chunks after its first never reach the actor: `chunkArrived` checks
// and counts them with the attempt's ChunkMeter and relays them here, sending the actor only what
// changes its state. Failures reach the responder as codes (src/chat/contract.ts); http/ maps them.
import { createActor, type ActorOptions, type AnyActorLogic, type InspectionEvent } from "xstate";
import { requestLogic, streamIdleCheckMs, type RequestContext, type RequestEvent, type RequestLogic } from "../../actors/request.ts";
import type { ChatOutcome, ChatResponder, FailureCode, NormalizedChat, RequestFailure } from "../chat/contract.ts";
import { cancelAbandonsOutput } from "../ledger/charges.ts";
import { encodeFrame } from "../wire/codec.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import { ChunkMeter } from "./chunkMeter.ts";
import { OutputGate } from "./outputSent.ts";
import { dispatchAttempt, unavailableMessages } from "./dispatch.ts";
import type { DispatchDeps, RemoteProviders } from "./dispatchDeps.ts";
import { actorHost } from "./actorHost.ts";
import { attemptKey, type Registry } from "./registry.ts";
import type { RequestHandle, RequestSpec } from "./requestHandle.ts";
import { attemptOutcome, newTiming, requestSummary, stopWaiting } from "./requestReport.ts";
import type { Settlements } from "./settlements.ts";
import { attemptVerdict } from "./attemptVerdict.ts";
import { disarmHedge, HEDGE_ATTEMPT_OFFSET } from "./hedgedAttempt.ts";
import type { RoutingState } from "./routingState.ts";
import type { StickyMap } from "../store/sticky.ts";
import type { Log } from "../log.ts";
import { noopMetrics, requestLogFields, type MetricsPort, type RequestOutcome } from "../metrics.ts";

export interface RequestRunnerDeps {
  registry: Registry;
  now: () => number;
  maxAttempts: number;
  firstByteTimeoutMs: number;
  streamIdleTimeoutMs: number;
  requestDeadlineMs: number;
  inspect?: (event: InspectionEvent) => void;
  /** The clock of the request actors' timers (tests inject a SimulatedClock); default the real one. */
  actorClock?: ActorOptions<AnyActorLogic>["clock"];
  onClosed: () => void;
  log: Log;
  metrics?: MetricsPort;
  /** High-resolution clock (ms) for latency metrics; default performance.now. */
  monotonicNow?: () => number;
  /** Route snapshots, delivered prefixes and receipts of every attempt. */
  settlements: Settlements;
  /** The HTTP status a failure code answers with (src/http/errors.ts), for the request's log line and metrics. */
  failureStatus: (code: FailureCode) => number;
  /** What routing learns from each attempt, and the admission queue (docs/routing.md); absent = off. */
  routing?: RoutingState;
  /** Sticky routing's map: a tagged conversation is pinned to the provider that served it. */
  sticky?: StickyMap;
  /** A cluster node's view of the other nodes' providers (src/gateway/clusterBridge.ts). */
  remote?: RemoteProviders;
  /** Whether the cluster node is fenced (its membership lease could not be renewed): new requests end at once. */
  fenced?: () => boolean;
  /**
   * Builds the request actor's logic; default the step logic. Tests pass the statechart it is compiled
   * from, to run both through this edge (docs/decisions.md, Statecharts you can see).
   */
  requestLogic?: typeof requestLogic;
}

const noPrefix = (_frame: ChunkFrame): void => {};

/** A request's chat without what only a dispatch reads: the messages and every parameter but the cap. */
const withoutPrompt = (chat: NormalizedChat): NormalizedChat => ({ ...chat, messages: [], params: { max_tokens: chat.params.max_tokens } });

const currentKey = (c: RequestContext) => (c.current ? attemptKey(c.requestId, c.current.attemptN) : null);

/**
 * The attempt the actor's `current` stands for: the edge's own record of it, which after a won hedge
 * is the hedge (numbered HEDGE_ATTEMPT_OFFSET above it; docs/routing.md, Hedging).
 */
function liveOf(handle: RequestHandle | undefined, c: RequestContext): { key: string; attemptN: number; providerId: string } | null {
  if (!c.current) return null;
  const s = handle?.sent;
  if (s && (s.attemptN === c.current.attemptN || s.attemptN === HEDGE_ATTEMPT_OFFSET + c.current.attemptN)) return s;
  return { key: currentKey(c)!, attemptN: c.current.attemptN, providerId: c.current.providerId };
}

const INTERNAL_ERROR: RequestFailure = { code: "internal_error", message: "The gateway hit an internal error. Retry the request." };
const PROVIDER_DISCONNECTED: RequestFailure = {
  code: "provider_disconnected",
  message: "The provider disconnected after the stream started. Retrying sends a new, separately billed request.",
};

/**
 * Opens once the stream output written so far has left the process: after the turn's writes are
 * handed to the socket (src/gateway/outputSent.ts), and after a slow reader's socket has taken what
 * the process held back for it.
 */
function leaving(settlements: Settlements, responder: ChatResponder): OutputGate {
  const gate = new OutputGate();
  settlements.afterOutputSent(() => {
    const unsent = responder.unsent?.() ?? null;
    if (unsent === null) gate.open();
    else void unsent.then(() => gate.open());
  });
  return gate;
}

/** Writes one accepted chunk to the buyer and the attempt's delivered prefix, and times it (O(1) per chunk). */
function relay(clock: () => number, handle: RequestHandle, frame: ChunkFrame): void {
  const t = handle.timing;
  const at = clock();
  stopWaiting(t, at);
  t.firstTokenAt ??= at;
  handle.responder.relay(frame);
  handle.toPrefix(frame);
  t.waitingSince = clock();
}

/**
 * A chunk of a live attempt, from the provider endpoint. The first one is the actor's to judge (it
 * changes state); later ones are judged by the meter, and the actor hears only of a bad seq, the
 * length cap, and the first chunk of each idle-check window.
 */
function chunkArrived(clock: () => number, log: Log, handle: RequestHandle, meter: ChunkMeter, frame: ChunkFrame): void {
  if (!meter.started) {
    // A first chunk claiming more tokens than its bytes can hold (docs/receipts.md): refused before
    // any byte, as a refused measurement is — the attempt is cancelled and the request fails over.
    if (ChunkMeter.inflatesFirst(frame)) {
      log.warn("output_tokens_inflated", { request_id: frame.request_id, attempt_n: frame.attempt_n, tokens: frame.tokens });
      handle.actor.send({ type: "provider.rejected" });
      return;
    }
    // The first attempt delivered first: its hedge, if any, lost.
    handle.hedgeCancel?.();
    handle.actor.send({ type: "provider.chunk", frame });
    return;
  }
  switch (meter.accept(frame)) {
    case "relay":
      relay(clock, handle, frame);
      if (meter.markProgress()) handle.actor.send({ type: "stream.progress" });
      return;
    case "seq_error":
      handle.actor.send({ type: "stream.seqError" });
      return;
    case "tokens_inflated":
      // A provider failure, ended as a bad seq is: failover before a written body, the in-band error after.
      log.warn("output_tokens_inflated", { request_id: frame.request_id, attempt_n: frame.attempt_n, tokens: meter.deliveredTokens + frame.tokens });
      handle.actor.send({ type: "stream.seqError" });
      return;
    case "length_limited":
      handle.actor.send({ type: "stream.lengthLimited" });
      return;
  }
}

/** The request actor's effects, over the live requests' handles. */
function requestActions(deps: RequestRunnerDeps & DispatchDeps, handles: Map<string, RequestHandle>): Parameters<typeof requestLogic>[0] {
  const { registry, settlements, log, clock, metrics } = deps;
  return {
    dispatchAttempt: ({ context }, input) => {
      const handle = handles.get(context.requestId);
      if (!handle) return;
      const dispatch = { stopped: false };
      handle.dispatch = dispatch;
      try {
        dispatchAttempt(deps, handle, input, dispatch);
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
      const sent = handle.sent;
      if (sent && !sent.firstByte && context.current) {
        sent.firstByte = true;
        registry.firstChunk(sent.key);
        deps.routing?.firstByte(sent.providerId, handle.chat.model, clock() - sent.at);
        handle.servedBy = sent.providerId;
      }
      relay(clock, handle, frame);
      // A stream commits at this chunk and never dispatches again (no failover after the first byte,
      // docs/protocol.md): its prompt, up to the whole body limit, need not live as long as it does.
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
      const live = liveOf(handle, context);
      if (live) settlements.discarded(context.requestId, live.attemptN);
    },
    keepAnswer: ({ context, event }) => {
      const handle = handles.get(context.requestId);
      if (!handle) return;
      // A body written in one piece is built now, and the retry-replay copy keeps it before the
      // attempt's delivered record (released next) can charge for it: a crash between that record and
      // the write leaves the buyer's retry an answer to replay (docs/receipts.md, "Crashes"). A copy
      // kept in Redis (a cluster node) is answered later: the request's writes wait for it.
      const kept = handle.responder.prepare?.(successOutcome(handle, context, event));
      if (kept !== undefined) settlements.writesAfter(context.requestId, kept);
    },
    finishSuccess: ({ context, event }) => {
      const handle = handles.get(context.requestId);
      if (!handle) return;
      stopWaiting(handle.timing, clock());
      const outcome = successOutcome(handle, context, event);
      handle.timing.inputTokens = outcome.usage.prompt_tokens;
      // The last byte (`[DONE]`, or the whole non-streaming body) waits for the attempt's delivered
      // record, released just before, to be committed (a WAL append): a crash after the buyer has the
      // response can no longer leave its provider unpaid (docs/receipts.md, "Crashes"). A stream's
      // record is written once its deltas have left the process: `[DONE]` waits for that too.
      const succeed = () =>
        settlements.afterCommit((committed) => {
          if (!committed) log.error("delivered_record_not_committed", { request_id: context.requestId });
          handle.responder.succeed(outcome);
        }, context.requestId);
      if (handle.outputLeft !== null) handle.outputLeft.whenOpen(succeed);
      else succeed();
      // Sticky routing: the conversation goes on with the provider that answered it.
      if (handle.sticky && handle.servedBy && deps.sticky) {
        deps.sticky.set(handle.sticky.key, handle.accountId ?? "", handle.servedBy, deps.now()).catch((error: unknown) => {
          log.warn("sticky_write_failed", { request_id: handle.requestId, error: String(error) });
        });
      }
    },
    finishFailure: ({ context }) => {
      const failure: RequestFailure = context.failure ?? { code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() };
      const handle = handles.get(context.requestId);
      if (!handle) return;
      stopWaiting(handle.timing, clock());
      handle.timing.errorCode = failure.code;
      handle.responder.fail(failure);
    },
    finishMidStreamError: ({ context }) => {
      const handle = handles.get(context.requestId);
      if (!handle) return;
      stopWaiting(handle.timing, clock());
      handle.timing.errorCode = PROVIDER_DISCONNECTED.code;
      handle.responder.failMidStream(PROVIDER_DISCONNECTED);
    },
    cancelAttempt: ({ context, event }, { reason }) => {
      const handle = handles.get(context.requestId);
      const live = liveOf(handle, context);
      const attempt = live ? registry.attempts.get(live.key) : undefined;
      // The buyer left: a hedge in flight goes too (a timeout keeps it: the next dispatch adopts it).
      if (reason === "buyer_cancel") handle?.hedgeCancel?.();
      if (!attempt || !live) return;
      // A first chunk's cancel is either the cap or a bad seq with nothing counted yet.
      const lengthCap = event.type === "stream.lengthLimited" || event.type === "provider.chunk";
      const abandoned = cancelAbandonsOutput(context.streaming, lengthCap);
      if (abandoned) settlements.discarded(context.requestId, live.attemptN);
      attempt.session.send(
        encodeFrame({
          type: "cancel",
          request_id: context.requestId,
          attempt_n: live.attemptN,
          reason,
          delivered_output_bytes: abandoned ? 0 : attempt.meter.deliveredBytes,
        }),
      );
      settlements.cancelSent(context.requestId, live.attemptN, reason);
      log.debug("attempt_cancelled", { request_id: context.requestId, attempt_n: live.attemptN, reason });
    },
    releaseAttempt: ({ context, event }) => {
      const handle = handles.get(context.requestId);
      const live = liveOf(handle, context);
      if (!live) return;
      const key = live.key;
      registry.releaseAttempt(key);
      // A stream's deltas may still be inside the process: its record waits for them to leave.
      const outputLeft = handle?.chat.stream === true ? leaving(settlements, handle.responder) : null;
      if (handle) handle.outputLeft = outputLeft;
      settlements.released(context.requestId, live.attemptN, outputLeft);
      // Invariant: `current` is cleared after every release, so each attempt is counted once here.
      const outcome = attemptOutcome(event, context);
      if (handle) {
        stopWaiting(handle.timing, clock());
        handle.timing.lastAttemptOutcome = outcome;
        // What this attempt's end says about its provider: cooldowns and first-token times.
        const sent = handle.sent;
        if (deps.routing && context.current && sent?.key === key) {
          const waited = sent.firstByte ? null : clock() - sent.at;
          deps.routing.attemptEnded(sent.providerId, handle.chat.model, attemptVerdict(event, context.lengthLimited), waited);
        }
      }
      metrics.attemptFinished(outcome, context.current!.providerId);
    },
  };
}

export function createRequestRunner(runnerDeps: RequestRunnerDeps) {
  const clock = runnerDeps.monotonicNow ?? (() => performance.now());
  const metrics = runnerDeps.metrics ?? noopMetrics;
  /**
   * The attempt's chunk handler. Made outside dispatchAttempt, whose closures share one scope: one
   * made there would keep the encoded job (the whole prompt) alive for as long as the attempt runs.
   */
  const chunkSink = (handle: RequestHandle, meter: ChunkMeter) => (frame: ChunkFrame) => chunkArrived(clock, runnerDeps.log, handle, meter, frame);
  const deps = { ...runnerDeps, clock, metrics, chunkSink };
  const { registry, log, settlements } = deps;
  const handles = new Map<string, RequestHandle>();

  // Every request actor runs in this host's system (its clock and inspector); `start` observes each one's errors.
  const host = actorHost({ clock: deps.actorClock, inspect: deps.inspect, unobservedErrors: "ignore" });
  const logic: RequestLogic = (deps.requestLogic ?? requestLogic)(requestActions(deps, handles), {
    firstByteTimeout: deps.firstByteTimeoutMs,
    streamIdleCheck: streamIdleCheckMs(deps.streamIdleTimeoutMs),
    requestDeadline: deps.requestDeadlineMs,
  });

  /** One `request_completed` log line and the request's metrics, once per request. */
  function report(handle: RequestHandle, forced?: RequestOutcome): void {
    const snapshot = handle.actor.getSnapshot();
    const endedAt = clock();
    stopWaiting(handle.timing, endedAt);
    const summary = requestSummary(
      {
        requestId: handle.requestId,
        accountId: handle.accountId ?? null,
        route: handle.buyerRoute ?? "/v1/chat/completions",
        model: handle.chat.model,
        stream: handle.chat.stream,
        state: String(snapshot.value),
        committed: snapshot.context.committed,
        attempts: snapshot.context.nextAttemptN,
        outputTokens: handle.meter.deliveredTokens,
        timing: handle.timing,
        endedAt,
      },
      deps.failureStatus,
      forced,
    );
    metrics.requestCompleted(summary);
    log.info("request_completed", requestLogFields(summary));
  }

  /** Starts the request actor; the responder's `response` settles when the buyer can be answered. */
  function start(spec: RequestSpec): { abort: () => void } {
    const actor = createActor(logic, {
      input: { requestId: spec.requestId, streaming: spec.chat.stream, maxTokens: spec.chat.params.max_tokens, maxAttempts: deps.maxAttempts },
      parent: host,
    });
    const timing = newTiming(spec.arrivedAt ?? clock());
    const handle: RequestHandle = { ...spec, actor, startedAtMs: deps.now(), lastEnd: null, timing, meter: new ChunkMeter(spec.chat.params.max_tokens), toPrefix: noPrefix, dispatch: { stopped: true }, sent: null, servedBy: null, hedge: null, hedgeTimer: null, hedgeCancel: null, outputLeft: null };
    handles.set(spec.requestId, handle);
    // Every request earns the hedge budget its share (docs/routing.md, Hedging).
    deps.routing?.requestStarted();
    // The closures below name `handle`, never `spec`: the request's prompt must be able to go with
    // handle.chat's (see relayChunk).
    actor.subscribe({
      complete: () => {
        // A hedge still in flight (the request failed or was cancelled meanwhile) is let go first.
        handle.hedgeCancel?.();
        disarmHedge(deps, handle);
        handles.delete(handle.requestId);
        settlements.requestEnded(handle.requestId);
        report(handle);
        deps.onClosed();
      },
      error: (err) => {
        // A bug in one request ends that request only.
        log.error("request_actor_failed", { request_id: handle.requestId, error: String(err) });
        const context = actor.getSnapshot().context;
        const live = liveOf(handle, context);
        if (live) registry.releaseAttempt(live.key);
        if (live) settlements.released(handle.requestId, live.attemptN);
        handle.hedgeCancel?.();
        disarmHedge(deps, handle);
        settlements.requestEnded(handle.requestId);
        handle.responder.fail(INTERNAL_ERROR);
        handles.delete(handle.requestId);
        timing.errorCode = "internal_error";
        report(handle, "failed");
        deps.onClosed();
      },
    });
    actor.start();
    // Admitted just as the node lost its lease: its slot may no longer count, so it ends as the others did.
    if (deps.fenced?.()) actor.send({ type: "node.fenced" });
    return { abort: () => actor.send({ type: "buyer.aborted" }) };
  }

  /** The cluster node is fenced (docs/scale-out.md, "Fencing"): every request in flight ends now. */
  function fence(): number {
    const live = [...handles.values()];
    for (const handle of live) handle.actor.send({ type: "node.fenced" });
    return live.length;
  }

  /** The live request actors by request id (the operator console counts and follows them). */
  function* actors(): Generator<[string, RequestHandle["actor"]]> {
    for (const [id, handle] of handles) yield [id, handle.actor];
  }

  return { start, liveRequests: () => handles.size, actors, fence };
}

export type RequestRunner = ReturnType<typeof createRequestRunner>;

/** A successful request's outcome: how it finished and the usage billed to the buyer's view of it. */
function successOutcome(handle: RequestHandle, context: RequestContext, event: RequestEvent): ChatOutcome {
  const end = event.type === "provider.ended" ? event.frame : null;
  const finishReason = context.lengthLimited ? "length" : (end?.finish_reason ?? "stop");
  // Prompt tokens as the provider reports them, never above the gateway's own bound.
  const promptTokens = Math.min(end?.usage.input_tokens ?? 0, handle.promptBound);
  return { finishReason, usage: { prompt_tokens: promptTokens, completion_tokens: handle.meter.deliveredTokens } };
}
