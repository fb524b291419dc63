// actors/settlement.ts — one provider attempt's settlement (docs/receipts.md, docs/ledger.md):
//   running → pending → verified | quarantined | zero_settled
// `running` is the attempt on the wire (buyer-facing label: pending); `pending` waits for a receipt
// until the pending deadline. The actor only sequences: receipts are judged at the edge by the pure
// verifier against the persisted snapshot, and the verdict arrives as an event — a later turn than the
// receipt when its signature is checked off the main thread, so a receipt that came in time holds the
// pending deadline until it arrives (`attempt.ended` says so for a receipt that came with `end`,
// `receipt.arrived` for a later one). The first terminal outcome is final — the actor stops there, so a
// later receipt has nothing to move.
//
// Two parts, as in actors/request.ts: `settlementMachine`, the statechart (the definition the inspector and
// the operator console draw; a change of behaviour starts there), and `settlementLogic`, the same chart
// compiled by hand into a pure step (`settlementStep`) that the gateway runs — XState's interpreter costs
// several times more per attempt (docs/decisions.md, Performance; docs/benchmarks.md). A lockstep test
// keeps the two identical (test/actors/settlement-lockstep.test.ts).
import { assign, setup, type ActorLogic, type ActorScope, type ActorSystem, type EventObject, type Snapshot } from "xstate";
import type { FinalLabel } from "../src/ledger/charges.ts";
import type { ReceiptVerdict } from "../src/receipts/verify.ts";
import { selfTimers } from "./selfTimers.ts";

// The system type every root actor gets (xstate exports no name for it).
type AnySystem = ActorSystem<any>;


/** `running`: the attempt is on the wire; the others are the labels of docs/receipts.md. */
export type SettlementState = "running" | "pending" | FinalLabel;


export interface SettlementInput {
  requestId: string;
  attemptN: number;
  /** Restored after a restart with the attempt already ended: wait for a late receipt only. */
  resumedPending: boolean;
  /** How long `pending` waits for a receipt (less what already passed, after a restart). */
  pendingDeadlineMs: number;
}

export interface SettlementContext extends SettlementInput {
  /** A receipt that came with `end` before the attempt reached `pending` is judged there. */
  verdict: ReceiptVerdict | null;
  /** A receipt came before the deadline and its verdict is on the way: the deadline no longer applies. */
  verdictDue: boolean;
  reason: string | null;
}

export type SettlementEvent =
  /**
   * The attempt is over. `deliveredNothing`: no output byte or tool call reached the buyer.
   * `verdictDue`: its receipt came with `end` and its `receipt.judged` follows in a later turn.
   */
  | { type: "attempt.ended"; deliveredNothing: boolean; verdictDue: boolean }
  /** A receipt came after the attempt ended, before the pending deadline; its `receipt.judged` follows in a later turn. */
  | { type: "receipt.arrived" }
  /** A receipt (in `end` or a late `receipt` frame) was judged against the persisted snapshot. */
  | { type: "receipt.judged"; verdict: ReceiptVerdict }
  /** The gateway itself refused the attempt before relaying a byte (e.g. `accepted.model_hash` ≠ the catalog's). */
  | { type: "attempt.rejected"; reason: string };

/** The pending deadline passed: the chart's delayed transition's event, which the step logic's timer sends too. */
const DEADLINE_EVENT = "xstate.after.pendingDeadline.settlement.pending";
/** The edge's events and the actor's own timer. */
export type SettlementLogicEvent = SettlementEvent | { type: typeof DEADLINE_EVENT };

const initialContext = (input: SettlementInput): SettlementContext => ({ ...input, verdict: null, verdictDue: false, reason: null });

export type SettlementSnapshot = Snapshot<{ reason: string | null }> & { value: SettlementState; context: SettlementContext };

interface Step {
  value: SettlementState;
  context: SettlementContext;
}

const isFinal = (value: SettlementState): value is FinalLabel => value !== "running" && value !== "pending";

