// EXPERIMENT (issue 7, not for merging as is): the request actor's chart as its own XState actor logic,
// to measure what the machine interpreter costs on the request path. Same states, events, guards,
// actions (called with the same arguments) and delays as actors/request.ts.
import type { ActorLogic, ActorScope, ActorSystem, Snapshot } from "xstate";
import type { ChunkFrame } from "../src/wire/frames.ts";
import type { DispatchInput, RequestContext, RequestEvent, RequestInput } from "./request.ts";

type AnySystem = ActorSystem<any>;
type State =
  | "routing"
  | "awaitingFirstByte"
  | "receiving"
  | "providerFailedAfterOutput"
  | "attemptFailed"
  | "succeeded"
  | "failed"
  | "failedMidStream"
  | "cancelled";
const FINAL = new Set<State>(["succeeded", "failed", "failedMidStream", "cancelled"]);

type InternalEvent = RequestEvent | { type: "timer.firstByte" } | { type: "timer.idleCheck" } | { type: "timer.deadline" };
export type RequestSnapshot = Snapshot<undefined> & { value: State; context: RequestContext };

type ActionArgs = { context: RequestContext; event: RequestEvent; self: any };
export interface RequestActions {
  dispatchAttempt: (args: ActionArgs, params: DispatchInput) => void;
  abandonDispatch: (args: ActionArgs) => void;
  relayChunk: (args: ActionArgs, params: { frame: ChunkFrame }) => void;
  openProgressWindow: (args: ActionArgs) => void;
  discardPartialOutput: (args: ActionArgs) => void;
  finishSuccess: (args: ActionArgs) => void;
  finishFailure: (args: ActionArgs) => void;
  finishMidStreamError: (args: ActionArgs) => void;
  cancelAttempt: (args: ActionArgs, params: { reason: "buyer_cancel" | "gateway_timeout" }) => void;
  releaseAttempt: (args: ActionArgs) => void;
}
export interface RequestDelays {
  firstByteTimeout: number;
  streamIdleCheck: number;
  requestDeadline: number;
}

type Scope = ActorScope<RequestSnapshot, InternalEvent, AnySystem>;

