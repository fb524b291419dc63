// actors/request.ts — one buyer request:
//   routing → awaitingFirstByte(attempt n) → receiving → succeeded | failed | failedMidStream | cancelled
// Failover (back to routing, failed provider excluded) is possible until the first buyer-visible byte;
// a streaming request commits at its first relayed delta, a non-streaming one only when its body is written.
//
// Only an attempt's first chunk is an event here (it changes state: awaitingFirstByte → receiving, and a
// stream commits). Later chunks stay at the edge (src/gateway/chunkMeter.ts checks their seq and the
// max_tokens cap, counts them and relays them), which tells this machine only what changes its state:
// `stream.seqError`, `stream.lengthLimited`, and `stream.progress` at most once per idle-check window.
// A per-chunk event with a re-armed stall timer was 65 % of the gateway's CPU at 384 live streams.
//
// An XState actor with its own logic rather than a `createMachine` statechart (docs/decisions.md,
// issue 7): `requestStep` is the pure transition function (next state, context, and the effects to run,
// in the order a machine ran its exit, transition and entry actions), `requestLogic` runs the effects —
// the edge's actions after the step, timers on the actor system's clock (SimulatedClock drives them) —
// and `requestChart` is the same chart as data, what the inspector is sent as the actor's definition.
import type { ActorLogic, ActorRef, ActorScope, ActorSystem, EventObject, Snapshot } from "xstate";
import type { ChunkFrame, DeclineCode, EndFrame } from "../src/wire/frames.ts";
import type { FailureCode } from "../src/chat/contract.ts";
import { selfTimers } from "./selfTimers.ts";

export type { FailureCode } from "../src/chat/contract.ts";

export interface AttemptRef {
  attemptN: number;
  sessionId: string;
  providerId: string;
}

export interface RequestInput {
  requestId: string;
  streaming: boolean;
  maxTokens: number;
  maxAttempts: number;
}

export interface RequestContext extends RequestInput {
  nextAttemptN: number;
  current: AttemptRef | null;
  excludedProviders: string[];
  committed: boolean;
  /** Whether the current idle-check window saw a chunk (the first chunk, or a `stream.progress`). */
  progressInWindow: boolean;
  /** Idle-check windows in a row that ended without a chunk. */
  idleWindows: number;
  lengthLimited: boolean;
  failure: { code: FailureCode; message: string } | null;
  lastAttemptFailure: string | null;
}

export type RequestEvent =
  | { type: "route.dispatched"; attempt: AttemptRef }
  | { type: "route.unavailable"; code: FailureCode; message: string }
  /** Dispatching hit an internal error (a bug): this request fails, nothing else. */
  | { type: "route.failed" }
  /** The gateway refused the attempt's `accepted` measurement (hash ≠ the catalog's): fail over. */
  | { type: "provider.rejected" }
  | { type: "provider.declined"; code: DeclineCode }
  /** An attempt's first chunk (later ones stay at the edge). */
  | { type: "provider.chunk"; frame: ChunkFrame }
  /** A later chunk arrived in this idle-check window (sent at most once per window). */
  | { type: "stream.progress" }
  /** A later chunk carried the wrong seq: a provider failure. */
  | { type: "stream.seqError" }
  /** A later chunk would take the delivered tokens past max_tokens: it is not relayed. */
  | { type: "stream.lengthLimited" }
  | { type: "provider.ended"; frame: EndFrame }
  | { type: "provider.lost" }
  | { type: "buyer.aborted" };

export interface DispatchInput {
  requestId: string;
  attemptN: number;
  excludedProviders: string[];
}

/**
 * The `streamIdleCheck` delay for a stall limit T: half of it (rounded up), so that failing after two
 * consecutive check windows without a chunk detects a stall after more than T and at most 1.5 × T.
 */
export const streamIdleCheckMs = (streamIdleTimeoutMs: number): number => Math.max(1, Math.ceil(streamIdleTimeoutMs / 2));

/** Consecutive idle-check windows without a chunk after which a running attempt has stalled. */
type AnySystem = ActorSystem<any>;

export type RequestState =
  | "routing"
  | "awaitingFirstByte"
  | "receiving"
  | "providerFailedAfterOutput"
  | "attemptFailed"
  | "succeeded"
  | "failed"
  | "failedMidStream"
  | "cancelled";
const FINAL: ReadonlySet<RequestState> = new Set(["succeeded", "failed", "failedMidStream", "cancelled"]);

export type RequestTimer = "firstByteTimeout" | "streamIdleCheck" | "requestDeadline";

