// The request actor in isolation: routing, failover before the first byte, commit rules, limits and
// timeouts, driven by scripted dispatches and a SimulatedClock (no sockets, no timers, no sleeps).
// Chunks go through a small stand-in for the edge with a real ChunkMeter: the first chunk of an attempt
// is a `provider.chunk` event, later ones become `stream.progress` / `stream.seqError` /
// `stream.lengthLimited` as the meter decides. The real edge (src/gateway/requests.ts, dispatch.ts) is
// tested on an injected clock in test/gateway/request-edge.test.ts.
import { beforeAll, describe, expect, test } from "bun:test";
import { createActor, SimulatedClock } from "xstate";
import {
  providedRequestMachine,
  requestLogic,
  streamIdleCheckMs,
  type DispatchInput,
  type FailureCode,
  type RequestActions,
  type RequestContext,
  type RequestDelays,
  type RequestEvent,
  type RequestInput,
} from "../../actors/request.ts";
import { ChunkMeter } from "../../src/gateway/chunkMeter.ts";
import type { ChunkFrame, DeclineCode, EndFrame, TerminalState } from "../../src/wire/frames.ts";

const VARIANTS = ["statechart", "step logic"] as const;
let current: (typeof VARIANTS)[number] = "statechart";
const logicOf = (actions: Partial<RequestActions>, delays: RequestDelays) => (current === "statechart" ? providedRequestMachine(actions, delays) : requestLogic(actions, delays));

const FIRST_BYTE_MS = 5_000;
const DEADLINE_MS = 60_000;
// Beyond the deadline by default, so only the stall tests below meet it.
const IDLE_MS = 120_000;
const SHORT_IDLE_MS = 10_000;

/** What the fake router does for one attempt: dispatch to a provider, answer "unavailable", or never answer. */
type Step = { provider: string } | { unavailable: FailureCode; message: string } | { hang: true };

type CancelReason = "buyer_cancel" | "gateway_timeout";

type PlainAction = "discardPartialOutput" | "finishSuccess" | "finishFailure" | "finishMidStreamError" | "releaseAttempt" | "openProgressWindow";
/** One recorded effect, with the attempt that was current when it ran. */
type ActionCall =
  | { action: "relayChunk"; attemptN: number | null; frame: ChunkFrame }
  | { action: "cancelAttempt"; attemptN: number | null; reason: CancelReason }
  | { [A in PlainAction]: { action: A; attemptN: number | null } }[PlainAction];

interface Options {
  script: Step[];
  input?: Partial<RequestInput>;
  /** streamIdleTimeout is the configured stall limit; the machine gets streamIdleCheckMs of it. */
  delays?: { firstByteTimeout?: number; streamIdleTimeout?: number; requestDeadline?: number };
}

/** The edge's events, as the stand-in edge sent them (chunks after an attempt's first). */
type EdgeEvent = "stream.progress" | "stream.seqError" | "stream.lengthLimited";

