// actors/settlement.ts — one provider attempt's settlement (docs/receipts.md):
//   running → pending → verified | quarantined | zero_settled
// `running` is the attempt on the wire (buyer-facing label: pending); `pending` waits for a receipt
// until the pending deadline. The actor only sequences: receipts are judged at the edge by the pure
// verifier against the persisted snapshot, and the verdict arrives as an event — a later turn than the
// receipt when its signature is checked off the main thread, so a receipt that came in time holds the
// pending deadline until it arrives (`attempt.ended` says so for a receipt that came with `end`,
// `receipt.arrived` for a later one). The first terminal outcome is final — the actor stops there, so a
// later receipt has nothing to move.
//
// An XState actor, but with its own logic instead of a `createMachine` statechart (docs/decisions.md,
// issue 7): the machine interpreter cost ~17 µs per attempt in isolation (13–30 µs of gateway CPU per
// request under load), this logic ~2 µs. Its transitions are `settlementStep` (pure); its effects, the
// pending deadline (scheduled on the actor system's clock, so SimulatedClock drives it) and `settle`
// (provided at the edge), run after the step like a machine's actions.
import type { ActorLogic, ActorScope, ActorSystem, EventObject, Snapshot } from "xstate";
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
  | { type: "attempt.rejected"; reason: string }
  /** The pending deadline passed (the actor schedules it for itself on entering `pending`). */
  | { type: "settlement.deadline" };

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
export function settlementStep(value: SettlementState, context: SettlementContext, event: SettlementEvent): Step {
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
        case "settlement.deadline":
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

/**
 * The statechart of `settlementStep`, as data: `@statelyai/inspect` sends an actor's `logic.config` as
 * its definition (and names the actor by its id), and test/actors/settlement.test.ts checks every step
 * against it. An attempt resumed after a restart starts in `pending`.
 */
export const settlementChart = {
  id: "settlement",
  initial: "running",
  states: {
    running: {
      on: {
        "attempt.ended": ["zero_settled", "verified", "quarantined", "pending"],
        "receipt.judged": {},
        "attempt.rejected": "quarantined",
      },
    },
    pending: {
      on: {
        "receipt.arrived": {},
        "receipt.judged": ["verified", "quarantined"],
        "settlement.deadline": "quarantined",
      },
    },
    verified: { type: "final" },
    quarantined: { type: "final" },
    zero_settled: { type: "final" },
  },
} as const;

const DEADLINE_ID = "pendingDeadline";
const DEADLINE: SettlementEvent = { type: "settlement.deadline" };

function snapshotOf(step: Step): SettlementSnapshot {
  return isFinal(step.value)
    ? { status: "done", output: { reason: step.context.reason }, error: undefined, value: step.value, context: step.context }
    : { status: "active", output: undefined, error: undefined, value: step.value, context: step.context };
}

type Scope = ActorScope<SettlementSnapshot, SettlementEvent, AnySystem>;

const timers = selfTimers();

function scheduleDeadline(scope: Scope, context: SettlementContext): void {
  timers.start(scope.self, scope.system, DEADLINE_ID, DEADLINE, Math.max(0, context.pendingDeadlineMs));
}

/**
 * The settlement actor's logic with the edge's effects (made once, like `machine.provide`). Effects
 * run after the step, as a machine's actions would; a final state (or a stop) cancels the deadline.
 */
export function settlementLogic(effects: SettlementEffects): ActorLogic<SettlementSnapshot, SettlementEvent, SettlementInput, AnySystem> {
  return {
    config: settlementChart,
    getInitialSnapshot: (_scope, input) =>
      snapshotOf({ value: input.resumedPending ? "pending" : "running", context: { ...input, verdict: null, verdictDue: false, reason: null } }),
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