/** Entering `pending` settles at once when a verdict is already known (a receipt judged while running). */
function enterPending(context: SettlementContext): Step {
  const verdict = context.verdict;
  if (verdict?.label === "verified") return { value: "verified", context };
  if (verdict?.label === "quarantined") return { value: "quarantined", context: { ...context, reason: verdict.reason } };
  return { value: "pending", context };
}

/** The transition function: the next state and context for an event (the same step when nothing changes). Pure. */
export function settlementStep(value: SettlementState, context: SettlementContext, event: SettlementLogicEvent): Step {
  const same = { value, context };
  switch (value) {
    case "running":
      switch (event.type) {
        case "attempt.ended":
          if (event.deliveredNothing) return { value: "zero_settled", context: { ...context, reason: "nothing_delivered" } };
          return enterPending(event.verdictDue ? { ...context, verdictDue: true } : context);
        // A receipt rides on `end`, so it can be judged before `attempt.ended` (when its signature needs
        // no checking: a verdict is reached without it).
        case "receipt.judged":
          return { value, context: { ...context, verdict: event.verdict } };
        case "attempt.rejected":
          return { value: "quarantined", context: { ...context, reason: event.reason } };
        default:
          return same;
      }
    case "pending":
      switch (event.type) {
        case "receipt.arrived":
          return { value, context: { ...context, verdictDue: true } };
        case "receipt.judged":
          return enterPending({ ...context, verdict: event.verdict });
        case DEADLINE_EVENT:
          return context.verdictDue ? same : { value: "quarantined", context: { ...context, reason: "no_receipt" } };
        default:
          return same;
      }
    default:
      return same;
  }
}

/** What the edge does when an attempt settles: one SQLite transaction, then the `settled` frame. */
export interface SettlementEffects {
  settle: (label: FinalLabel, context: SettlementContext) => void;
}

// ───────────────────────────── The chart ─────────────────────────────

export const settlementMachine = setup({
  types: {
    context: {} as SettlementContext,
    events: {} as SettlementEvent,
    input: {} as SettlementInput,
    output: {} as { reason: string | null },
  },
  guards: {
    resumedPending: ({ context }) => context.resumedPending,
    deliveredNothing: ({ event }) => event.type === "attempt.ended" && event.deliveredNothing,
    judgedVerified: ({ context }) => context.verdict?.label === "verified",
    judgedQuarantined: ({ context }) => context.verdict?.label === "quarantined",
    noVerdictDue: ({ context }) => !context.verdictDue,
  },
  actions: {
    recordVerdict: assign({ verdict: ({ context, event }) => (event.type === "receipt.judged" ? event.verdict : context.verdict) }),
    recordVerdictDue: assign({
      verdictDue: ({ context, event }) => context.verdictDue || event.type === "receipt.arrived" || (event.type === "attempt.ended" && event.verdictDue),
    }),
    recordQuarantineReason: assign({ reason: ({ context }) => (context.verdict?.label === "quarantined" ? context.verdict.reason : null) }),
    recordNoReceipt: assign({ reason: "no_receipt" }),
    recordRejection: assign({ reason: ({ event }) => (event.type === "attempt.rejected" ? event.reason : null) }),
    recordNothingDelivered: assign({ reason: "nothing_delivered" }),
    /** The effect, provided at the edge: one SQLite transaction (label, ledger posting, reservation), then the `settled` frame. */
    settle: (_, _params: { label: FinalLabel }) => {},
  },
  delays: {
    // What is left of the deadline (after a restart, less what already passed).
    pendingDeadline: ({ context }) => Math.max(0, context.pendingDeadlineMs),
  },
}).createMachine({
  id: "settlement",
  context: ({ input }) => initialContext(input),
  // An attempt restored after a restart, already ended, only waits for its receipt.
  initial: "starting",
  states: {
    starting: {
      always: [{ guard: "resumedPending", target: "pending" }, { target: "running" }],
    },
    running: {
      on: {
        "attempt.ended": [
          { guard: "deliveredNothing", target: "zero_settled", actions: "recordNothingDelivered" },
          { target: "pending", actions: "recordVerdictDue" },
        ],
        // A receipt rides on `end`, so it can be judged before `attempt.ended` (when its signature needs
        // no checking: a verdict is reached without it).
        "receipt.judged": { actions: "recordVerdict" },
        "attempt.rejected": { target: "quarantined", actions: "recordRejection" },
      },
    },
    pending: {
      // A verdict reached while running settles on entry; a later one as it arrives.
      always: [
        { guard: "judgedVerified", target: "verified" },
        { guard: "judgedQuarantined", target: "quarantined", actions: "recordQuarantineReason" },
      ],
      // A receipt that came in time holds the deadline until its verdict arrives.
      after: { pendingDeadline: { guard: "noVerdictDue", target: "quarantined", actions: "recordNoReceipt" } },
      on: { "receipt.arrived": { actions: "recordVerdictDue" }, "receipt.judged": { actions: "recordVerdict" } },
    },
    verified: { type: "final", entry: { type: "settle", params: { label: "verified" } } },
    quarantined: { type: "final", entry: { type: "settle", params: { label: "quarantined" } } },
    zero_settled: { type: "final", entry: { type: "settle", params: { label: "zero_settled" } } },
  },
  output: ({ context }) => ({ reason: context.reason }),
});

