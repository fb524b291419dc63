// The request and settlement actors' own timers (actors/selfTimers.ts): on the system's clock, and
// none outlives its actor — not at a final state, not at a stop — since XState's stop cancels only
// what its own scheduler holds.
import { describe, expect, test } from "bun:test";
import { createActor, SimulatedClock, type EventObject } from "xstate";
import { requestLogic } from "../../actors/request.ts";
import { settlementLogic } from "../../actors/settlement.ts";
import { selfTimers } from "../../actors/selfTimers.ts";
import type { ChunkFrame, EndFrame } from "../../src/wire/frames.ts";

/** A SimulatedClock that counts the timeouts set and not yet fired or cleared. */
function countingClock() {
  const clock = new SimulatedClock();
  const live = new Set<unknown>();
  return {
    live,
    increment: (ms: number) => clock.increment(ms),
    setTimeout(fn: (...args: unknown[]) => void, ms: number) {
      const id: unknown = clock.setTimeout(() => {
        live.delete(id);
        fn();
      }, ms);
      live.add(id);
      return id;
    },
    clearTimeout(id: unknown) {
      live.delete(id);
      clock.clearTimeout(id as number);
    },
  };
}

const DELAYS = { firstByteTimeout: 1_000, streamIdleCheck: 500, requestDeadline: 10_000 };
const attempt = { attemptN: 0, sessionId: "s", providerId: "p" };
const chunk = { type: "chunk", request_id: "r", attempt_n: 0, seq: 0, content: "x", tokens: 1 } as unknown as ChunkFrame;
const end = {
  type: "end",
  request_id: "r",
  attempt_n: 0,
  terminal_state: "normal_done",
  finish_reason: "stop",
  usage: { input_tokens: 1, output_tokens: 1 },
} as unknown as EndFrame;

function startRequest() {
  const clock = countingClock();
  const actor = createActor(requestLogic({}, DELAYS), { input: { requestId: "r", streaming: true, maxTokens: 16, maxAttempts: 1 }, clock }).start();
  actor.send({ type: "route.dispatched", attempt });
  return { clock, actor };
}

function startSettlement() {
  const clock = countingClock();
  const settled: string[] = [];
  const actor = createActor(settlementLogic({ settle: (label) => void settled.push(label) }), {
    input: { requestId: "r", attemptN: 0, resumedPending: false, pendingDeadlineMs: 300_000 },
    clock,
  }).start();
  return { clock, actor, settled };
}

describe("an actor's own timers", () => {
  test("a request that ends leaves no timer running", () => {
    const { clock, actor } = startRequest();
    expect(clock.live.size).toBeGreaterThan(0); // the first-byte timeout and the deadline
    actor.send({ type: "provider.chunk", frame: chunk });
    actor.send({ type: "provider.ended", frame: end });
    expect(actor.getSnapshot().status).toBe("done");
    expect(clock.live.size).toBe(0);
  });

  test("a request stopped mid-stream leaves no timer running", () => {
    const { clock, actor } = startRequest();
    actor.send({ type: "provider.chunk", frame: chunk });
    expect(clock.live.size).toBeGreaterThan(0);
    actor.stop();
    expect(clock.live.size).toBe(0);
  });

  test("the stream's idle check re-arms on the clock: one timer of its id at a time", () => {
    const { clock, actor } = startRequest();
    actor.send({ type: "provider.chunk", frame: chunk });
    const running = clock.live.size;
    for (let i = 0; i < 5; i++) {
      clock.increment(DELAYS.streamIdleCheck - 1);
      actor.send({ type: "provider.chunk", frame: { ...chunk, seq: i + 1 } });
    }
    expect(clock.live.size).toBe(running);
    expect(actor.getSnapshot().status).toBe("active");
  });

  test("a settlement's pending deadline goes with its final state, or with a stop", () => {
    const settled = startSettlement();
    settled.actor.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: false });
    expect(settled.actor.getSnapshot().value).toBe("pending");
    expect(settled.clock.live.size).toBe(1);
    settled.actor.send({ type: "receipt.judged", verdict: { label: "verified" } });
    expect(settled.settled).toEqual(["verified"]);
    expect(settled.clock.live.size).toBe(0);

    const stopped = startSettlement();
    stopped.actor.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: false });
    expect(stopped.clock.live.size).toBe(1);
    stopped.actor.stop();
    expect(stopped.clock.live.size).toBe(0);
    stopped.clock.increment(300_000);
    expect(stopped.settled).toEqual([]);
  });

  test("a timer started again replaces the running one; a fired one sends its event once", () => {
    const clock = countingClock();
    const events: string[] = [];
    const self = { send: (e: EventObject) => events.push(e.type) } as never;
    const system = { _clock: clock } as never;
    const timers = selfTimers();
    timers.start(self, system, "t", { type: "first" }, 100);
    timers.start(self, system, "t", { type: "second" }, 100);
    expect(clock.live.size).toBe(1);
    clock.increment(100);
    expect(events).toEqual(["second"]);
    expect(clock.live.size).toBe(0);
    timers.stop(self, system, "t"); // fired already: nothing to stop
    timers.stopAll(self, system);
    expect(events).toEqual(["second"]);
  });
});
