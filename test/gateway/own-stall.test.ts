// A provider session's heartbeat watchdog against a stall of the gateway's own process
// (src/gateway/stallWatch.ts; docs/protocol.md, "Gateway side"): heartbeats sent while the process stood
// still wait unread in the socket, so a window the process spent standing still starts again — whichever
// of the watchdog and the stall watch's own tick runs first on waking (the two orders a woken event loop
// may run its overdue timers in). A process that ran all along (a cluster node fenced by a Redis split
// included) closes a silent session after exactly 3 intervals, as before.
import { describe, expect, test } from "bun:test";
import { createActor, fromPromise, SimulatedClock, waitFor } from "xstate";
import { providerSessionMachine, type AdmissionInput, type AdmissionVerdict } from "../../actors/providerSession.ts";
import { watchStalls } from "../../src/gateway/stallWatch.ts";
import type { HelloFrame } from "../../src/wire/frames.ts";

const INTERVAL_MS = 1000;
const WINDOW_MS = 3 * INTERVAL_MS;

const hello: HelloFrame = {
  type: "hello",
  protocol: 1,
  provider_id: "prov-1",
  receipt_public_key: new Uint8Array(32).fill(1),
  runtime: { name: "test", version: "0" },
  hardware: { ram_gb: 16 },
  max_concurrency: 2,
  models: [{ model_id: "m1", model_hash: "a".repeat(64), max_context_tokens: 4096 }],
};

/**
 * An admitted session whose watchdog asks a stall watch, on one monotonic time `at`. The session's
 * timers run when `timers()` is called, the watch's tick when `tick()` is: a test picks their order.
 */
async function admittedSession() {
  let at = 0;
  let tickFn: (() => void) | null = null;
  const stalls = watchStalls({
    thresholdMs: INTERVAL_MS,
    monotonic: () => at,
    setInterval: (run) => (tickFn = run),
    clearInterval: () => (tickFn = null),
  });
  const clock = new SimulatedClock();
  const closes: string[] = [];
  const machine = providerSessionMachine.provide({
    actors: { admitProvider: fromPromise<AdmissionVerdict, AdmissionInput>(async () => ({ admitted: true, tier: "pinned" })) },
    actions: { closeSocket: (_, { reason }) => void closes.push(reason) },
    guards: { gatewayStoodStill: ({ context }) => stalls.stoodStillWithin(3 * context.heartbeatIntervalMs) },
  });
  const actor = createActor(machine, { input: { sessionId: "s1", nonce: new Uint8Array(32), heartbeatIntervalMs: INTERVAL_MS }, clock }).start();
  actor.send({ type: "provider.hello", frame: hello });
  actor.send({ type: "provider.auth", signature: new Uint8Array(64) });
  await waitFor(actor, (s) => s.matches("admitted"));
  const tick = () => tickFn!();
  const timers = () => clock.set(at);
  return {
    closes,
    admitted: () => actor.getSnapshot().matches("admitted"),
    /** The process runs for `ms`: its timers and the watch's ticks fire on time (every quarter interval). */
    run(ms: number) {
      for (let left = ms; left > 0; left -= INTERVAL_MS / 4) {
        at += Math.min(INTERVAL_MS / 4, left);
        timers();
        tick();
      }
    },
    /** The process stands still for `ms` (no timer runs), then wakes: overdue timers run in the order given. */
    stall(ms: number, first: "watchdog" | "watch") {
      at += ms;
      if (first === "watchdog") {
        timers();
        tick();
      } else {
        tick();
        timers();
      }
    },
    heartbeat: () => actor.send({ type: "provider.heartbeat", state: "ready", slotsFree: 2, models: hello.models, inFlight: 0 }),
  };
}

describe("a gateway's own stall against its providers' heartbeat windows", () => {
  test("a process that ran all along closes a silent session after exactly 3 intervals (no restart for a fence or anything else)", async () => {
    const s = await admittedSession();
    s.run(WINDOW_MS - INTERVAL_MS / 4);
    expect(s.admitted()).toBe(true);
    s.run(INTERVAL_MS / 4);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });

  test("a lag below one interval is not a stall", async () => {
    const s = await admittedSession();
    s.run(INTERVAL_MS);
    s.stall(INTERVAL_MS * 0.9, "watch");
    s.run(WINDOW_MS - INTERVAL_MS * 1.9);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });

  test.each(["watchdog", "watch"] as const)("woken past the window (%s runs first): the window starts again at the wake", async (first) => {
    const s = await admittedSession();
    s.run(INTERVAL_MS);
    s.stall(2 * WINDOW_MS, first);
    expect(s.closes).toEqual([]);
    expect(s.admitted()).toBe(true);
    // A whole window from the wake; a provider that stays silent is closed at its end.
    s.run(WINDOW_MS - INTERVAL_MS / 4);
    expect(s.closes).toEqual([]);
    s.run(INTERVAL_MS / 4);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });

  test.each(["watchdog", "watch"] as const)("woken just after the window's end (%s runs first): the window starts again too", async (first) => {
    const s = await admittedSession();
    s.run(INTERVAL_MS);
    // The stall began inside the window and ends 1 ms after it: a heartbeat may wait in the socket.
    s.stall(WINDOW_MS - INTERVAL_MS + 1, first);
    expect(s.closes).toEqual([]);
    s.heartbeat();
    s.run(WINDOW_MS - INTERVAL_MS / 4);
    expect(s.closes).toEqual([]);
  });

  test("a stall that ended more than a window ago does not spare the next window", async () => {
    const s = await admittedSession();
    s.stall(2 * INTERVAL_MS, "watch");
    s.run(INTERVAL_MS / 4);
    s.heartbeat();
    s.run(WINDOW_MS);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });
});