/** The buyer's and the edge's events, and the actor's own timers. */
export type RequestLogicEvent = RequestEvent | { type: "timer.firstByteTimeout" } | { type: "timer.streamIdleCheck" } | { type: "timer.requestDeadline" };
/** Each timer's event, made once (a timer fires often: the idle check every window of a stream). */
const TIMER_EVENTS: Record<RequestTimer, RequestLogicEvent> = {
  firstByteTimeout: { type: "timer.firstByteTimeout" },
  streamIdleCheck: { type: "timer.streamIdleCheck" },
  requestDeadline: { type: "timer.requestDeadline" },
};

export type RequestSnapshot = Snapshot<undefined> & { value: RequestState; context: RequestContext };

type CancelReason = "buyer_cancel" | "gateway_timeout";

/** The edge's actions that take no parameters. */
type PlainAction = "abandonDispatch" | "openProgressWindow" | "discardPartialOutput" | "finishSuccess" | "finishFailure" | "finishMidStreamError" | "releaseAttempt";

/** An effect of a step, in the order the machine ran it; an action sees the context as it was then. */
export type RequestEffect =
  | { type: "dispatchAttempt"; context: RequestContext; params: DispatchInput }
  | { type: "relayChunk"; context: RequestContext; params: { frame: ChunkFrame } }
  | { type: "cancelAttempt"; context: RequestContext; params: { reason: CancelReason } }
  | { type: PlainAction; context: RequestContext }
  | { type: "startTimer"; timer: RequestTimer }
  | { type: "stopTimer"; timer: RequestTimer };

export interface RequestStep {
  value: RequestState;
  context: RequestContext;
  effects: RequestEffect[];
}

/** Consecutive idle-check windows without a chunk after which a running attempt has stalled. */
const STALL_WINDOWS = 2;
const exhausted = (c: RequestContext): RequestContext => ({
  ...c,
  failure: c.failure ?? { code: "coordinator_unavailable", message: "No provider could serve this request right now. Retry shortly." },
});

/** One transition: exit the source, run the transition's own updates and actions, enter the target (with transient states resolved). */
class Transition {
  effects: RequestEffect[] = [];
  constructor(
    public context: RequestContext,
    /** What caused the transition; none for the first one. */
    private readonly event: RequestLogicEvent | null,
  ) {}

  update(f: (c: RequestContext) => RequestContext): this {
    this.context = f(this.context);
    return this;
  }

  act(type: PlainAction): this {
    this.effects.push({ type, context: this.context });
    return this;
  }

  cancel(reason: CancelReason): this {
    this.effects.push({ type: "cancelAttempt", context: this.context, params: { reason } });
    return this;
  }

  exit(state: RequestState): this {
    if (state === "routing") this.act("abandonDispatch");
    if (state === "awaitingFirstByte") this.effects.push({ type: "stopTimer", timer: "firstByteTimeout" });
    if (state === "receiving") this.effects.push({ type: "stopTimer", timer: "streamIdleCheck" });
    return this;
  }

  enter(state: RequestState): RequestState {
    switch (state) {
      case "routing": {
        const c = this.context;
        this.effects.push({ type: "dispatchAttempt", context: c, params: { requestId: c.requestId, attemptN: c.nextAttemptN, excludedProviders: c.excludedProviders } });
        return state;
      }
      case "awaitingFirstByte":
        this.effects.push({ type: "startTimer", timer: "firstByteTimeout" });
        return state;
      case "receiving":
        this.effects.push({ type: "startTimer", timer: "streamIdleCheck" });
        return state;
      case "providerFailedAfterOutput":
        if (this.context.committed) return this.enter("failedMidStream");
        this.act("discardPartialOutput");
        return this.enter("attemptFailed");
      case "attemptFailed": {
        this.act("releaseAttempt");
        const event = this.event;
        this.update((c) => ({
          ...c,
          excludedProviders: c.current ? [...c.excludedProviders, c.current.providerId] : c.excludedProviders,
          lastAttemptFailure: event && (event.type.startsWith("provider.") || event.type.startsWith("stream.")) ? event.type : "first_byte_timeout",
          current: null,
        }));
        if (this.context.nextAttemptN < this.context.maxAttempts) return this.enter("routing");
        this.update(exhausted);
        return this.enter("failed");
      }
      case "succeeded":
        this.act("releaseAttempt").act("finishSuccess");
        return state;
      case "failed":
        this.act("releaseAttempt").act("finishFailure");
        return state;
      case "failedMidStream":
        this.act("releaseAttempt").act("finishMidStreamError");
        return state;
      case "cancelled":
        this.act("releaseAttempt");
        return state;
    }
  }
}

