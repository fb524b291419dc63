// What an attempt's end says about its provider (src/gateway/attemptVerdict.ts).
import { expect, test } from "bun:test";
import { attemptVerdict } from "../../src/gateway/attemptVerdict.ts";

const ok = { kind: "success" };
const none = { kind: "no_verdict" };
const fail = (failure: string) => ({ kind: "failure", failure });

test.each<[string, Parameters<typeof attemptVerdict>[0], boolean, object]>([
  ["normal end", { type: "provider.ended", frame: { terminal_state: "normal_done" } }, false, ok],
  ["provider error end", { type: "provider.ended", frame: { terminal_state: "provider_error" } }, false, fail("provider_error")],
  ["upstream disconnect end", { type: "provider.ended", frame: { terminal_state: "upstream_transport_disconnect" } }, false, fail("provider_error")],
  ["length cap at a later chunk", { type: "stream.lengthLimited" }, true, ok],
  ["length cap at the first chunk", { type: "provider.chunk" }, true, ok],
  ["bad first chunk", { type: "provider.chunk" }, false, fail("bad_sequence")],
  ["seq error", { type: "stream.seqError" }, false, fail("bad_sequence")],
  ["capacity decline", { type: "provider.declined", code: "queue_full" }, false, none],
  ["context decline (the request's)", { type: "provider.declined", code: "context_exceeded" }, false, none],
  ["other decline", { type: "provider.declined", code: "model_not_loaded" }, false, fail("declined")],
  ["internal decline", { type: "provider.declined", code: "internal" }, false, fail("declined")],
  ["lost socket", { type: "provider.lost" }, false, fail("lost_socket")],
  ["hash refused", { type: "provider.rejected" }, false, fail("hash_mismatch")],
  ["buyer left", { type: "buyer.aborted" }, false, none],
  ["first-byte timeout (timer event)", { type: "timer.firstByteTimeout" }, false, fail("first_byte_timeout")],
  ["first-byte timeout (chart event)", { type: "xstate.after.firstByteTimeout.request.awaitingFirstByte" }, false, fail("first_byte_timeout")],
  ["stall (timer event)", { type: "timer.streamIdleCheck" }, false, fail("stalled")],
  ["stall (chart event)", { type: "xstate.after.streamIdleCheck.request.receiving" }, false, fail("stalled")],
  ["request deadline", { type: "xstate.after.requestDeadline.request" }, false, none],
])("%s", (_, event, lengthLimited, expected) => {
  expect(attemptVerdict(event, lengthLimited)).toEqual(expected as never);
});
