// One open attempt's settlement record at the gateway, and the table of open attempts.
import type { ActorRefFrom } from "xstate";
import type { settlementLogic } from "../../../actors/settlement.ts";
import type { DeliveredPrefix, DeliveredPrefixBuilder, RouteSnapshot } from "../../receipts/index.ts";
import type { BilledUsage } from "../../ledger/charges.ts";
import type { SettleInput } from "../../store/index.ts";
import type { EndFrame, TerminalState } from "../../wire/frames.ts";

export type SettlementLogic = ReturnType<typeof settlementLogic>;

/**
 * What the gateway itself fixed of an attempt when it released it. The tool-call fields feed the
 * output-token bound (docs/receipts.md); a record read back after a restart has no tool-call bytes.
 */
export type DeliveredSummary = Pick<DeliveredPrefix, "output_hash" | "start_byte" | "end_byte" | "tokens" | "terminal_state" | "tool_calls_delivered"> &
  Partial<Pick<DeliveredPrefix, "tool_call_bytes">>;

/** The receipt that was judged for an attempt, for its ledger row. */
export interface JudgedEnvelope {
  envelope: string;
  /**
   * Its row in the arrival log: the id itself when the store answered at once (embedded SQLite), else
   * the write in flight; null when that write failed (the outcome then stores the envelope itself).
   */
  arrivalId: number | null | Promise<number | null>;
  receivedAtMs: number;
  /** The receipt's billable usage, once its judgement came (null when no body could be read). */
  billable: BilledUsage | null;
}

/** What is known of an attempt from dispatch (or restart) until it settles. */
export interface OpenAttempt {
  requestId: string;
  attemptN: number;
  providerId: string;
  /** Raw Ed25519 key the provider's session authenticated with. */
  providerPublicKey: Uint8Array;
  snapshot: RouteSnapshot;
  digest: string;
  builder: DeliveredPrefixBuilder;
  actor: ActorRefFrom<SettlementLogic>;
  acceptedHash: string | null;
  cancelReason: TerminalState | null;
  /** A hedge race's loser (docs/routing.md, Hedging): its zero_settled outcome says hedge_lost. */
  hedgeLost?: boolean;
  /** The provider's `end`, when it came (before or after the gateway released the attempt). */
  end: EndFrame | null;
  /** The gateway's own record of the attempt, fixed when it released the attempt. */
  delivered: DeliveredSummary | null;
  deadlineAtMs: number | null;
  /**
   * The delivered record while `released` has not persisted it yet: when the attempt settles in the
   * same call (it delivered nothing, or its receipt came with `end` and failed a rule checked before
   * the signature), the settlement writes it; otherwise `released` does, as the verdict comes later.
   */
  unwrittenEnd: NonNullable<SettleInput["ended"]> | null;
  /**
   * Writes of the delivered record (and of an outcome carrying it) held until the stream bytes the
   * record covers have left the process (src/gateway/outputSent.ts); null when none are held.
   */
  heldWrites: (() => void)[] | null;
  /** A receipt that arrived before the attempt was released: judged at release. */
  earlyReceipt: string | null;
  /**
   * The provider's `end` came after the gateway's cancel and named another terminal state: the two
   * crossed. Receipts bound to that `end` are not judged; the one bound to the cancel's prefix is.
   */
  crossedEnd: boolean;
  judged: JudgedEnvelope | null;
}

/** Open attempts by `attemptKey(request_id, attempt_n)`. */
export type OpenAttempts = Map<string, OpenAttempt>;