function startRequest({ script, input, delays }: Options) {
  const clock = new SimulatedClock();
  const calls: ActionCall[] = [];
  const dispatches: DispatchInput[] = [];
  const edgeEvents: { type: EdgeEvent; at: number }[] = [];
  const at = (context: RequestContext) => context.current?.attemptN ?? null;
  const maxTokens = input?.maxTokens ?? 100;
  // As at the edge: one meter per attempt, replaced at each dispatch.
  let meter = new ChunkMeter(maxTokens);

  // As at the edge: answers by event; a dispatch that throws is a `route.failed`.
  const dispatch = (d: DispatchInput, sendBack: (event: RequestEvent) => void) => {
    // Copy: the machine's context array must not be what we later assert on.
    dispatches.push({ ...d, excludedProviders: [...d.excludedProviders] });
    const step = script[d.attemptN];
    if (!step) throw new Error(`no scripted step for attempt ${d.attemptN}`);
    meter = new ChunkMeter(maxTokens);
    if ("hang" in step) return;
    if ("unavailable" in step) {
      sendBack({ type: "route.unavailable", code: step.unavailable, message: step.message });
      return;
    }
    sendBack({
      type: "route.dispatched",
      attempt: { attemptN: d.attemptN, sessionId: `sess-${step.provider}`, providerId: step.provider },
    });
  };

  const machine = logicOf({
      dispatchAttempt: ({ self }, d) => {
        try {
          dispatch(d, (event) => self.send(event));
        } catch {
          self.send({ type: "route.failed" });
        }
      },
      relayChunk: ({ context }, { frame }) => {
        meter.accept(frame);
        meter.markProgress();
        calls.push({ action: "relayChunk", attemptN: at(context), frame });
      },
      openProgressWindow: ({ context }) => {
        meter.openWindow();
        calls.push({ action: "openProgressWindow", attemptN: at(context) });
      },
      cancelAttempt: ({ context }, { reason }) => calls.push({ action: "cancelAttempt", attemptN: at(context), reason }),
      discardPartialOutput: ({ context }) => {
        meter.discard();
        calls.push({ action: "discardPartialOutput", attemptN: at(context) });
      },
      finishSuccess: ({ context }) => calls.push({ action: "finishSuccess", attemptN: at(context) }),
      finishFailure: ({ context }) => calls.push({ action: "finishFailure", attemptN: at(context) }),
      finishMidStreamError: ({ context }) => calls.push({ action: "finishMidStreamError", attemptN: at(context) }),
      releaseAttempt: ({ context }) => calls.push({ action: "releaseAttempt", attemptN: at(context) }),
    }, {
      firstByteTimeout: delays?.firstByteTimeout ?? FIRST_BYTE_MS,
      streamIdleCheck: streamIdleCheckMs(delays?.streamIdleTimeout ?? IDLE_MS),
      requestDeadline: delays?.requestDeadline ?? DEADLINE_MS,
  });

  const actor = createActor(machine, {
    input: { requestId: "req_1", streaming: true, maxTokens, maxAttempts: 3, ...input },
    clock,
  }).start();

  const snapshot = () => actor.getSnapshot();
  const currentAttempt = () => snapshot().context.current?.attemptN ?? -1;
  const send = (event: RequestEvent) => actor.send(event);
  const edgeSend = (type: EdgeEvent) => {
    edgeEvents.push({ type, at: clock.now() });
    send({ type });
  };

  /** What the edge does with a chunk of the live attempt (after release the registry drops it). */
  const chunkArrived = (frame: ChunkFrame) => {
    if (snapshot().status !== "active") return;
    if (!meter.started) return send({ type: "provider.chunk", frame });
    switch (meter.accept(frame)) {
      case "relay":
        calls.push({ action: "relayChunk", attemptN: currentAttempt(), frame });
        if (meter.markProgress()) edgeSend("stream.progress");
        return;
      case "seq_error":
        return edgeSend("stream.seqError");
      case "length_limited":
        return edgeSend("stream.lengthLimited");
    }
  };

  return {
    actor,
    clock,
    calls,
    dispatches,
    edgeEvents,
    snapshot,
    send,
    /**
     * Advances time 1 ms at a time: SimulatedClock re-arms a timer from the time of the whole increment,
     * so one big increment would stretch the watchdog's periodic windows.
     */
    advance: (ms: number) => {
      for (let i = 0; i < ms; i++) clock.increment(1);
    },
    /** The current attempt's meter: delivered tokens and bytes. */
    meter: () => meter,
    names: () => calls.map((c) => c.action),
    named: <A extends ActionCall["action"]>(action: A) =>
      calls.filter((c): c is Extract<ActionCall, { action: A }> => c.action === action),
    /** Releases of a real attempt (terminal states also release, with nothing current by then). */
    releasedAttempts: () => calls.filter((c) => c.action === "releaseAttempt" && c.attemptN !== null).map((c) => c.attemptN),
    chunk: (seq: number, tokens: number, content?: string) =>
      chunkArrived({
        type: "chunk",
        request_id: "req_1",
        attempt_n: currentAttempt(),
        seq,
        tokens,
        ...(content === undefined ? {} : { content }),
      }),
    end: (terminal_state: TerminalState = "normal_done", finish_reason: string | null = "stop") => {
      const frame: EndFrame = {
        type: "end",
        request_id: "req_1",
        attempt_n: currentAttempt(),
        terminal_state,
        finish_reason,
        usage: { input_tokens: 10, output_tokens: 3 },
      };
      send({ type: "provider.ended", frame });
    },
  };
}

