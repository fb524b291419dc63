// actors/settlement.ts — one provider attempt's settlement (DESIGN §4, spec §3.2):
//   running → pending → verified | quarantined | zero_settled
// `running` is the attempt on the wire (buyer-facing label: pending); `pending` waits for a receipt
// until the pending deadline. The machine only sequences: receipts are judged at the edge by the pure
// verifier against the persisted snapshot, and the verdict arrives as an event — a later turn than the
// receipt when its signature is checked off the main thread, so a receipt that came in time holds the
// pending deadline until it arrives (`attempt.ended` says so for a receipt that came with `end`,
// `receipt.arrived` for a later one). The first terminal outcome is final — the machine stops
// there, so a later receipt has nothing to move.
import { assign, setup } from "xstate";

export type SettlementLabel = "pending" | "verified" | "quarantined" | "zero_settled";

export type ReceiptVerdict = { label: "verified" } | { label: "quarantined"; reason: string };

export interface SettlementInput {
  requestId: string;
  attemptN: number;
  /** Restored after a restart with the attempt already ended: wait for a late receipt only. */
  resumedPending: boolean;
  /** How long `pending` waits for a receipt (less what already passed, after a restart). */
  pendingDeadlineMs: number;
}

export interface SettlementContext extends SettlementInput {
  /** A receipt that came with `end` before the machine reached `pending` is judged there. */
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

export const settlementMachine = setup({
  types: {
    context: {} as SettlementContext,
    events: {} as SettlementEvent,
    input: {} as SettlementInput,
  },
  guards: {
    resumedPending: ({ context }) => context.resumedPending,
    deliveredNothing: ({ event }) => event.type === "attempt.ended" && event.deliveredNothing,
    judgedVerified: ({ context }) => context.verdict?.label === "verified",
    judgedQuarantined: ({ context }) => context.verdict?.label === "quarantined",
    noVerdictDue: ({ context }) => !context.verdictDue,
  },
  actions: {
    recordVerdict: assign({
      verdict: ({ event }) => (event.type === "receipt.judged" ? event.verdict : null),
    }),
    recordVerdictDue: assign({
      verdictDue: ({ context, event }) => context.verdictDue || event.type === "receipt.arrived" || (event.type === "attempt.ended" && event.verdictDue),
    }),
    recordQuarantineReason: assign({
      reason: ({ context }) => (context.verdict?.label === "quarantined" ? context.verdict.reason : null),
    }),
    recordNoReceipt: assign({ reason: "no_receipt" }),
    recordRejection: assign({ reason: ({ event }) => (event.type === "attempt.rejected" ? event.reason : null) }),
    recordNothingDelivered: assign({ reason: "nothing_delivered" }),
    // Effects, provided at the edge: one SQLite transaction each (label + ledger posting + reservation),
    // then the `settled` frame to the provider.
    settleVerified: () => {},
    settleQuarantined: () => {},
    settleZero: () => {},
  },
  delays: {
    pendingDeadline: ({ context }) => Math.max(0, context.pendingDeadlineMs),
  },
}).createMachine({
  id: "settlement",
  context: ({ input }) => ({ ...input, verdict: null, verdictDue: false, reason: null }),
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
      always: [
        { guard: "judgedVerified", target: "verified" },
        { guard: "judgedQuarantined", target: "quarantined", actions: "recordQuarantineReason" },
      ],
      after: { pendingDeadline: { guard: "noVerdictDue", target: "quarantined", actions: "recordNoReceipt" } },
      // Targetless: the eventless transitions above are re-checked after it.
      on: { "receipt.arrived": { actions: "recordVerdictDue" }, "receipt.judged": { actions: "recordVerdict" } },
    },
    verified: { type: "final", entry: "settleVerified" },
    quarantined: { type: "final", entry: "settleQuarantined" },
    zero_settled: { type: "final", entry: "settleZero" },
  },
  output: ({ context }) => ({ reason: context.reason }),
});
