// The provider session machine in isolation: handshake, admission verdicts, handshake and heartbeat
// timeouts on a SimulatedClock (heartbeats also against a stall of the gateway's own process), and the
// admitted sub-states. Admission is a fake promise the test settles.
import { describe, expect, test } from "bun:test";
import { createActor, fromPromise, SimulatedClock, waitFor } from "xstate";
import { watchStalls } from "../../src/gateway/stallWatch.ts";
import {
  freeSlots,
  providerSessionMachine,
  type AdmissionInput,
  type AdmissionVerdict,
  type ProviderSessionContext,
  type ProviderSessionEvent,
} from "../../actors/providerSession.ts";
import type { HelloFrame, ModelEntry, ProviderState } from "../../src/wire/frames.ts";

const INTERVAL_MS = 1_000;
const HANDSHAKE_MS = 10_000;
const NONCE = new Uint8Array(32).fill(7);
const SIGNATURE = new Uint8Array(64).fill(9);
const MODEL: ModelEntry = { model_id: "m1", model_hash: "a".repeat(64), max_context_tokens: 4096 };

const hello = (maxConcurrency = 2): HelloFrame => ({
  type: "hello",
  protocol: 1,
  provider_id: "prov-1",
  receipt_public_key: new Uint8Array(32).fill(1),
  runtime: { name: "test", version: "0" },
  hardware: { ram_gb: 16 },
  max_concurrency: maxConcurrency,
  models: [MODEL],
});

type Effect = "sendChallenge" | "sendWelcome" | "sendDrain" | "registerAdmitted" | "unregister";
type EffectCall = { action: Effect } | { action: "closeSocket"; code: number; reason: string };

/** A verdict the test hands out when it chooses, so the handshake's asynchrony is explicit. */
function deferredAdmission() {
  const inputs: AdmissionInput[] = [];
  let settle: { resolve: (v: AdmissionVerdict) => void; reject: (e: unknown) => void } | null = null;
  const actor = fromPromise<AdmissionVerdict, AdmissionInput>(({ input }) => {
    inputs.push(input);
    return new Promise<AdmissionVerdict>((resolve, reject) => (settle = { resolve, reject }));
  });
  return {
    actor,
    inputs,
    resolve: (v: AdmissionVerdict) => settle!.resolve(v),
    reject: (e: unknown) => settle!.reject(e),
  };
}

function startSession() {
  const clock = new SimulatedClock();
  const calls: EffectCall[] = [];
  const admission = deferredAdmission();
  const record = (action: Effect) => () => void calls.push({ action });
  const machine = providerSessionMachine.provide({
    actors: { admitProvider: admission.actor },
    actions: {
      sendChallenge: record("sendChallenge"),
      sendWelcome: record("sendWelcome"),
      sendDrain: record("sendDrain"),
      registerAdmitted: record("registerAdmitted"),
      unregister: record("unregister"),
      closeSocket: (_, { code, reason }) => void calls.push({ action: "closeSocket", code, reason }),
    },
    delays: { handshakeTimeout: HANDSHAKE_MS },
  });
  const actor = createActor(machine, {
    input: { sessionId: "sess-1", nonce: NONCE, heartbeatIntervalMs: INTERVAL_MS },
    clock,
  }).start();
  const send = (e: ProviderSessionEvent) => actor.send(e);
  return {
    actor,
    clock,
    calls,
    admission,
    send,
    snapshot: () => actor.getSnapshot(),
    names: () => calls.map((c) => c.action),
    closes: () => calls.filter((c): c is Extract<EffectCall, { action: "closeSocket" }> => c.action === "closeSocket"),
    heartbeat: (state: ProviderState, slotsFree: number, inFlight = 0) => send({ type: "provider.heartbeat", state, slotsFree, models: [MODEL], inFlight }),
    count: (inFlight: number) => send({ type: "attempts.counted", inFlight }),
  };
}

type Session = ReturnType<typeof startSession>;

