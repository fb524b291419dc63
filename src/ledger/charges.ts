// Who is charged what for one provider attempt (docs/ledger.md): the settlement's decision, the store's
// guard and the request edge's cancel all ask these pure functions, so the rule has one home.
import type { TerminalState } from "../wire/frames.ts";

/** An attempt's settlement label (docs/receipts.md): `pending` until its first terminal outcome. */
export type SettlementLabel = "pending" | "verified" | "quarantined" | "zero_settled";
/** A settlement's terminal outcome: the first one is final. */
export type FinalLabel = Exclude<SettlementLabel, "pending">;
/** observe: billing follows observed usage; enforce: only verified receipts are charged (docs/ledger.md). */
export type SettlementMode = "observe" | "enforce";
/** Who pays an attempt: a paid buyer's prepaid balance, or the operator's promotion account (free tier, demo). */
export type Payer = "buyer" | "promotion";

/** Billed token counts. */
export interface BilledUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

/**
 * Whether an outcome may carry a charge: in enforce mode only a verified receipt; in observe mode any
 * outcome but zero_settled (an attempt that delivered nothing is never charged).
 */
export function chargeAllowed(label: FinalLabel, mode: SettlementMode): boolean {
  return label === "verified" || (mode === "observe" && label === "quarantined");
}

/**
 * The usage an attempt is billed at, or null when nothing may be charged. Observe mode bills the
 * observed usage whatever the receipt says; enforce mode the verified receipt's billable usage.
 */
export function billedUsage(
  label: FinalLabel,
  mode: SettlementMode,
  usage: { observed: () => BilledUsage; verified: BilledUsage | null },
): BilledUsage | null {
  if (!chargeAllowed(label, mode)) return null;
  return mode === "observe" ? usage.observed() : usage.verified;
}

/**
 * The terminal state an attempt's receipt must name: what the provider's `end` said when it came
 * first, else the reason of the gateway's cancel, else a provider failure (lost socket, no `end`).
 */
export function attemptTerminalState(endState: TerminalState | null, cancelReason: TerminalState | null): TerminalState {
  return endState ?? cancelReason ?? "provider_error";
}

/**
 * Whether a cancel abandons the attempt's output, so that nothing of it may be charged. A
 * non-streaming body is written only on success, and the only cancel on the way to success is the
 * length cap: any other cancel (buyer gone, deadline, stall, bad seq) leaves the buffered output
 * undelivered. A stream's relayed chunks reached the buyer whatever ends it.
 */
export function cancelAbandonsOutput(streaming: boolean, lengthCap: boolean): boolean {
  return !streaming && !lengthCap;
}

/** Who pays a request: a paid account its own balance; free-tier and demo traffic the promotion account. */
export function payerFor(paidAccount: boolean): Payer {
  return paidAccount ? "buyer" : "promotion";
}

/** The ledger account that pays for an account's attempts. */
export function payingAccount(payer: Payer, accountId: string): string {
  return payer === "buyer" ? buyerAccount(accountId) : PROMOTION_ACCOUNT;
}

export const PLATFORM_ACCOUNT = "platform";
export const PROMOTION_ACCOUNT = "promotion";
/** The outside world: where granted credits come from, so every posting still sums to zero. */
export const FUNDING_ACCOUNT = "funding";
export const buyerAccount = (account_id: string) => `buyer:${account_id}`;
export const providerAccount = (provider_id: string) => `provider:${provider_id}`;