type Harness = ReturnType<typeof startRequest>;

const providers = (...ids: string[]): Step[] => ids.map((provider) => ({ provider }));

// The statechart (the definition) and the step logic the gateway runs pass the same tests.
describe.each(VARIANTS)("%s", (variant) => {
  beforeAll(() => {
    current = variant;
  });

  describe("happy path", () => {
    test("streaming: dispatched → chunks relayed in order → ended normal_done → succeeded", () => {
      const h = startRequest({ script: providers("p1") });
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current).toEqual({ attemptN: 0, sessionId: "sess-p1", providerId: "p1" });

      h.chunk(0, 2, "Hel");
      expect(h.snapshot().value).toBe("receiving");
      expect(h.snapshot().context.committed).toBe(true);
      h.chunk(1, 1, "lo ");
      h.chunk(2, 1, "wörld");
      h.end();

      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().status).toBe("done");
      expect(h.named("relayChunk").map((c) => [c.frame.seq, c.frame.content])).toEqual([
        [0, "Hel"],
        [1, "lo "],
        [2, "wörld"],
      ]);
      expect(h.named("finishSuccess")).toHaveLength(1);
      expect(h.named("cancelAttempt")).toHaveLength(0);
      expect(h.releasedAttempts()).toEqual([0]);
      expect(h.meter().deliveredTokens).toBe(4);
      expect(h.meter().deliveredBytes).toBe(3 + 3 + 6); // "ö" is two UTF-8 bytes
      expect(h.snapshot().context.lengthLimited).toBe(false);
      // Only the first chunk was an event: it already counted as this idle window's progress.
      expect(h.edgeEvents).toEqual([]);
      expect(h.dispatches).toEqual([{ requestId: "req_1", attemptN: 0, excludedProviders: [] }]);
    });

    test("non-streaming: chunks are relayed but never commit; success finishes once", () => {
      const h = startRequest({ script: providers("p1"), input: { streaming: false } });
      h.chunk(0, 1, "a");
      h.chunk(1, 1, "b");
      expect(h.snapshot().context.committed).toBe(false);
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.named("relayChunk")).toHaveLength(2);
      expect(h.named("finishSuccess")).toHaveLength(1);
    });

    test("an attempt that ends normal_done before any chunk still succeeds (empty output)", () => {
      const h = startRequest({ script: providers("p1") });
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.named("relayChunk")).toHaveLength(0);
      expect(h.named("finishSuccess")).toHaveLength(1);
    });
  });

  describe("failover before the first byte", () => {
    test("first-byte timeout cancels (gateway_timeout), releases, excludes the provider and routes attempt n+1", () => {
      const h = startRequest({ script: [{ provider: "p1" }, { hang: true }] });
      h.clock.increment(FIRST_BYTE_MS - 1);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.named("cancelAttempt")).toHaveLength(0);

      h.clock.increment(1);
      expect(h.snapshot().value).toBe("routing");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.releasedAttempts()).toEqual([0]);
      // The cancel goes out before the attempt is released.
      expect(h.names().indexOf("cancelAttempt")).toBeLessThan(h.names().indexOf("releaseAttempt"));
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      expect(h.snapshot().context.lastAttemptFailure).toBe("first_byte_timeout");
      expect(h.dispatches[1]).toEqual({ requestId: "req_1", attemptN: 1, excludedProviders: ["p1"] });
    });

    test("the next attempt gets a fresh first-byte timer", () => {
      const h = startRequest({ script: providers("p1", "p2") });
      h.clock.increment(FIRST_BYTE_MS);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      h.clock.increment(FIRST_BYTE_MS - 1);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      h.chunk(0, 1, "x");
      h.clock.increment(FIRST_BYTE_MS * 3);
      expect(h.snapshot().value).toBe("receiving");
    });

    const declined = (code: DeclineCode): RequestEvent => ({ type: "provider.declined", code });
    test.each<[string, (h: Harness) => void]>([
      ["declined queue_full", (h) => h.send(declined("queue_full"))],
      ["declined model_not_loaded", (h) => h.send(declined("model_not_loaded"))],
      ["provider.lost", (h) => h.send({ type: "provider.lost" })],
      ["ended provider_error", (h) => h.end("provider_error", null)],
      ["ended upstream_transport_disconnect", (h) => h.end("upstream_transport_disconnect", null)],
    ])("%s before the first byte fails over to the next provider", (_, fail) => {
      const h = startRequest({ script: providers("p1", "p2") });
      fail(h);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current).toEqual({ attemptN: 1, sessionId: "sess-p2", providerId: "p2" });
      expect(h.dispatches.map((d) => d.excludedProviders)).toEqual([[], ["p1"]]);
      expect(h.releasedAttempts()).toEqual([0]);
      // The provider already stopped: no cancel is sent.
      expect(h.named("cancelAttempt")).toHaveLength(0);

      h.chunk(0, 1, "ok");
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.named("relayChunk").map((c) => c.attemptN)).toEqual([1]);
    });

    test("maxAttempts exhausted → failed with coordinator_unavailable, finishFailure once", () => {
      const h = startRequest({ script: providers("p1", "p2", "p3", "p4"), input: { maxAttempts: 3 } });
      h.send({ type: "provider.lost" });
      h.send({ type: "provider.declined", code: "internal" });
      h.send({ type: "provider.lost" });

      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().status).toBe("done");
      expect(h.dispatches.map((d) => [d.attemptN, d.excludedProviders])).toEqual([
        [0, []],
        [1, ["p1"]],
        [2, ["p1", "p2"]],
      ]);
      expect(h.releasedAttempts()).toEqual([0, 1, 2]);
      expect(h.named("finishFailure")).toHaveLength(1);
      expect(h.snapshot().context.failure?.code).toBe("coordinator_unavailable");
      expect(h.named("finishSuccess")).toHaveLength(0);
    });

    test("maxAttempts 1 means no failover at all", () => {
      const h = startRequest({ script: providers("p1", "p2"), input: { maxAttempts: 1 } });
      h.clock.increment(FIRST_BYTE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.dispatches).toHaveLength(1);
      expect(h.snapshot().context.failure?.code).toBe("coordinator_unavailable");
    });

    test.each<[FailureCode, string]>([
      ["model_not_available", "The model 'x' is not available."],
      ["coordinator_unavailable", "No provider is free."],
      ["context_length_exceeded", "Too long."],
    ])("route.unavailable %s → failed with that code", (code, message) => {
      const h = startRequest({ script: [{ unavailable: code, message }] });
      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().context.failure).toEqual({ code, message });
      expect(h.named("finishFailure")).toHaveLength(1);
      expect(h.named("cancelAttempt")).toHaveLength(0);
    });

    test("route.unavailable on a later attempt keeps the router's code", () => {
      const h = startRequest({ script: [{ provider: "p1" }, { unavailable: "coordinator_unavailable", message: "none left" }] });
      h.send({ type: "provider.lost" });
      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().context.failure).toEqual({ code: "coordinator_unavailable", message: "none left" });
      expect(h.named("finishFailure")).toHaveLength(1);
    });
  });

  describe("after the first byte", () => {
    test.each<[string, (h: Harness) => void]>([
      ["provider.lost", (h) => h.send({ type: "provider.lost" })],
      ["ended provider_error", (h) => h.end("provider_error", null)],
    ])("streaming: %s after the first chunk → failedMidStream, no failover", (_, fail) => {
      const h = startRequest({ script: providers("p1", "p2") });
      h.chunk(0, 1, "partial");
      fail(h);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.named("finishMidStreamError")).toHaveLength(1);
      expect(h.named("finishFailure")).toHaveLength(0);
      expect(h.named("discardPartialOutput")).toHaveLength(0);
      expect(h.dispatches).toHaveLength(1);
      expect(h.releasedAttempts()).toEqual([0]);
    });

    test("non-streaming: loss after a chunk discards the partial output and fails over", () => {
      const h = startRequest({ script: providers("p1", "p2"), input: { streaming: false } });
      h.chunk(0, 3, "abc");
      h.send({ type: "provider.lost" });

      expect(h.named("discardPartialOutput")).toEqual([{ action: "discardPartialOutput", attemptN: 0 }]);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      expect(h.meter().deliveredTokens).toBe(0);
      expect(h.meter().deliveredBytes).toBe(0);

      h.chunk(0, 2, "xy");
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.meter().deliveredTokens).toBe(2);
      expect(h.named("finishMidStreamError")).toHaveLength(0);
      expect(h.releasedAttempts()).toEqual([0, 1]);
    });

    test("non-streaming: failing after output on the last attempt → failed (not mid-stream)", () => {
      const h = startRequest({ script: providers("p1"), input: { streaming: false, maxAttempts: 1 } });
      h.chunk(0, 1, "a");
      h.end("provider_error", null);
      expect(h.snapshot().value).toBe("failed");
      expect(h.named("discardPartialOutput")).toHaveLength(1);
      expect(h.named("finishFailure")).toHaveLength(1);
    });
  });

  describe("buyer abort", () => {
    test.each<[string, "routing" | "awaitingFirstByte" | "receiving", Step[], (h: Harness) => void, number | null]>([
      ["routing", "routing", [{ hang: true }], () => {}, null],
      ["awaitingFirstByte", "awaitingFirstByte", providers("p1"), () => {}, 0],
      ["receiving", "receiving", providers("p1"), (h) => h.chunk(0, 1, "a"), 0],
      ["awaitingFirstByte after a failover", "awaitingFirstByte", providers("p1", "p2"), (h) => h.send({ type: "provider.lost" }), 1],
    ])("buyer.aborted in %s → cancelled with cancelAttempt{buyer_cancel}", (_, state, script, reach, attemptN) => {
      const h = startRequest({ script });
      reach(h);
      expect(h.snapshot().value).toBe(state);
      h.send({ type: "buyer.aborted" });

      expect(h.snapshot().value).toBe("cancelled");
      expect(h.snapshot().status).toBe("done");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN, reason: "buyer_cancel" }]);
      expect(h.calls.at(-1)).toEqual({ action: "releaseAttempt", attemptN });
      for (const finish of ["finishSuccess", "finishFailure", "finishMidStreamError"] as const) {
        expect(h.named(finish)).toHaveLength(0);
      }
    });

    test("a non-streaming buyer abort after output cancels too", () => {
      const h = startRequest({ script: providers("p1"), input: { streaming: false } });
      h.chunk(0, 1, "a");
      h.send({ type: "buyer.aborted" });
      expect(h.snapshot().value).toBe("cancelled");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "buyer_cancel" }]);
    });

    test("events after a final state change nothing", () => {
      const h = startRequest({ script: providers("p1") });
      h.send({ type: "buyer.aborted" });
      const before = h.calls.length;
      h.chunk(0, 1, "late");
      h.send({ type: "buyer.aborted" });
      h.clock.increment(DEADLINE_MS * 2);
      expect(h.calls.length).toBe(before);
      expect(h.snapshot().value).toBe("cancelled");
    });
  });

  describe("sequence numbers", () => {
    test("first chunk out of order is a provider failure: cancel and fail over", () => {
      const h = startRequest({ script: providers("p1", "p2") });
      h.chunk(1, 1, "skipped seq 0");
      expect(h.named("relayChunk")).toHaveLength(0);
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      // The next attempt starts counting seq from 0 again.
      h.chunk(0, 1, "ok");
      expect(h.snapshot().value).toBe("receiving");
    });

    test("streaming: a repeated seq after output → failedMidStream, attempt cancelled", () => {
      const h = startRequest({ script: providers("p1", "p2") });
      h.chunk(0, 1, "a");
      h.chunk(0, 1, "a again");
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.named("relayChunk")).toHaveLength(1);
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.dispatches).toHaveLength(1);
    });

    test("non-streaming: a gap in seq after output discards and fails over", () => {
      const h = startRequest({ script: providers("p1", "p2"), input: { streaming: false } });
      h.chunk(0, 1, "a");
      h.chunk(2, 1, "c");
      expect(h.named("discardPartialOutput")).toHaveLength(1);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      expect(h.snapshot().context.lastAttemptFailure).toBe("stream.seqError");
    });
  });

  describe("max_tokens", () => {
    test("a chunk that would exceed maxTokens → succeeded, lengthLimited, attempt cancelled, chunk not relayed", () => {
      const h = startRequest({ script: providers("p1"), input: { maxTokens: 5 } });
      h.chunk(0, 3, "abc");
      h.chunk(1, 3, "def");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.meter().deliveredTokens).toBe(3);
      expect(h.meter().deliveredBytes).toBe(3);
      expect(h.edgeEvents.map((e) => e.type)).toEqual(["stream.lengthLimited"]);
      expect(h.named("relayChunk").map((c) => c.frame.seq)).toEqual([0]);
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.named("finishSuccess")).toHaveLength(1);
      expect(h.releasedAttempts()).toEqual([0]);
    });

    test("a chunk that exactly reaches maxTokens is relayed", () => {
      const h = startRequest({ script: providers("p1"), input: { maxTokens: 5 } });
      h.chunk(0, 5, "abcde");
      expect(h.snapshot().value).toBe("receiving");
      h.end("normal_done", "length");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(false);
      expect(h.named("cancelAttempt")).toHaveLength(0);
    });

    test("a first chunk over maxTokens succeeds length-limited with nothing relayed", () => {
      const h = startRequest({ script: providers("p1"), input: { maxTokens: 2 } });
      h.chunk(0, 3, "abc");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.named("relayChunk")).toHaveLength(0);
      expect(h.named("cancelAttempt")).toHaveLength(1);
    });
  });

  describe("request deadline", () => {
    test("streaming, committed: deadline → failedMidStream with a gateway_timeout cancel", () => {
      const h = startRequest({ script: providers("p1") });
      h.chunk(0, 1, "a");
      h.clock.increment(DEADLINE_MS - 1);
      expect(h.snapshot().value).toBe("receiving");
      h.clock.increment(1);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.named("finishMidStreamError")).toHaveLength(1);
      expect(h.releasedAttempts()).toEqual([0]);
    });

    test("before the first byte: deadline → failed with coordinator_unavailable", () => {
      const h = startRequest({ script: providers("p1"), delays: { firstByteTimeout: DEADLINE_MS * 2 } });
      h.clock.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.named("finishFailure")).toHaveLength(1);
      expect(h.snapshot().context.failure?.code).toBe("coordinator_unavailable");
    });

    test("non-streaming with partial output: deadline → failed, not mid-stream", () => {
      const h = startRequest({ script: providers("p1"), input: { streaming: false } });
      h.chunk(0, 1, "a");
      h.clock.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.named("finishFailure")).toHaveLength(1);
      expect(h.named("finishMidStreamError")).toHaveLength(0);
    });

    test("the deadline runs from the request's start, across failovers", () => {
      const h = startRequest({
        script: providers("p1", "p2", "p3", "p4"),
        input: { maxAttempts: 10 },
        delays: { firstByteTimeout: 25_000, requestDeadline: DEADLINE_MS },
      });
      h.clock.increment(25_000); // attempt 0 times out
      h.clock.increment(25_000); // attempt 1 times out
      expect(h.snapshot().context.current?.attemptN).toBe(2);
      h.clock.increment(DEADLINE_MS - 50_000);
      expect(h.snapshot().value).toBe("failed");
      expect(h.named("cancelAttempt").map((c) => c.attemptN)).toEqual([0, 1, 2]);
      expect(h.dispatches).toHaveLength(3);
    });

    test("while routing (nothing dispatched): deadline → failed", () => {
      const h = startRequest({ script: [{ hang: true }] });
      h.clock.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: null, reason: "gateway_timeout" }]);
      expect(h.named("finishFailure")).toHaveLength(1);
    });
  });

  describe("a provider going silent after its first chunk (the idle watchdog)", () => {
    // T = the configured stall limit; the machine checks every T/2 and fails after two silent windows.
    const T = SHORT_IDLE_MS;
    const WINDOW = streamIdleCheckMs(T);
    const LONG_DEADLINE = { streamIdleTimeout: T, requestDeadline: 100 * T };

    /** Advances in 1 ms steps until the stream stalls; the time since the last chunk when it did. */
    const msUntilStall = (r: Harness, limit = 3 * T): number => {
      for (let ms = 1; ms <= limit; ms++) {
        r.clock.increment(1);
        if (r.snapshot().value !== "receiving") return ms;
      }
      throw new Error("no stall detected");
    };

    test("the check window is half the stall limit, rounded up", () => {
      expect(streamIdleCheckMs(10_000)).toBe(5_000);
      expect(streamIdleCheckMs(801)).toBe(401);
      expect(streamIdleCheckMs(1)).toBe(1);
    });

    test("silence right after the first chunk ends the stream mid-stream at 1.5 × T, with a gateway_timeout cancel", () => {
      const r = startRequest({ script: providers("p1"), delays: LONG_DEADLINE });
      r.chunk(0, 1, "a");
      expect(msUntilStall(r)).toBe(3 * WINDOW);
      expect(r.snapshot().value).toBe("failedMidStream");
      expect(r.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(r.named("finishMidStreamError")).toHaveLength(1);
      expect(r.releasedAttempts()).toEqual([0]);
    });

    // The last chunk anywhere in a window: at the window's start, middle, last millisecond, and in a
    // later window (after the first chunk's).
    test.each([0, 1, WINDOW / 2, WINDOW - 1, WINDOW + 1, 3 * WINDOW - 1])(
      "a stall after a chunk at %i ms into the stream is detected in (T, 1.5 × T]",
      (lastChunkAt) => {
        const r = startRequest({ script: providers("p1"), delays: LONG_DEADLINE });
        r.chunk(0, 1, "a");
        r.advance(lastChunkAt);
        r.chunk(1, 1, "b");
        expect(r.snapshot().value).toBe("receiving");
        const waited = msUntilStall(r);
        expect(waited).toBeGreaterThan(T);
        expect(waited).toBeLessThanOrEqual(1.5 * T);
        expect(r.snapshot().value).toBe("failedMidStream");
        expect(r.named("cancelAttempt").map((c) => c.reason)).toEqual(["gateway_timeout"]);
      },
    );

    test("steady chunks keep a long stream alive; progress reaches the machine at most once per window", () => {
      const r = startRequest({ script: providers("p1"), delays: LONG_DEADLINE });
      const every = 250;
      const total = 20 * T;
      r.chunk(0, 0, "a");
      // 250 ms steps land exactly on every window boundary (see `advance` for why that matters).
      for (let seq = 1; seq * every <= total; seq++) {
        r.clock.increment(every);
        r.chunk(seq, 0, "b");
      }
      expect(r.snapshot().value).toBe("receiving");
      expect(r.named("relayChunk")).toHaveLength(total / every + 1);
      // One report per window after the first (whose progress was the first chunk itself), never more.
      const windows = Math.floor(total / WINDOW);
      const progress = r.edgeEvents.filter((e) => e.type === "stream.progress");
      expect(progress.length).toBeLessThanOrEqual(windows);
      expect(progress.length).toBeGreaterThanOrEqual(windows - 1);
      const perWindow = new Map<number, number>();
      for (const p of progress) perWindow.set(Math.floor(p.at / WINDOW), (perWindow.get(Math.floor(p.at / WINDOW)) ?? 0) + 1);
      expect(Math.max(...perWindow.values())).toBe(1);
      // Each window close re-opened reporting once; the stream still ends normally.
      expect(r.named("openProgressWindow").length).toBe(windows);
      r.end();
      expect(r.snapshot().value).toBe("succeeded");
      expect(r.named("cancelAttempt")).toHaveLength(0);
    });

    test("one late chunk resets the watchdog: a full stall period is needed again", () => {
      const r = startRequest({ script: providers("p1"), delays: LONG_DEADLINE });
      r.chunk(0, 1, "a");
      // Just before the stall would be declared (at 3 windows), one chunk arrives.
      r.advance(3 * WINDOW - 1);
      r.chunk(1, 1, "b");
      expect(r.edgeEvents.map((e) => e.type)).toEqual(["stream.progress"]);
      const waited = msUntilStall(r);
      expect(waited).toBeGreaterThan(T);
      expect(waited).toBeLessThanOrEqual(1.5 * T);
      expect(r.snapshot().value).toBe("failedMidStream");
    });

    test("a window without a chunk between two with chunks is not a stall", () => {
      const r = startRequest({ script: providers("p1"), delays: LONG_DEADLINE });
      r.chunk(0, 1, "a");
      // Chunks at the start of every other window: at most one silent window in a row.
      for (let seq = 1; seq <= 10; seq++) {
        r.advance(2 * WINDOW);
        r.chunk(seq, 1, "b");
      }
      expect(r.snapshot().value).toBe("receiving");
    });

    test("the watchdog is not running before the first chunk (the first-byte timeout is)", () => {
      const r = startRequest({ script: providers("p1"), delays: { ...LONG_DEADLINE, firstByteTimeout: 10 * T } });
      r.clock.increment(5 * T);
      expect(r.snapshot().value).toBe("awaitingFirstByte");
      expect(r.named("openProgressWindow")).toHaveLength(0);
    });

    test("non-streaming: silence after partial output fails over to another provider", () => {
      const r = startRequest({
        script: [{ provider: "p1" }, { provider: "p2" }],
        input: { streaming: false },
        delays: LONG_DEADLINE,
      });
      r.chunk(0, 1, "a");
      r.chunk(1, 2, "bc");
      r.advance(3 * WINDOW);
      expect(r.snapshot().value).toBe("awaitingFirstByte");
      expect(r.dispatches.at(-1)!.excludedProviders).toEqual(["p1"]);
      expect(r.names()).toContain("discardPartialOutput");
      expect(r.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      // The new attempt counts from zero.
      expect(r.meter().deliveredTokens).toBe(0);
      r.chunk(0, 1, "x");
      expect(r.snapshot().value).toBe("receiving");
    });
  });

  describe("later chunks judged at the edge", () => {
    test("streaming: stream.seqError after output → failedMidStream with a gateway_timeout cancel, chunk not relayed", () => {
      const h = startRequest({ script: providers("p1", "p2") });
      h.chunk(0, 1, "a");
      h.chunk(1, 1, "b");
      h.chunk(3, 1, "skipped 2");
      expect(h.edgeEvents.map((e) => e.type)).toEqual(["stream.seqError"]);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.named("relayChunk").map((c) => c.frame.seq)).toEqual([0, 1]);
      expect(h.named("cancelAttempt")).toEqual([{ action: "cancelAttempt", attemptN: 0, reason: "gateway_timeout" }]);
      expect(h.named("finishMidStreamError")).toHaveLength(1);
      expect(h.dispatches).toHaveLength(1);
    });

    test("stream.lengthLimited ends the request successfully with only the relayed tokens counted", () => {
      const h = startRequest({ script: providers("p1"), input: { maxTokens: 4 } });
      h.chunk(0, 1, "a");
      h.chunk(1, 2, "bc");
      h.chunk(2, 2, "de");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.meter().deliveredTokens).toBe(3);
      expect(h.calls.filter((c) => c.action !== "relayChunk").map((c) => c.action)).toEqual(["cancelAttempt", "releaseAttempt", "finishSuccess"]);
    });

    test("stream events outside `receiving` change nothing", () => {
      const h = startRequest({ script: providers("p1") });
      for (const type of ["stream.progress", "stream.seqError", "stream.lengthLimited"] as const) h.send({ type });
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.calls).toEqual([]);
    });
  });

  test("a failing dispatch ends the request as an internal error, not a crash", () => {
    const r = startRequest({ script: [] });
    expect(r.snapshot().value).toBe("failed");
    expect(r.snapshot().context.failure?.code).toBe("internal_error");
    expect(r.names()).toContain("finishFailure");
  });
});