async function admitted(maxConcurrency = 2, verdict: AdmissionVerdict = { admitted: true, tier: "pinned" }): Promise<Session> {
  const s = startSession();
  s.send({ type: "provider.hello", frame: hello(maxConcurrency) });
  s.send({ type: "provider.auth", signature: SIGNATURE });
  s.admission.resolve(verdict);
  await waitFor(s.actor, (snap) => !snap.matches("handshaking"));
  return s;
}

describe("handshake", () => {
  test("hello → challenge → auth → admitted.ready with registerAdmitted and welcome", async () => {
    const s = startSession();
    expect(s.snapshot().value).toEqual({ handshaking: "awaitingHello" });

    s.send({ type: "provider.hello", frame: hello() });
    expect(s.snapshot().value).toEqual({ handshaking: "awaitingAuth" });
    expect(s.names()).toEqual(["sendChallenge"]);
    expect(s.snapshot().context.hello?.provider_id).toBe("prov-1");

    s.send({ type: "provider.auth", signature: SIGNATURE });
    expect(s.snapshot().value).toEqual({ handshaking: "admitting" });
    expect(s.admission.inputs).toEqual([{ sessionId: "sess-1", nonce: NONCE, hello: hello(), signature: SIGNATURE }]);

    s.admission.resolve({ admitted: true, tier: "provisional" });
    await waitFor(s.actor, (snap) => snap.matches("admitted"));
    expect(s.snapshot().value).toEqual({ admitted: "ready" });
    expect(s.snapshot().context.tier).toBe("provisional");
    expect(s.names()).toEqual(["sendChallenge", "registerAdmitted", "sendWelcome"]);
    expect(s.closes()).toEqual([]);
  });

  test.each<[number, string]>([
    [4003, "auth_failed"],
    [4009, "banned"],
    [4010, "key_mismatch"],
    [4007, "provisional_pool_full"],
    [4008, "provisional_rate_limited"],
  ])("a refused verdict closes the socket with %p %s", async (closeCode, reason) => {
    const s = await admitted(2, { admitted: false, closeCode, reason });
    expect(s.snapshot().value).toBe("closed");
    expect(s.snapshot().status).toBe("done");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: closeCode, reason }]);
    expect(s.names()).not.toContain("sendWelcome");
    expect(s.names()).not.toContain("registerAdmitted");
    expect(s.snapshot().context.tier).toBeNull();
  });

  test("an admission that throws closes with 1011", async () => {
    const s = startSession();
    s.send({ type: "provider.hello", frame: hello() });
    s.send({ type: "provider.auth", signature: SIGNATURE });
    s.admission.reject(new Error("db down"));
    await waitFor(s.actor, (snap) => snap.status === "done");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 1011, reason: "internal_error" }]);
  });

  test("a frame out of turn during the handshake closes with 1008", () => {
    const s = startSession();
    s.send({ type: "provider.outOfTurn", frameType: "heartbeat" });
    expect(s.snapshot().value).toBe("closed");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 1008, reason: "out_of_turn" }]);
  });

  test("auth before hello is ignored by the machine (the edge reports it out of turn)", () => {
    const s = startSession();
    s.send({ type: "provider.auth", signature: SIGNATURE });
    expect(s.snapshot().value).toEqual({ handshaking: "awaitingHello" });
    expect(s.admission.inputs).toHaveLength(0);
  });
});