export function requestLogic(given: Partial<RequestActions>, delays: RequestDelays): ActorLogic<RequestSnapshot, InternalEvent, RequestInput, AnySystem> {
  const STALL_WINDOWS = 2;
  const noop = () => {};
  const names = ["dispatchAttempt", "abandonDispatch", "relayChunk", "openProgressWindow", "discardPartialOutput", "finishSuccess", "finishFailure", "finishMidStreamError", "cancelAttempt", "releaseAttempt"] as const;
  const actions = Object.fromEntries(names.map((n) => [n, (args: any, params: any) => (given[n] ?? noop)(args, params)])) as unknown as RequestActions;
  function run(scope: Scope, initial: RequestContext, value0: State, event: InternalEvent, target: State | null, transitionActions: ((c: RequestContext) => RequestContext | void)[]): { value: State; context: RequestContext } {
    let context = initial;
    const ev = event as RequestEvent;
    const act = (f: (c: RequestContext) => RequestContext | void) => {
      const r = f(context);
      if (r) context = r;
    };
    const call = (f: (c: RequestContext) => void) => {
      const c = context;
      scope.defer(() => f(c));
    };
    const exit = (s: State) => {
      if (s === "routing") call((c) => actions.abandonDispatch({ context: c, event: ev, self: scope.self }));
      if (s === "awaitingFirstByte") scope.system.scheduler.cancel(scope.self, "firstByte");
      if (s === "receiving") scope.system.scheduler.cancel(scope.self, "idleCheck");
    };
    const enter = (s: State): State => {
      switch (s) {
        case "routing":
          call((c) => actions.dispatchAttempt({ context: c, event: ev, self: scope.self }, { requestId: c.requestId, attemptN: c.nextAttemptN, excludedProviders: c.excludedProviders }));
          return s;
        case "awaitingFirstByte":
          scope.system.scheduler.schedule(scope.self, scope.self, { type: "timer.firstByte" }, delays.firstByteTimeout, "firstByte");
          return s;
        case "receiving":
          scope.system.scheduler.schedule(scope.self, scope.self, { type: "timer.idleCheck" }, delays.streamIdleCheck, "idleCheck");
          return s;
        case "providerFailedAfterOutput":
          if (context.committed) return enter("failedMidStream");
          call((c) => actions.discardPartialOutput({ context: c, event: ev, self: scope.self }));
          return enter("attemptFailed");
        case "attemptFailed":
          call((c) => actions.releaseAttempt({ context: c, event: ev, self: scope.self }));
          act((c) => ({
            ...c,
            excludedProviders: c.current ? [...c.excludedProviders, c.current.providerId] : c.excludedProviders,
            lastAttemptFailure: ev.type.startsWith("provider.") || ev.type.startsWith("stream.") ? ev.type : "first_byte_timeout",
            current: null,
          }));
          if (context.nextAttemptN < context.maxAttempts) return enter("routing");
          act((c) => ({ ...c, failure: c.failure ?? { code: "coordinator_unavailable", message: "No provider could serve this request right now. Retry shortly." } }));
          return enter("failed");
        case "succeeded":
          call((c) => actions.releaseAttempt({ context: c, event: ev, self: scope.self }));
          call((c) => actions.finishSuccess({ context: c, event: ev, self: scope.self }));
          return s;
        case "failed":
          call((c) => actions.releaseAttempt({ context: c, event: ev, self: scope.self }));
          call((c) => actions.finishFailure({ context: c, event: ev, self: scope.self }));
          return s;
        case "failedMidStream":
          call((c) => actions.releaseAttempt({ context: c, event: ev, self: scope.self }));
          call((c) => actions.finishMidStreamError({ context: c, event: ev, self: scope.self }));
          return s;
        case "cancelled":
          call((c) => actions.releaseAttempt({ context: c, event: ev, self: scope.self }));
          return s;
      }
    };
    if (target === null) {
      for (const f of transitionActions) act(f);
      return { value: value0, context };
    }
    exit(value0);
    for (const f of transitionActions) act(f);
    return { value: enter(target), context };
  }
  const cancel = (reason: "buyer_cancel" | "gateway_timeout", scope: Scope, event: InternalEvent) => (c: RequestContext) => {
    scope.defer(() => actions.cancelAttempt({ context: c, event: event as RequestEvent, self: scope.self }, { reason }));
  };
  const snap = (value: State, context: RequestContext): RequestSnapshot =>
    FINAL.has(value)
      ? ({ status: "done", output: undefined, error: undefined, value, context } as RequestSnapshot)
      : ({ status: "active", output: undefined, error: undefined, value, context } as RequestSnapshot);

  return {
    config: { id: "request" },
    getInitialSnapshot: (_scope, input) =>
      snap("routing", {
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
      }),
    start: (snapshot, scope) => {
      scope.system.scheduler.schedule(scope.self, scope.self, { type: "timer.deadline" }, delays.requestDeadline, "deadline");
      const ev = { type: "xstate.init" } as unknown as RequestEvent;
      const c = snapshot.context;
      scope.defer(() => actions.dispatchAttempt({ context: c, event: ev, self: scope.self }, { requestId: c.requestId, attemptN: c.nextAttemptN, excludedProviders: c.excludedProviders }));
    },
    transition: (snapshot, event, scope) => {
      const { value, context } = snapshot;
      if (FINAL.has(value)) return snapshot;
      const go = (target: State | null, ...fs: ((c: RequestContext) => RequestContext | void)[]) => {
        const next = run(scope, context, value, event, target, fs);
        return snap(next.value, next.context);
      };
      if (event.type === "buyer.aborted") return go("cancelled", cancel("buyer_cancel", scope, event));
      if (event.type === "timer.deadline") {
        if (context.committed) return go("failedMidStream", cancel("gateway_timeout", scope, event));
        return go("failed", cancel("gateway_timeout", scope, event), (c) => ({ ...c, failure: c.failure ?? { code: "coordinator_unavailable", message: "No provider could serve this request right now. Retry shortly." } }));
      }
      switch (value) {
        case "routing":
          if (event.type === "route.failed") return go("failed", (c) => ({ ...c, failure: { code: "internal_error", message: "The gateway hit an internal error. Retry the request." } }));
          if (event.type === "route.dispatched") return go("awaitingFirstByte", (c) => ({ ...c, current: event.attempt, nextAttemptN: c.nextAttemptN + 1 }));
          if (event.type === "route.unavailable") return go("failed", (c) => ({ ...c, failure: { code: event.code, message: event.message } }));
          return snapshot;
        case "awaitingFirstByte":
          if (event.type === "timer.firstByte") return go("attemptFailed", cancel("gateway_timeout", scope, event));
          if (event.type === "provider.declined" || event.type === "provider.lost") return go("attemptFailed");
          if (event.type === "provider.rejected") return go("attemptFailed", cancel("gateway_timeout", scope, event));
          if (event.type === "provider.chunk") {
            if (event.frame.seq !== 0) return go("attemptFailed", cancel("gateway_timeout", scope, event));
            if (event.frame.tokens > context.maxTokens) return go("succeeded", cancel("gateway_timeout", scope, event), (c) => ({ ...c, lengthLimited: true }));
            return go(
              "receiving",
              (c) => ({ ...c, committed: c.streaming, progressInWindow: true, idleWindows: 0 }),
              (c) => void scope.defer(() => actions.relayChunk({ context: c, event }, { frame: event.frame })),
            );
          }
          if (event.type === "provider.ended") return go(event.frame.terminal_state === "normal_done" ? "succeeded" : "attemptFailed");
          return snapshot;
        case "receiving":
          if (event.type === "timer.idleCheck") {
            if (!context.progressInWindow && context.idleWindows + 1 >= STALL_WINDOWS) return go("providerFailedAfterOutput", cancel("gateway_timeout", scope, event));
            return go(
              "receiving",
              (c) => ({ ...c, idleWindows: c.progressInWindow ? 0 : c.idleWindows + 1, progressInWindow: false }),
              (c) => void scope.defer(() => actions.openProgressWindow({ context: c, event: event as unknown as RequestEvent, self: scope.self })),
            );
          }
          if (event.type === "stream.progress") return go(null, (c) => ({ ...c, progressInWindow: true }));
          if (event.type === "stream.seqError") return go("providerFailedAfterOutput", cancel("gateway_timeout", scope, event));
          if (event.type === "stream.lengthLimited") return go("succeeded", cancel("gateway_timeout", scope, event), (c) => ({ ...c, lengthLimited: true }));
          if (event.type === "provider.ended") return go(event.frame.terminal_state === "normal_done" ? "succeeded" : "providerFailedAfterOutput");
          if (event.type === "provider.lost") return go("providerFailedAfterOutput");
          return snapshot;
        default:
          return snapshot;
      }
    },
    getPersistedSnapshot: (snapshot) => snapshot,
  };
}
