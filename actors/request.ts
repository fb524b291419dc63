// actors/request.ts — one buyer request:
//   routing → awaitingFirstByte(attempt n) → receiving → succeeded | failed | failedMidStream | cancelled
// Failover (back to routing, failed provider excluded) is possible until the first buyer-visible byte;
// a streaming request commits at its first relayed delta, a non-streaming one only when its body is written.
//
// Only an attempt's first chunk is an event here (it changes state: awaitingFirstByte → receiving, and a
// stream commits). Later chunks stay at the edge (src/gateway/chunkMeter.ts checks their seq and the
// max_tokens cap, counts them and relays them), which tells this machine only what changes its state:
// `stream.seqError`, `stream.lengthLimited`, and `stream.progress` at most once per idle-check window.
// A per-chunk event with a re-armed stall timer would dominate the gateway's CPU (docs/benchmarks.md).
//
// Two parts: `requestMachine`, the statechart (the definition: the inspector and the operator console
// draw it, and a change of behaviour starts there), and `requestLogic`, the same chart compiled by hand
// into a pure step function (`requestStep`: next state, context, and the effects in the order the machine
// runs its exit, transition and entry actions), which the gateway runs because XState's interpreter costs
// more per request than the gateway allows (docs/decisions.md, Performance). A lockstep test drives both
// with the same random events and timers and requires identical states, contexts, effects and timers
// (test/actors/request-lockstep.test.ts).
import { assign, setup, type ActorLogic, type ActorRef, type ActorScope, type ActorSystem, type EventObject, type Snapshot } from "xstate";
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
  | { type: "buyer.aborted" }
  /**
   * The cluster node can no longer renew its membership lease (Redis unreachable): the others will
   * take it for dead and stop counting its slots, so its requests end now (docs/scale-out.md, "Fencing").
   */
  | { type: "node.fenced" };

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

// The system type every root actor gets (xstate exports no name for it).
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

/** The events of the chart's delayed transitions (`after`), by delay: the step logic's timers send the same. */
const AFTER = {
  firstByteTimeout: "xstate.after.firstByteTimeout.request.awaitingFirstByte",
  streamIdleCheck: "xstate.after.streamIdleCheck.request.receiving",
  requestDeadline: "xstate.after.requestDeadline.request",
} as const satisfies Record<RequestTimer, string>;
/** The buyer's and the edge's events, and the actor's own timers. */
export type RequestLogicEvent = RequestEvent | { type: (typeof AFTER)[RequestTimer] };
/** Each timer's event, made once (a timer fires often: the idle check every window of a stream). */
const TIMER_EVENTS: Record<RequestTimer, RequestLogicEvent> = {
  firstByteTimeout: { type: AFTER.firstByteTimeout },
  streamIdleCheck: { type: AFTER.streamIdleCheck },
  requestDeadline: { type: AFTER.requestDeadline },
};

export type RequestSnapshot = Snapshot<undefined> & { value: RequestState; context: RequestContext };

type CancelReason = "buyer_cancel" | "gateway_timeout";

/** The edge's actions that take no parameters. */
type PlainAction = "abandonDispatch" | "openProgressWindow" | "discardPartialOutput" | "keepAnswer" | "finishSuccess" | "finishFailure" | "finishMidStreamError" | "releaseAttempt";

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

const initialContext = (input: RequestInput): RequestContext => ({
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
});

// ───────────────────────────── The chart ─────────────────────────────
// The one definition of the request actor's behaviour: what the inspector and the operator console draw,
// and what `requestLogic` below implements step for step (test/actors/request-lockstep.test.ts). A change
// of behaviour starts here.

/** The idle watchdog: this window saw no chunk, and the ones before it make STALL_WINDOWS. */
const stalled = (c: RequestContext) => !c.progressInWindow && c.idleWindows + 1 >= STALL_WINDOWS;
const DISPATCH_ERROR = { code: "internal_error", message: "The gateway hit an internal error. Retry the request." } as const;
const ATTEMPTS_EXHAUSTED = { code: "coordinator_unavailable", message: "No provider could serve this request right now. Retry shortly." } as const;
const FENCED = { code: "coordinator_unavailable", message: "The gateway node serving this request lost contact with its cluster. Retry the request." } as const;
/** What a failed attempt is remembered by: the provider's or the stream's event, or the first-byte timer. */
const attemptFailureOf = (eventType: string): string =>
  eventType.startsWith("provider.") || eventType.startsWith("stream.") ? eventType : "first_byte_timeout";