describe("handshake timeout", () => {
  test.each<[string, (s: Session) => void]>([
    ["no hello", () => {}],
    ["hello but no auth", (s) => s.send({ type: "provider.hello", frame: hello() })],
    [
      "auth but admission still pending",
      (s) => {
        s.send({ type: "provider.hello", frame: hello() });
        s.send({ type: "provider.auth", signature: SIGNATURE });
      },
    ],
  ])("%s → closeSocket 4002 after the handshake timeout", (_, reach) => {
    const s = startSession();
    reach(s);
    s.clock.increment(HANDSHAKE_MS - 1);
    expect(s.snapshot().matches("handshaking")).toBe(true);
    s.clock.increment(1);
    expect(s.snapshot().value).toBe("closed");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 4002, reason: "handshake_timeout" }]);
  });

  test("the timer runs from connect, not from hello", () => {
    const s = startSession();
    s.clock.increment(6_000);
    s.send({ type: "provider.hello", frame: hello() });
    s.clock.increment(4_000);
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 4002, reason: "handshake_timeout" }]);
  });

  test("a late verdict after the timeout changes nothing", async () => {
    const s = startSession();
    s.send({ type: "provider.hello", frame: hello() });
    s.send({ type: "provider.auth", signature: SIGNATURE });
    s.clock.increment(HANDSHAKE_MS);
    s.admission.resolve({ admitted: true, tier: "pinned" });
    await Promise.resolve();
    expect(s.snapshot().value).toBe("closed");
    expect(s.names()).not.toContain("sendWelcome");
  });

  test("an admitted session has no handshake timer left", async () => {
    const s = await admitted();
    s.heartbeat("ready", 2);
    s.clock.increment(HANDSHAKE_MS);
    s.heartbeat("ready", 2);
    s.clock.increment(HANDSHAKE_MS);
    expect(s.closes().map((c) => c.code)).not.toContain(4002);
  });
});

describe("heartbeats", () => {
  test("3 missed intervals after admission → closeSocket 4012 and unregister", async () => {
    const s = await admitted();
    s.clock.increment(3 * INTERVAL_MS - 1);
    expect(s.snapshot().matches("admitted")).toBe(true);
    s.clock.increment(1);
    expect(s.snapshot().value).toBe("closed");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 4012, reason: "heartbeat_timeout" }]);
    expect(s.names().slice(-2)).toEqual(["closeSocket", "unregister"]);
  });

  test("a heartbeat resets the eviction timer", async () => {
    const s = await admitted();
    s.clock.increment(2.5 * INTERVAL_MS);
    s.heartbeat("ready", 2);
    s.clock.increment(2.5 * INTERVAL_MS);
    expect(s.snapshot().value).toEqual({ admitted: "ready" });
    expect(s.closes()).toEqual([]);
    s.clock.increment(0.5 * INTERVAL_MS);
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 4012, reason: "heartbeat_timeout" }]);
  });

  test("in-flight counts do not reset the eviction timer", async () => {
    const s = await admitted();
    s.clock.increment(2 * INTERVAL_MS);
    s.count(1);
    s.count(0);
    s.clock.increment(INTERVAL_MS);
    expect(s.snapshot().value).toBe("closed");
  });

  test("a heartbeat records the provider's models", async () => {
    const s = await admitted();
    const other: ModelEntry = { model_id: "m2", model_hash: "b".repeat(64), max_context_tokens: 8192 };
    s.send({ type: "provider.heartbeat", state: "ready", slotsFree: 2, models: [MODEL, other], inFlight: 0 });
    expect(s.snapshot().context.models.map((m) => m.model_id)).toEqual(["m1", "m2"]);
  });

  test("a heartbeat's load report is kept; one without (an older provider) clears it", async () => {
    const s = await admitted();
    expect(s.snapshot().context.reportedLoad).toBeNull();
    const load = { queued_jobs: 1, decode_tokens_per_s: 42.5, outstanding_output_tokens: 300 };
    s.send({ type: "provider.heartbeat", state: "ready", slotsFree: 2, models: [MODEL], inFlight: 0, load });
    expect(s.snapshot().context.reportedLoad).toEqual(load);
    s.send({ type: "provider.heartbeat", state: "ready", slotsFree: 2, models: [MODEL], inFlight: 0 });
    expect(s.snapshot().context.reportedLoad).toBeNull();
  });
});

