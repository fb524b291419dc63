// What an attempt's end says about its provider, for cooldowns (docs/routing.md, Cooldowns): the
// event that made the request actor let the attempt go, read as success, failure, or no verdict.
import type { AttemptVerdict } from "./routingState.ts";

const SUCCESS: AttemptVerdict = { kind: "success" };
const NO_VERDICT: AttemptVerdict = { kind: "no_verdict" };
const failure = (f: Extract<AttemptVerdict, { kind: "failure" }>["failure"]): AttemptVerdict => ({ kind: "failure", failure: f });

/**
 * `event`: the event that ended the attempt (its type, and a decline's code or an end's terminal state);
 * `lengthLimited`: the request stopped at max_tokens.
 * Timers are matched by name, whether the actor names them `timer.firstByteTimeout` or `xstate.after.firstByteTimeout…`.
 */
export function attemptVerdict(
  event: { type: string; code?: string; frame?: object },
  lengthLimited: boolean,
): AttemptVerdict {
  switch (event.type) {
    case "provider.ended":
      if ((event.frame as { terminal_state?: string } | undefined)?.terminal_state === "normal_done") return SUCCESS;
      return failure("provider_error");
    case "provider.chunk":
    case "stream.lengthLimited":
      // The length cap ends a healthy attempt; a first chunk that is not the cap is a bad seq.
      return lengthLimited || event.type === "stream.lengthLimited" ? SUCCESS : failure("bad_sequence");
    case "stream.seqError":
      return failure("bad_sequence");
    case "provider.declined":
      // A capacity decline says the machine is full, not that it is failing; a context decline is the
      // request's (else one long prompt would cool every provider of the model).
      return event.code === "queue_full" || event.code === "context_exceeded" ? NO_VERDICT : failure("declined");
    case "provider.lost":
      return failure("lost_socket");
    case "provider.rejected":
      return failure("hash_mismatch");
    case "buyer.aborted":
      return NO_VERDICT;
    default:
      if (event.type.includes("firstByteTimeout")) return failure("first_byte_timeout");
      if (event.type.includes("streamIdle")) return failure("stalled");
      // The request deadline, or anything unforeseen: nothing is known about the provider.
      return NO_VERDICT;
  }
}