export type SettlementMachine = typeof settlementMachine;

// ─────────────────── The chart compiled by hand (the gateway's hot path) ───────────────────

const DEADLINE_ID = "pendingDeadline";
const DEADLINE: SettlementLogicEvent = { type: DEADLINE_EVENT };

function snapshotOf(step: Step): SettlementSnapshot {
  return isFinal(step.value)
    ? { status: "done", output: { reason: step.context.reason }, error: undefined, value: step.value, context: step.context }
    : { status: "active", output: undefined, error: undefined, value: step.value, context: step.context };
}

type Scope = ActorScope<SettlementSnapshot, SettlementLogicEvent, AnySystem>;

const timers = selfTimers();

function scheduleDeadline(scope: Scope, context: SettlementContext): void {
  timers.start(scope.self, scope.system, DEADLINE_ID, DEADLINE, Math.max(0, context.pendingDeadlineMs));
}

/**
 * The settlement actor's logic with the edge's effects (made once, like `machine.provide`). Effects
 * run after the step, as a machine's actions would; a final state (or a stop) cancels the deadline. Its
 * `config` is the machine's: the inspector draws `settlementMachine` for these actors.
 */
export function settlementLogic(effects: SettlementEffects): ActorLogic<SettlementSnapshot, SettlementLogicEvent, SettlementInput, AnySystem> {
  return {
    config: settlementMachine.config,
    getInitialSnapshot: (_scope, input) =>
      snapshotOf({ value: input.resumedPending ? "pending" : "running", context: initialContext(input) }),
    start: (snapshot, scope) => {
      if (snapshot.value === "pending") scheduleDeadline(scope, snapshot.context);
    },
    transition: (snapshot, event, scope) => {
      if ((event as EventObject).type === "xstate.stop") {
        timers.stopAll(scope.self, scope.system);
        return snapshot;
      }
      const next = settlementStep(snapshot.value, snapshot.context, event);
      if (next.value === snapshot.value && next.context === snapshot.context) return snapshot;
      const { value, context } = next;
      if (value === "pending" && snapshot.value !== "pending") scope.defer(() => scheduleDeadline(scope, context));
      if (isFinal(value)) {
        timers.stopAll(scope.self, scope.system);
        scope.defer(() => effects.settle(value, context));
      }
      return snapshotOf(next);
    },
    getPersistedSnapshot: (snapshot) => snapshot,
  };
}

/** The statechart with the edge's effect, as `settlementLogic` takes it (tests and tools run it). */
export const providedSettlementMachine = (effects: SettlementEffects) =>
  settlementMachine.provide({ actions: { settle: ({ context }, { label }) => effects.settle(label, context) } });