describe("admitted sub-states", () => {
  test("busy when the in-flight count fills max_concurrency, ready again when it falls", async () => {
    const s = await admitted(2);
    s.count(1);
    expect(s.snapshot().value).toEqual({ admitted: "ready" });
    s.count(2);
    expect(s.snapshot().value).toEqual({ admitted: "busy" });
    expect(s.snapshot().context.inFlight).toBe(2);
    s.count(1);
    expect(s.snapshot().value).toEqual({ admitted: "ready" });
    expect(s.snapshot().context.inFlight).toBe(1);
  });

  test("a heartbeat carries the live in-flight count", async () => {
    const s = await admitted(4);
    s.heartbeat("ready", 1, 3);
    expect(s.snapshot().context.inFlight).toBe(3);
    expect(freeSlots(s.snapshot().context)).toBe(1);
  });

  test.each<[ProviderState, number, "ready" | "busy" | "asleep" | "draining"]>([
    ["asleep", 2, "asleep"],
    ["draining", 2, "draining"],
    ["ready", 0, "busy"],
    ["busy", 0, "busy"],
    ["ready", 1, "ready"],
  ])("heartbeat state %p with %p slots free → %s", async (state, slotsFree, expected) => {
    const s = await admitted(2);
    s.heartbeat(state, slotsFree);
    expect(s.snapshot().value).toEqual({ admitted: expected });
  });

  test("asleep wakes to ready on the next ready heartbeat", async () => {
    const s = await admitted(2);
    s.heartbeat("asleep", 2);
    s.heartbeat("ready", 2);
    expect(s.snapshot().value).toEqual({ admitted: "ready" });
  });

  test("gateway.drain sends drain and stays draining whatever the provider reports", async () => {
    const s = await admitted(2);
    s.send({ type: "gateway.drain" });
    expect(s.snapshot().value).toEqual({ admitted: "draining" });
    expect(s.names().filter((n) => n === "sendDrain")).toHaveLength(1);
    s.heartbeat("ready", 2);
    s.count(0);
    expect(s.snapshot().value).toEqual({ admitted: "draining" });
  });

  test("gateway.replaced → closeSocket 4011 and unregister", async () => {
    const s = await admitted();
    s.send({ type: "gateway.replaced" });
    expect(s.snapshot().value).toBe("closed");
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 4011, reason: "replaced" }]);
    expect(s.names().at(-1)).toBe("unregister");
  });

  test("a frame out of turn after admission closes with 1008", async () => {
    const s = await admitted();
    s.send({ type: "provider.outOfTurn", frameType: "hello" });
    expect(s.closes()).toEqual([{ action: "closeSocket", code: 1008, reason: "out_of_turn" }]);
  });

  test("socket.closed by the peer → closed and unregistered, without closing the socket again", async () => {
    const s = await admitted();
    s.send({ type: "socket.closed", code: 1000 });
    expect(s.snapshot().value).toBe("closed");
    expect(s.closes()).toEqual([]);
    expect(s.names().at(-1)).toBe("unregister");
  });
});

describe("freeSlots", () => {
  const context = (maxConcurrency: number, reportedCapacity: number, inFlight: number): ProviderSessionContext => ({
    sessionId: "s",
    nonce: NONCE,
    heartbeatIntervalMs: INTERVAL_MS,
    hello: hello(maxConcurrency),
    signature: SIGNATURE,
    tier: "pinned",
    models: [MODEL],
    reportedState: "ready",
    reportedCapacity,
    reportedLoad: null,
    inFlight,
    drainRequested: false,
    closeCode: null,
    closeReason: null,
  });

  test.each<[string, number, number, number, number]>([
    // [case, max_concurrency, reportedCapacity, inFlight, expected]
    ["idle, as advertised", 4, 4, 0, 4],
    ["capped by max_concurrency", 4, 10, 1, 3],
    ["capped by the report", 4, 2, 0, 2],
    ["full", 2, 2, 2, 0],
    ["never negative when the provider shrank", 4, 1, 3, 0],
  ])("%s", (_, max, capacity, inFlight, expected) => {
    expect(freeSlots(context(max, capacity, inFlight))).toBe(expected);
  });

  test("no hello yet → no slots", () => {
    expect(freeSlots({ ...context(4, 4, 0), hello: null })).toBe(0);
  });

  test("through the machine: slots_free plus in-flight at report time, capped by max_concurrency", async () => {
    const s = await admitted(4);
    const free = () => freeSlots(s.snapshot().context);
    expect(free()).toBe(4);

    s.heartbeat("ready", 10); // over-reports: capped at max_concurrency
    expect(free()).toBe(4);

    s.count(2);
    expect(free()).toBe(2);

    s.heartbeat("ready", 1, 2); // capacity 1 + 2 in flight = 3
    expect(free()).toBe(1);

    // A finished attempt frees its slot at once, without waiting for a fresh report.
    s.count(1);
    expect(free()).toBe(2);

    s.count(3);
    expect(free()).toBe(0);
    expect(s.snapshot().value).toEqual({ admitted: "busy" });
  });
});