/** The first step: `routing` entered (its dispatch) and the request deadline started. */
export function initialRequestStep(input: RequestInput): RequestStep {
  const t = new Transition(
    {
      ...input,
      nextAttemptN: 0,
      current: null,
      excludedProviders: [],
      committed: false,
      progressInWindow: false,
      idleWindows: 0,
      lengthLimited: false,
      failure: null,
      lastAttemptFailure: null,
    },
    null,
  );
  t.effects.push({ type: "startTimer", timer: "requestDeadline" });
  const value = t.enter("routing");
  return { value, context: t.context, effects: t.effects };
}

/** The transition function of the request chart. Pure: the effects are descriptions, run by `requestLogic`. */
export function requestStep(value: RequestState, context: RequestContext, event: RequestLogicEvent): RequestStep {
  const same: RequestStep = { value, context, effects: [] };
  if (FINAL.has(value)) return same;
  const t = new Transition(context, event);
  /** A transition to `target` (null: targetless; `reenter`: exit and enter the same state). */
  const go = (target: RequestState | null, build: (t: Transition) => void = () => {}): RequestStep => {
    if (target === null) {
      build(t);
      return { value, context: t.context, effects: t.effects };
    }
    t.exit(value);
    build(t);
    return { value: t.enter(target), context: t.context, effects: t.effects };
  };

  // Root transitions, in every state.
  if (event.type === "buyer.aborted") return go("cancelled", (t) => t.cancel("buyer_cancel"));
  if (event.type === "timer.requestDeadline") {
    if (context.committed) return go("failedMidStream", (t) => t.cancel("gateway_timeout"));
    return go("failed", (t) => t.cancel("gateway_timeout").update(exhausted));
  }
  switch (value) {
    case "routing":
      switch (event.type) {
        case "route.failed":
          return go("failed", (t) => t.update((c) => ({ ...c, failure: { code: "internal_error", message: "The gateway hit an internal error. Retry the request." } })));
        case "route.dispatched":
          return go("awaitingFirstByte", (t) => t.update((c) => ({ ...c, current: event.attempt, nextAttemptN: c.nextAttemptN + 1 })));
        case "route.unavailable":
          return go("failed", (t) => t.update((c) => ({ ...c, failure: { code: event.code, message: event.message } })));
        default:
          return same;
      }
    case "awaitingFirstByte":
      switch (event.type) {
        case "timer.firstByteTimeout":
        case "provider.rejected":
          return go("attemptFailed", (t) => t.cancel("gateway_timeout"));
        case "provider.declined":
        case "provider.lost":
          return go("attemptFailed");
        case "provider.chunk": {
          // The first chunk: seq 0, and within max_tokens (the edge's ChunkMeter applies the same rules to later ones).
          if (event.frame.seq !== 0) return go("attemptFailed", (t) => t.cancel("gateway_timeout"));
          if (event.frame.tokens > context.maxTokens) return go("succeeded", (t) => t.cancel("gateway_timeout").update((c) => ({ ...c, lengthLimited: true })));
          const frame = event.frame;
          return go("receiving", (t) => {
            t.update((c) => ({ ...c, committed: c.streaming, progressInWindow: true, idleWindows: 0 }));
            t.effects.push({ type: "relayChunk", context: t.context, params: { frame } });
          });
        }
        case "provider.ended":
          return go(event.frame.terminal_state === "normal_done" ? "succeeded" : "attemptFailed");
        default:
          return same;
      }
    case "receiving":
      switch (event.type) {
        case "timer.streamIdleCheck":
          if (!context.progressInWindow && context.idleWindows + 1 >= STALL_WINDOWS) return go("providerFailedAfterOutput", (t) => t.cancel("gateway_timeout"));
          return go("receiving", (t) =>
            t.update((c) => ({ ...c, idleWindows: c.progressInWindow ? 0 : c.idleWindows + 1, progressInWindow: false })).act("openProgressWindow"),
          );
        case "stream.progress":
          return go(null, (t) => t.update((c) => ({ ...c, progressInWindow: true })));
        case "stream.seqError":
          return go("providerFailedAfterOutput", (t) => t.cancel("gateway_timeout"));
        case "stream.lengthLimited":
          return go("succeeded", (t) => t.cancel("gateway_timeout").update((c) => ({ ...c, lengthLimited: true })));
        case "provider.ended":
          return go(event.frame.terminal_state === "normal_done" ? "succeeded" : "providerFailedAfterOutput");
        case "provider.lost":
          return go("providerFailedAfterOutput");
        default:
          return same;
      }
    default:
      return same;
  }
}

/**
 * The chart of `requestStep`, as data: `@statelyai/inspect` sends an actor's `logic.config` as its
 * definition, and test/actors/request.test.ts checks every step against it.
 */