export const requestMachine = setup({
  types: {
    context: {} as RequestContext,
    events: {} as RequestEvent,
    input: {} as RequestInput,
  },
  guards: {
    mayRetry: ({ context }) => context.nextAttemptN < context.maxAttempts,
    endedNormally: ({ event }) => event.type === "provider.ended" && event.frame.terminal_state === "normal_done",
    committed: ({ context }) => context.committed,
    // The first chunk of an attempt: seq 0, and within max_tokens (the edge's ChunkMeter applies the
    // same two rules, in the same order, to every later chunk).
    seqOutOfOrder: ({ event }) => event.type === "provider.chunk" && event.frame.seq !== 0,
    exceedsMaxTokens: ({ context, event }) => event.type === "provider.chunk" && event.frame.tokens > context.maxTokens,
    stalled: ({ context }) => stalled(context),
  },
  actions: {
    // Effects, provided at the edge (src/gateway/requests.ts) with `.provide({ actions })`.
    /** Picks a provider and sends it the job; the edge answers with route.dispatched, route.unavailable or route.failed. */
    dispatchAttempt: (_, _params: DispatchInput) => {},
    /** Leaving `routing` before the edge answered (buyer gone, deadline): the job must not leave. */
    abandonDispatch: () => {},
    /** Relays the attempt's first chunk (and starts the edge's count of the attempt). */
    relayChunk: (_, _params: { frame: ChunkFrame }) => {},
    /** Lets the edge report the next chunk as progress: a new idle-check window starts. */
    openProgressWindow: () => {},
    discardPartialOutput: () => {},
    /** The answer is final: the edge builds it and keeps it for retries before its delivery is recorded. */
    keepAnswer: () => {},
    finishSuccess: () => {},
    finishFailure: () => {},
    finishMidStreamError: () => {},
    cancelAttempt: (_, _params: { reason: CancelReason }) => {},
    releaseAttempt: () => {},

    // Context updates.
    recordDispatch: assign(({ context, event }) => (event.type === "route.dispatched" ? { current: event.attempt, nextAttemptN: context.nextAttemptN + 1 } : {})),
    recordUnavailable: assign(({ event }) => (event.type === "route.unavailable" ? { failure: { code: event.code, message: event.message } } : {})),
    recordDispatchError: assign({ failure: DISPATCH_ERROR }),
    // The first chunk is relayed: a stream commits, and the first idle-check window has seen a chunk.
    recordFirstChunk: assign(({ context }) => ({ committed: context.streaming, progressInWindow: true, idleWindows: 0 })),
    recordProgress: assign({ progressInWindow: true }),
    closeIdleWindow: assign(({ context }) => ({ idleWindows: context.progressInWindow ? 0 : context.idleWindows + 1, progressInWindow: false })),
    markLengthLimited: assign({ lengthLimited: true }),
    excludeCurrentProvider: assign(({ context, event }) => ({
      excludedProviders: context.current ? [...context.excludedProviders, context.current.providerId] : context.excludedProviders,
      lastAttemptFailure: attemptFailureOf(event.type),
      current: null,
    })),
    recordAttemptsExhausted: assign(({ context }) => ({ failure: context.failure ?? ATTEMPTS_EXHAUSTED })),
    recordFenced: assign({ failure: FENCED }),
  },
  // Defaults; the edge provides the configured ones (streamIdleCheck = streamIdleCheckMs(stall limit)).
  delays: {
    firstByteTimeout: 30_000,
    streamIdleCheck: 30_000,
    requestDeadline: 300_000,
  },
}).createMachine({
  id: "request",
  context: ({ input }) => initialContext(input),
  initial: "routing",
  after: {
    requestDeadline: [
      { guard: "committed", target: ".failedMidStream", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
      { target: ".failed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "recordAttemptsExhausted"] },
    ],
  },
  on: {
    "buyer.aborted": { target: ".cancelled", actions: [{ type: "cancelAttempt", params: { reason: "buyer_cancel" } }] },
    "node.fenced": [
      { guard: "committed", target: ".failedMidStream", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
      { target: ".failed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "recordFenced"] },
    ],
  },
  states: {
    routing: {
      entry: {
        type: "dispatchAttempt",
        params: ({ context }) => ({ requestId: context.requestId, attemptN: context.nextAttemptN, excludedProviders: context.excludedProviders }),
      },
      exit: "abandonDispatch",
      on: {
        "route.failed": { target: "failed", actions: "recordDispatchError" },
        "route.dispatched": { target: "awaitingFirstByte", actions: "recordDispatch" },
        "route.unavailable": { target: "failed", actions: "recordUnavailable" },
      },
    },
    awaitingFirstByte: {
      after: {
        firstByteTimeout: { target: "attemptFailed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
      },
      on: {
        "provider.rejected": { target: "attemptFailed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
        "provider.declined": "attemptFailed",
        "provider.lost": "attemptFailed",
        "provider.chunk": [
          { guard: "seqOutOfOrder", target: "attemptFailed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
          { guard: "exceedsMaxTokens", target: "succeeded", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "markLengthLimited"] },
          {
            target: "receiving",
            actions: ["recordFirstChunk", { type: "relayChunk", params: ({ event }) => ({ frame: (event as Extract<RequestEvent, { type: "provider.chunk" }>).frame }) }],
          },
        ],
        "provider.ended": [{ guard: "endedNormally", target: "succeeded" }, { target: "attemptFailed" }],
      },
    },
    receiving: {
      // The idle watchdog: one timer per window, not one re-armed per chunk. A chunk in a window counts
      // for that window; the stall is declared at the end of the second window in a row without one.
      after: {
        streamIdleCheck: [
          { guard: "stalled", target: "providerFailedAfterOutput", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
          { target: "receiving", reenter: true, actions: ["closeIdleWindow", "openProgressWindow"] },
        ],
      },
      on: {
        "stream.progress": { actions: "recordProgress" },
        "stream.seqError": { target: "providerFailedAfterOutput", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
        "stream.lengthLimited": { target: "succeeded", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "markLengthLimited"] },
        "provider.ended": [{ guard: "endedNormally", target: "succeeded" }, { target: "providerFailedAfterOutput" }],
        "provider.lost": "providerFailedAfterOutput",
      },
    },
    // After output: a committed stream cannot fail over; a non-streaming body is discarded and retried.
    providerFailedAfterOutput: {
      always: [{ guard: "committed", target: "failedMidStream" }, { target: "attemptFailed", actions: "discardPartialOutput" }],
    },
    attemptFailed: {
      entry: ["releaseAttempt", "excludeCurrentProvider"],
      always: [{ guard: "mayRetry", target: "routing" }, { target: "failed", actions: "recordAttemptsExhausted" }],
    },
    succeeded: { type: "final", entry: ["keepAnswer", "releaseAttempt", "finishSuccess"] },
    failed: { type: "final", entry: ["releaseAttempt", "finishFailure"] },
    failedMidStream: { type: "final", entry: ["releaseAttempt", "finishMidStreamError"] },
    cancelled: { type: "final", entry: ["releaseAttempt"] },
  },
});

export type RequestMachine = typeof requestMachine;

// ─────────────────── The chart compiled by hand (the gateway's hot path) ───────────────────

const exhausted = (c: RequestContext): RequestContext => ({ ...c, failure: c.failure ?? ATTEMPTS_EXHAUSTED });

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
          lastAttemptFailure: attemptFailureOf(event?.type ?? ""),
          current: null,
        }));
        if (this.context.nextAttemptN < this.context.maxAttempts) return this.enter("routing");
        this.update(exhausted);
        return this.enter("failed");
      }
      case "succeeded":
        this.act("keepAnswer").act("releaseAttempt").act("finishSuccess");
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
  const t = new Transition(initialContext(input), null);
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
  if (event.type === "node.fenced") {
    if (context.committed) return go("failedMidStream", (t) => t.cancel("gateway_timeout"));
    return go("failed", (t) => t.cancel("gateway_timeout").update((c) => ({ ...c, failure: FENCED })));
  }
  if (event.type === AFTER.requestDeadline) {
    if (context.committed) return go("failedMidStream", (t) => t.cancel("gateway_timeout"));
    return go("failed", (t) => t.cancel("gateway_timeout").update(exhausted));
  }
  switch (value) {
    case "routing":
      switch (event.type) {
        case "route.failed":
          return go("failed", (t) => t.update((c) => ({ ...c, failure: DISPATCH_ERROR })));
        case "route.dispatched":
          return go("awaitingFirstByte", (t) => t.update((c) => ({ ...c, current: event.attempt, nextAttemptN: c.nextAttemptN + 1 })));
        case "route.unavailable":
          return go("failed", (t) => t.update((c) => ({ ...c, failure: { code: event.code, message: event.message } })));
        default:
          return same;
      }
    case "awaitingFirstByte":
      switch (event.type) {
        case AFTER.firstByteTimeout:
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
        case AFTER.streamIdleCheck:
          if (stalled(context)) return go("providerFailedAfterOutput", (t) => t.cancel("gateway_timeout"));
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


type ActionArgs = { context: RequestContext; event: RequestEvent; self: ActorRef<any, any> };
/** The edge's effects, as `machine.provide({ actions })` took them. */
export interface RequestActions {
  dispatchAttempt: (args: ActionArgs, params: DispatchInput) => void;
  abandonDispatch: (args: ActionArgs) => void;
  relayChunk: (args: ActionArgs, params: { frame: ChunkFrame }) => void;
  openProgressWindow: (args: ActionArgs) => void;
  discardPartialOutput: (args: ActionArgs) => void;
  keepAnswer: (args: ActionArgs) => void;
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

/**
 * The request actor's logic with the edge's effects and delays (made once, like `machine.provide`). Its
 * `config` is the machine's, so the inspector draws `requestMachine` for these actors and names them `request`.
 */
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
    config: requestMachine.config,
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

/** The statechart with the edge's effects and delays, as `requestLogic` takes them (tests and tools run it). */
export const providedRequestMachine = (actions: Partial<RequestActions>, delays: RequestDelays) =>
  requestMachine.provide({ actions: actions as never, delays });