// A gateway's own stall against its providers' heartbeat windows (src/gateway/stallWatch.ts;
// docs/protocol.md, "Gateway side"): heartbeats sent while the process stood still wait unread in the
// socket, so a window the process spent standing still starts again — whichever of the watchdog and the
// stall watch's own tick runs first on waking (the two orders a woken event loop may run its overdue
// timers in). A process that ran all along (a cluster node fenced by a Redis split included) closes a
// silent session after exactly 3 intervals.
const WINDOW_MS = 3 * INTERVAL_MS;

/**
 * An admitted session whose watchdog asks a stall watch, on one monotonic time `at`. The session's
 * timers run when `timers()` is called, the watch's tick when `tick()` is: a test picks their order.
 */
async function stallWatchedSession() {
  let at = 0;
  let tickFn: (() => void) | null = null;
  const stalls = watchStalls({
    thresholdMs: INTERVAL_MS,
    monotonic: () => at,
    timers: { setInterval: (run) => (tickFn = run), clearInterval: () => (tickFn = null) },
  });
  const clock = new SimulatedClock();
  const closes: string[] = [];
  const machine = providerSessionMachine.provide({
    actors: { admitProvider: fromPromise<AdmissionVerdict, AdmissionInput>(async () => ({ admitted: true, tier: "pinned" })) },
    actions: { closeSocket: (_, { reason }) => void closes.push(reason) },
    guards: { gatewayStoodStill: ({ context }) => stalls.stoodStillWithin(3 * context.heartbeatIntervalMs) },
  });
  const actor = createActor(machine, { input: { sessionId: "s1", nonce: NONCE, heartbeatIntervalMs: INTERVAL_MS }, clock }).start();
  actor.send({ type: "provider.hello", frame: hello() });
  actor.send({ type: "provider.auth", signature: SIGNATURE });
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
    heartbeat: () => actor.send({ type: "provider.heartbeat", state: "ready", slotsFree: 2, models: [MODEL], inFlight: 0 }),
  };
}

describe("heartbeats against a stall of the gateway's own process", () => {
  test("a process that ran all along closes a silent session after exactly 3 intervals (no restart for a fence or anything else)", async () => {
    const s = await stallWatchedSession();
    s.run(WINDOW_MS - INTERVAL_MS / 4);
    expect(s.admitted()).toBe(true);
    s.run(INTERVAL_MS / 4);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });

  test("a lag below one interval is not a stall", async () => {
    const s = await stallWatchedSession();
    s.run(INTERVAL_MS);
    s.stall(INTERVAL_MS * 0.9, "watch");
    s.run(WINDOW_MS - INTERVAL_MS * 1.9);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });

  test.each(["watchdog", "watch"] as const)("woken past the window (%s runs first): the window starts again at the wake", async (first) => {
    const s = await stallWatchedSession();
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
    const s = await stallWatchedSession();
    s.run(INTERVAL_MS);
    // The stall began inside the window and ends 1 ms after it: a heartbeat may wait in the socket.
    s.stall(WINDOW_MS - INTERVAL_MS + 1, first);
    expect(s.closes).toEqual([]);
    s.heartbeat();
    s.run(WINDOW_MS - INTERVAL_MS / 4);
    expect(s.closes).toEqual([]);
  });

  test("a stall that ended more than a window ago does not spare the next window", async () => {
    const s = await stallWatchedSession();
    s.stall(2 * INTERVAL_MS, "watch");
    s.run(INTERVAL_MS / 4);
    s.heartbeat();
    s.run(WINDOW_MS);
    expect(s.closes).toEqual(["heartbeat_timeout"]);
  });
});