export const requestChart = {
  id: "request",
  initial: "routing",
  on: { "buyer.aborted": ".cancelled", "timer.requestDeadline": [".failedMidStream", ".failed"] },
  states: {
    routing: { on: { "route.failed": "failed", "route.dispatched": "awaitingFirstByte", "route.unavailable": "failed" } },
    awaitingFirstByte: {
      on: {
        "timer.firstByteTimeout": "attemptFailed",
        "provider.declined": "attemptFailed",
        "provider.rejected": "attemptFailed",
        "provider.lost": "attemptFailed",
        "provider.chunk": ["attemptFailed", "succeeded", "receiving"],
        "provider.ended": ["succeeded", "attemptFailed"],
      },
    },
    receiving: {
      on: {
        "timer.streamIdleCheck": ["providerFailedAfterOutput", "receiving"],
        "stream.progress": {},
        "stream.seqError": "providerFailedAfterOutput",
        "stream.lengthLimited": "succeeded",
        "provider.ended": ["succeeded", "providerFailedAfterOutput"],
        "provider.lost": "providerFailedAfterOutput",
      },
    },
    providerFailedAfterOutput: { always: ["failedMidStream", "attemptFailed"] },
    attemptFailed: { always: ["routing", "failed"] },
    succeeded: { type: "final" },
    failed: { type: "final" },
    failedMidStream: { type: "final" },
    cancelled: { type: "final" },
  },
} as const;

type ActionArgs = { context: RequestContext; event: RequestEvent; self: ActorRef<any, any> };
/** The edge's effects, as `machine.provide({ actions })` took them. */
export interface RequestActions {
  dispatchAttempt: (args: ActionArgs, params: DispatchInput) => void;
  abandonDispatch: (args: ActionArgs) => void;
  relayChunk: (args: ActionArgs, params: { frame: ChunkFrame }) => void;
  openProgressWindow: (args: ActionArgs) => void;
  discardPartialOutput: (args: ActionArgs) => void;
  finishSuccess: (args: ActionArgs) => void;
  finishFailure: (args: ActionArgs) => void;
  finishMidStreamError: (args: ActionArgs) => void;
  cancelAttempt: (args: ActionArgs, params: { reason: CancelReason }) => void;
  releaseAttempt: (args: ActionArgs) => void;
}
export type RequestDelays = Record<RequestTimer, number>;

type Scope = ActorScope<RequestSnapshot, RequestLogicEvent, AnySystem>;

const snapshotOf = (value: RequestState, context: RequestContext): RequestSnapshot =>
  (FINAL.has(value) ? { status: "done", output: undefined, error: undefined, value, context } : { status: "active", output: undefined, error: undefined, value, context }) as RequestSnapshot;

export type RequestLogic = ReturnType<typeof requestLogic>;

/** The request actor's logic with the edge's effects and delays (made once, like `machine.provide`). */
export function requestLogic(actions: Partial<RequestActions>, delays: RequestDelays): ActorLogic<RequestSnapshot, RequestLogicEvent, RequestInput, AnySystem> {
  const timers = selfTimers();
  const run = (effects: RequestEffect[], event: RequestLogicEvent, scope: Scope) => {
    for (const e of effects) {
      if (e.type === "startTimer") timers.start(scope.self, scope.system, e.timer, TIMER_EVENTS[e.timer], delays[e.timer]);
      else if (e.type === "stopTimer") timers.stop(scope.self, scope.system, e.timer);
      else {
        const action = actions[e.type] as ((args: ActionArgs, params?: unknown) => void) | undefined;
        if (!action) continue;
        const args = { context: e.context, event: event as RequestEvent, self: scope.self };
        const params = "params" in e ? e.params : undefined;
        scope.defer(() => action(args, params));
      }
    }
  };
  // The initial step's effects run at start, like a machine's initial entry actions.
  const initial = new WeakMap<RequestSnapshot, RequestEffect[]>();
  return {
    config: requestChart,
    getInitialSnapshot: (_scope, input) => {
      const step = initialRequestStep(input);
      const snapshot = snapshotOf(step.value, step.context);
      initial.set(snapshot, step.effects);
      return snapshot;
    },
    start: (snapshot, scope) => run(initial.get(snapshot) ?? [], { type: "xstate.init" } as unknown as RequestLogicEvent, scope),
    transition: (snapshot, event, scope) => {
      if ((event as EventObject).type === "xstate.stop") {
        timers.stopAll(scope.self, scope.system);
        return snapshot;
      }
      const step = requestStep(snapshot.value, snapshot.context, event);
      if (step.value === snapshot.value && step.context === snapshot.context && step.effects.length === 0) return snapshot;
      run(step.effects, event, scope);
      const next = snapshotOf(step.value, step.context);
      if (next.status === "done") timers.stopAll(scope.self, scope.system);
      return next;
    },
    getPersistedSnapshot: (snapshot) => snapshot,
  };
}
