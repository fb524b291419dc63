// One buyer request's timing and summary: what the `request_completed` log line and the request
// metrics say (docs/operator.md).
import type { RequestContext, RequestEvent } from "../../actors/request.ts";
import type { FailureCode } from "../chat/contract.ts";
import type { AttemptOutcome, RequestOutcome, RequestSummary } from "../metrics.ts";

/**
 * Per-request timing on the monotonic clock, for ttft/overhead. Provider wait = the sum of intervals
 * from "the gateway sent a job or finished relaying a chunk" to "the next provider-driven step of this
 * request ran" (chunk, end, decline, loss, timeout, cancel). Updated in O(1) per chunk.
 */
export interface RequestTiming {
  arrivedAt: number;
  firstTokenAt: number | null;
  waitingSince: number | null;
  providerWaitMs: number;
  inputTokens: number;
  errorCode: FailureCode | null;
  lastAttemptOutcome: AttemptOutcome | null;
}

export const newTiming = (arrivedAt: number): RequestTiming => ({
  arrivedAt,
  firstTokenAt: null,
  waitingSince: null,
  providerWaitMs: 0,
  inputTokens: 0,
  errorCode: null,
  lastAttemptOutcome: null,
});

/** Closes an open provider-wait interval (a provider-driven step is starting at `at`). */
export function stopWaiting(t: RequestTiming, at: number): void {
  if (t.waitingSince !== null) {
    t.providerWaitMs += at - t.waitingSince;
    t.waitingSince = null;
  }
}

/** How the attempt being released ended, from the event that ended it (see actors/request.ts). */
export function attemptOutcome(event: RequestEvent | { type: string }, context: RequestContext): AttemptOutcome {
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

const OUTCOME_BY_STATE: Record<string, RequestOutcome> = {
  succeeded: "succeeded",
  failed: "failed",
  failedMidStream: "failed_mid_stream",
  cancelled: "cancelled",
};

export interface FinishedRequest {
  requestId: string;
  accountId: string | null;
  route: string;
  model: string;
  stream: boolean;
  /** The actor's final state value. */
  state: string;
  /** Whether a stream committed (its 200 and first delta went out). */
  committed: boolean;
  attempts: number;
  outputTokens: number;
  timing: RequestTiming;
  endedAt: number;
}

/**
 * The request's summary. The status is what the buyer's status line said: streams commit 200 at
 * their first delta; a cancelled request that never answered counts 499; a failure, its code's status.
 */
export function requestSummary(r: FinishedRequest, failureStatus: (code: FailureCode) => number, forced?: RequestOutcome): RequestSummary {
  const t = r.timing;
  const outcome = forced ?? OUTCOME_BY_STATE[r.state] ?? "failed";
  const streamed = r.stream && r.committed;
  let status: number;
  if (outcome === "succeeded") status = 200;
  else if (outcome === "cancelled") status = streamed ? 200 : 499;
  else if (streamed) status = 200;
  else status = failureStatus(t.errorCode ?? "internal_error");
  const totalMs = r.endedAt - t.arrivedAt;
  return {
    requestId: r.requestId,
    accountId: r.accountId,
    route: r.route,
    model: r.model,
    stream: r.stream,
    outcome,
    status,
    errorCode: t.errorCode,
    attempts: r.attempts,
    inputTokens: t.inputTokens,
    outputTokens: r.outputTokens,
    ttftMs: t.firstTokenAt === null ? null : t.firstTokenAt - t.arrivedAt,
    totalMs,
    overheadMs: Math.max(0, totalMs - t.providerWaitMs),
  };
}
