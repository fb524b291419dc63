// A buyer request's life through the gateway's real request edge (test/support/requestEdge.ts): routing,
// failover before the first byte, commit rules, limits and timeouts, on a SimulatedClock. Provider
// frames go through the real endpoint, an attempt's later chunks through the edge's ChunkMeter (the
// actor hears only the first one, a bad seq, the cap, and progress once per idle-check window). What
// is checked is what the edge did — jobs and cancels the providers got, calls to settlements and to the
// buyer's responder — and the request actor's snapshot. The step logic the gateway runs and the
// statechart it is compiled from both run through the same edge.
import { describe, expect, test } from "bun:test";
import { createActor } from "xstate";
import { providedRequestMachine, requestLogic, streamIdleCheckMs, type RequestActions, type RequestDelays, type RequestEvent } from "../../actors/request.ts";
import type { RequestFailure } from "../../src/chat/contract.ts";
import { unavailableMessages } from "../../src/gateway/dispatch.ts";
import { startRequestEdge, type EdgeOptions, type RequestEdge } from "../support/requestEdge.ts";

const FIRST_BYTE_MS = 5_000;
const DEADLINE_MS = 60_000;

// The chart's snapshots have the step logic's value and context (test/actors/request-lockstep.test.ts),
// which is all the edge reads of them.
const VARIANTS = [
  ["step logic", requestLogic],
  ["statechart", providedRequestMachine as unknown as typeof requestLogic],
] as const;

/** The edge's stream events the actor heard (chunks after an attempt's first). */
const streamEvents = (h: RequestEdge) => h.events.map((e) => e.type).filter((t) => t.startsWith("stream."));
const ATTEMPTS_EXHAUSTED_MESSAGE = "No provider could serve this request right now. Retry shortly.";

describe.each(VARIANTS)("%s", (_, logic) => {
  const start = (o: EdgeOptions) =>
    startRequestEdge({ firstByteTimeoutMs: FIRST_BYTE_MS, requestDeadlineMs: DEADLINE_MS, requestLogic: logic, ...o });

  describe("happy path", () => {
    test("streaming: dispatched → chunks relayed in order → ended normal_done → succeeded", async () => {
      const h = await start({ providers: ["p1"] });
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current).toEqual({ attemptN: 0, sessionId: "sess-1", providerId: "p1" });
      expect(h.jobs()).toEqual([[0, "p1"]]);

      h.chunk(0, 2, "Hel");
      expect(h.snapshot().value).toBe("receiving");
      expect(h.snapshot().context.committed).toBe(true);
      h.chunk(1, 1, "lo ");
      h.chunk(2, 1, "wörld");
      h.end();

      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().status).toBe("done");
      expect(h.of("relay").map((r) => [r.seq, r.content])).toEqual([
        [0, "Hel"],
        [1, "lo "],
        [2, "wörld"],
      ]);
      // Prompt tokens as the provider's `end` reports them (3, under the gateway's bound of 10).
      expect(h.of("succeed")).toEqual([{ kind: "succeed", finishReason: "stop", promptTokens: 3, completionTokens: 4 }]);
      expect(h.cancels()).toEqual([]);
      expect(h.released()).toEqual([0]);
      expect(h.meter(0).deliveredTokens).toBe(4);
      expect(h.meter(0).deliveredBytes).toBe(3 + 3 + 6); // "ö" is two UTF-8 bytes
      expect(h.snapshot().context.lengthLimited).toBe(false);
      // Only the first chunk was an event: it already counted as this idle window's progress.
      expect(streamEvents(h)).toEqual([]);
      expect(h.events.filter((e) => e.type === "provider.chunk")).toHaveLength(1);
      expect(h.runner.liveRequests()).toBe(0);
    });

    test("non-streaming: chunks are relayed but never commit; success finishes once", async () => {
      const h = await start({ providers: ["p1"], streaming: false });
      h.chunk(0, 1, "a");
      h.chunk(1, 1, "b");
      expect(h.snapshot().context.committed).toBe(false);
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.of("relay")).toHaveLength(2);
      expect(h.of("succeed")).toHaveLength(1);
    });

    test("an attempt that ends normal_done before any chunk still succeeds (empty output)", async () => {
      const h = await start({ providers: ["p1"] });
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.of("relay")).toHaveLength(0);
      expect(h.of("succeed")).toEqual([{ kind: "succeed", finishReason: "stop", promptTokens: 3, completionTokens: 0 }]);
    });
  });

  describe("failover before the first byte", () => {
    test("first-byte timeout cancels (gateway_timeout), releases, excludes the provider and routes attempt n+1", async () => {
      const h = await start({ providers: ["p1", "p2"] });
      h.increment(FIRST_BYTE_MS - 1);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.cancels()).toEqual([]);

      // Attempt 1's route snapshot is not durable yet: the request stays in routing.
      h.holdCommits();
      h.increment(1);
      expect(h.snapshot().value).toBe("routing");
      expect(h.of("cancel")).toEqual([{ kind: "cancel", attemptN: 0, providerId: "p1", reason: "gateway_timeout", deliveredOutputBytes: 0 }]);
      expect(h.released()).toEqual([0]);
      // The cancel goes out before the attempt is released.
      expect(h.kinds().indexOf("cancel")).toBeLessThan(h.kinds().indexOf("released"));
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      expect(h.snapshot().context.lastAttemptFailure).toBe("first_byte_timeout");
      expect(h.of("open").map((a) => [a.attemptN, a.providerId])).toEqual([
        [0, "p1"],
        [1, "p2"],
      ]);
      h.commit();
      expect(h.jobs()).toEqual([
        [0, "p1"],
        [1, "p2"],
      ]);
    });

    test("the next attempt gets a fresh first-byte timer", async () => {
      const h = await start({ providers: ["p1", "p2"] });
      h.increment(FIRST_BYTE_MS);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      h.increment(FIRST_BYTE_MS - 1);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      h.chunk(0, 1, "x");
      h.increment(FIRST_BYTE_MS * 3);
      expect(h.snapshot().value).toBe("receiving");
    });

    test.each<[string, (h: RequestEdge) => void]>([
      ["declined queue_full", (h) => h.decline("queue_full")],
      ["declined model_not_loaded", (h) => h.decline("model_not_loaded")],
      ["the provider's socket lost", (h) => h.lose()],
      ["ended provider_error", (h) => h.end("provider_error", null)],
      ["ended upstream_transport_disconnect", (h) => h.end("upstream_transport_disconnect", null)],
    ])("%s before the first byte fails over to the next provider", async (_, fail) => {
      const h = await start({ providers: ["p1", "p2"] });
      fail(h);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current).toEqual({ attemptN: 1, sessionId: "sess-2", providerId: "p2" });
      expect(h.jobs()).toEqual([
        [0, "p1"],
        [1, "p2"],
      ]);
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      expect(h.released()).toEqual([0]);
      // The provider already stopped: no cancel is sent.
      expect(h.cancels()).toEqual([]);

      h.chunk(0, 1, "ok");
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.relayed()).toEqual([[1, 0]]);
    });

    test("maxAttempts exhausted → failed with coordinator_unavailable, the buyer failed once", async () => {
      const h = await start({ providers: ["p1", "p2", "p3", "p4"], maxAttempts: 3 });
      h.lose();
      h.decline("internal");
      h.lose();

      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().status).toBe("done");
      expect(h.jobs()).toEqual([
        [0, "p1"],
        [1, "p2"],
        [2, "p3"],
      ]);
      expect(h.snapshot().context.excludedProviders).toEqual(["p1", "p2", "p3"]);
      expect(h.released()).toEqual([0, 1, 2]);
      expect(h.of("fail").map((f) => f.failure)).toEqual([{ code: "coordinator_unavailable", message: ATTEMPTS_EXHAUSTED_MESSAGE }]);
      expect(h.of("succeed")).toHaveLength(0);
    });

    test("maxAttempts 1 means no failover at all", async () => {
      const h = await start({ providers: ["p1", "p2"], maxAttempts: 1 });
      h.increment(FIRST_BYTE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.jobs()).toHaveLength(1);
      expect(h.of("fail").map((f) => f.failure.code)).toEqual(["coordinator_unavailable"]);
    });

    test.each<[string, Partial<EdgeOptions>, RequestFailure]>([
      ["no provider serves the model", { model: "unknown-model" }, { code: "model_not_available", message: unavailableMessages.model_not_available("unknown-model") }],
      ["every provider of the model is asleep", { asleep: ["p1"] }, { code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() }],
    ])("routing unavailable (%s) → failed with the router's code", async (_, options, failure) => {
      const h = await start({ providers: ["p1"], ...options });
      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().context.failure).toEqual(failure);
      expect(h.of("fail").map((f) => f.failure)).toEqual([failure]);
      expect(h.jobs()).toEqual([]);
      expect(h.cancels()).toEqual([]);
    });

    test("routing unavailable on a later attempt keeps the router's code and message", async () => {
      const h = await start({ providers: ["p1"] });
      expect(h.snapshot().context.current?.providerId).toBe("p1");
      h.decline("queue_full");
      const failure: RequestFailure = { code: "coordinator_unavailable", message: unavailableMessages.coordinator_unavailable() };
      expect(h.snapshot().value).toBe("failed");
      expect(h.snapshot().context.failure).toEqual(failure);
      expect(h.of("fail").map((f) => f.failure)).toEqual([failure]);
    });
  });

  describe("after the first byte", () => {
    test.each<[string, (h: RequestEdge) => void]>([
      ["the provider's socket lost", (h) => h.lose()],
      ["ended provider_error", (h) => h.end("provider_error", null)],
    ])("streaming: %s after the first chunk → failedMidStream, no failover", async (_, fail) => {
      const h = await start({ providers: ["p1", "p2"] });
      h.chunk(0, 1, "partial");
      fail(h);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.of("failMidStream").map((f) => f.failure.code)).toEqual(["provider_disconnected"]);
      expect(h.of("fail")).toHaveLength(0);
      expect(h.of("discard")).toHaveLength(0);
      expect(h.jobs()).toHaveLength(1);
      expect(h.released()).toEqual([0]);
    });

    test("non-streaming: loss after a chunk discards the partial output and fails over", async () => {
      const h = await start({ providers: ["p1", "p2"], streaming: false });
      h.chunk(0, 3, "abc");
      h.lose();

      expect(h.of("discard")).toHaveLength(1);
      expect(h.of("discarded").map((d) => d.attemptN)).toEqual([0]);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      expect(h.meter(0).deliveredTokens).toBe(0);
      expect(h.meter(0).deliveredBytes).toBe(0);

      h.chunk(0, 2, "xy");
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.meter(1).deliveredTokens).toBe(2);
      expect(h.of("succeed").map((s) => s.completionTokens)).toEqual([2]);
      expect(h.of("failMidStream")).toHaveLength(0);
      expect(h.released()).toEqual([0, 1]);
    });

    test("non-streaming: failing after output on the last attempt → failed (not mid-stream)", async () => {
      const h = await start({ providers: ["p1"], streaming: false, maxAttempts: 1 });
      h.chunk(0, 1, "a");
      h.end("provider_error", null);
      expect(h.snapshot().value).toBe("failed");
      expect(h.of("discard")).toHaveLength(1);
      expect(h.of("fail")).toHaveLength(1);
    });
  });

  // A cluster node woken from a stall past half its lease: its sockets may be read before its fence
  // timer runs, and a survivor may have resolved the attempt meanwhile (docs/scale-out.md, "Fencing").
  describe("a cluster node that notices its stall on a provider frame", () => {
    test("streaming: the frame is not relayed; the stream ends in-band, never with a success", async () => {
      let stalled = false;
      const h = await start({ providers: ["p1", "p2"], stalled: () => stalled });
      h.chunk(0, 1, "before");
      stalled = true;
      h.chunk(1, 1, "after");
      h.end();
      expect(h.of("relay").map((r) => r.content)).toEqual(["before"]);
      expect(h.of("failMidStream").map((f) => f.failure.code)).toEqual(["provider_disconnected"]);
      expect(h.of("succeed")).toHaveLength(0);
      expect(h.jobs()).toHaveLength(1);
    });

    test("non-streaming: the answer is not delivered and nothing fails over", async () => {
      let stalled = false;
      const h = await start({ providers: ["p1", "p2"], streaming: false, stalled: () => stalled });
      h.chunk(0, 2, "ab");
      stalled = true;
      h.end();
      expect(h.of("succeed")).toHaveLength(0);
      expect(h.of("fail")).toHaveLength(1);
      expect(h.jobs()).toHaveLength(1);
    });
  });

  describe("buyer abort", () => {
    const noFinish = (h: RequestEdge) => {
      for (const finish of ["succeed", "fail", "failMidStream"] as const) expect(h.of(finish)).toHaveLength(0);
    };

    test.each<[string, "awaitingFirstByte" | "receiving", string[], (h: RequestEdge) => void, number]>([
      ["awaitingFirstByte", "awaitingFirstByte", ["p1"], () => {}, 0],
      ["receiving", "receiving", ["p1"], (h) => h.chunk(0, 1, "a"), 0],
      ["awaitingFirstByte after a failover", "awaitingFirstByte", ["p1", "p2"], (h) => h.lose(), 1],
    ])("buyer aborts in %s → cancelled, the attempt cancelled (buyer_cancel) and released", async (_, state, providers, reach, attemptN) => {
      const h = await start({ providers });
      reach(h);
      expect(h.snapshot().value).toBe(state);
      h.abort();

      expect(h.snapshot().value).toBe("cancelled");
      expect(h.snapshot().status).toBe("done");
      expect(h.cancels()).toEqual([[attemptN, "buyer_cancel"]]);
      expect(h.effects.at(-1)).toEqual({ kind: "released", attemptN });
      noFinish(h);
    });

    test("buyer aborts in routing → cancelled; the job never leaves and its slot is released once the snapshot commits", async () => {
      const h = await start({ providers: ["p1"], holdCommits: true });
      expect(h.snapshot().value).toBe("routing");
      h.abort();
      expect(h.snapshot().value).toBe("cancelled");
      expect(h.snapshot().status).toBe("done");
      expect(h.cancels()).toEqual([]);
      h.commit();
      expect(h.jobs()).toEqual([]);
      expect(h.released()).toEqual([0]);
      expect(h.registry.attempts.size).toBe(0);
      noFinish(h);
    });

    test("a non-streaming buyer abort after output cancels too", async () => {
      const h = await start({ providers: ["p1"], streaming: false });
      h.chunk(0, 1, "a");
      h.abort();
      expect(h.snapshot().value).toBe("cancelled");
      expect(h.cancels()).toEqual([[0, "buyer_cancel"]]);
    });

    test("events after a final state change nothing", async () => {
      const h = await start({ providers: ["p1"] });
      h.abort();
      const before = h.effects.length;
      h.chunk(0, 1, "late");
      h.abort();
      h.increment(DEADLINE_MS * 2);
      expect(h.effects.length).toBe(before);
      expect(h.snapshot().value).toBe("cancelled");
      // The late chunk's attempt was released: the endpoint drops it.
      expect(h.registry.ignoredFrames).toBe(1);
    });
  });

  describe("sequence numbers", () => {
    test("first chunk out of order is a provider failure: cancel and fail over", async () => {
      const h = await start({ providers: ["p1", "p2"] });
      h.chunk(1, 1, "skipped seq 0");
      expect(h.of("relay")).toHaveLength(0);
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      // The next attempt starts counting seq from 0 again.
      h.chunk(0, 1, "ok");
      expect(h.snapshot().value).toBe("receiving");
    });

    test("streaming: a repeated seq after output → failedMidStream, attempt cancelled", async () => {
      const h = await start({ providers: ["p1", "p2"] });
      h.chunk(0, 1, "a");
      h.chunk(0, 1, "a again");
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.of("relay")).toHaveLength(1);
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
      expect(h.jobs()).toHaveLength(1);
    });

    test("non-streaming: a gap in seq after output discards and fails over", async () => {
      const h = await start({ providers: ["p1", "p2"], streaming: false });
      h.chunk(0, 1, "a");
      h.chunk(2, 1, "c");
      expect(h.of("discard")).toHaveLength(1);
      expect(h.snapshot().context.current?.providerId).toBe("p2");
      expect(h.snapshot().context.lastAttemptFailure).toBe("stream.seqError");
    });
  });

  describe("max_tokens", () => {
    test("a chunk that would exceed maxTokens → succeeded, lengthLimited, attempt cancelled, chunk not relayed", async () => {
      const h = await start({ providers: ["p1"], maxTokens: 5 });
      h.chunk(0, 3, "abc");
      h.chunk(1, 3, "def");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.meter(0).deliveredTokens).toBe(3);
      expect(h.meter(0).deliveredBytes).toBe(3);
      expect(streamEvents(h)).toEqual(["stream.lengthLimited"]);
      expect(h.relayed()).toEqual([[0, 0]]);
      expect(h.of("cancel")).toEqual([{ kind: "cancel", attemptN: 0, providerId: "p1", reason: "gateway_timeout", deliveredOutputBytes: 3 }]);
      // No `end` came: the prompt tokens are not reported.
      expect(h.of("succeed")).toEqual([{ kind: "succeed", finishReason: "length", promptTokens: 0, completionTokens: 3 }]);
      expect(h.released()).toEqual([0]);
    });

    test("a chunk that exactly reaches maxTokens is relayed", async () => {
      const h = await start({ providers: ["p1"], maxTokens: 5 });
      h.chunk(0, 5, "abcde");
      expect(h.snapshot().value).toBe("receiving");
      h.end("normal_done", "length");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(false);
      expect(h.cancels()).toEqual([]);
    });

    test("a first chunk over maxTokens succeeds length-limited with nothing relayed", async () => {
      const h = await start({ providers: ["p1"], maxTokens: 2 });
      h.chunk(0, 3, "abc");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.of("relay")).toHaveLength(0);
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
    });
  });

  describe("request deadline", () => {
    test("streaming, committed: deadline → failedMidStream with a gateway_timeout cancel", async () => {
      const h = await start({ providers: ["p1"] });
      h.chunk(0, 1, "a");
      h.increment(DEADLINE_MS - 1);
      expect(h.snapshot().value).toBe("receiving");
      h.increment(1);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
      expect(h.of("failMidStream")).toHaveLength(1);
      expect(h.released()).toEqual([0]);
    });

    test("before the first byte: deadline → failed with coordinator_unavailable", async () => {
      const h = await start({ providers: ["p1"], firstByteTimeoutMs: DEADLINE_MS * 2 });
      h.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
      expect(h.of("fail").map((f) => f.failure.code)).toEqual(["coordinator_unavailable"]);
      expect(h.snapshot().context.failure?.code).toBe("coordinator_unavailable");
    });

    test("non-streaming with partial output: deadline → failed, not mid-stream", async () => {
      const h = await start({ providers: ["p1"], streaming: false });
      h.chunk(0, 1, "a");
      h.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.of("fail")).toHaveLength(1);
      expect(h.of("failMidStream")).toHaveLength(0);
    });

    test("the deadline runs from the request's start, across failovers", async () => {
      const h = await start({ providers: ["p1", "p2", "p3", "p4"], maxAttempts: 10, firstByteTimeoutMs: 25_000 });
      h.increment(25_000); // attempt 0 times out
      h.increment(25_000); // attempt 1 times out
      expect(h.snapshot().context.current?.attemptN).toBe(2);
      h.increment(DEADLINE_MS - 50_000);
      expect(h.snapshot().value).toBe("failed");
      expect(h.cancels()).toEqual([
        [0, "gateway_timeout"],
        [1, "gateway_timeout"],
        [2, "gateway_timeout"],
      ]);
      expect(h.jobs()).toHaveLength(3);
    });

    test("while routing (nothing dispatched): deadline → failed; the job never leaves", async () => {
      const h = await start({ providers: ["p1"], holdCommits: true });
      h.increment(DEADLINE_MS);
      expect(h.snapshot().value).toBe("failed");
      expect(h.cancels()).toEqual([]);
      expect(h.of("fail")).toHaveLength(1);
      h.commit();
      expect(h.jobs()).toEqual([]);
      expect(h.released()).toEqual([0]);
    });
  });

  describe("a provider going silent after its first chunk (the idle watchdog)", () => {
    // T = the configured stall limit; the machine checks every T/2 and fails after two silent windows.
    const T = 10_000;
    const WINDOW = streamIdleCheckMs(T);
    const LONG_DEADLINE = { streamIdleTimeoutMs: T, requestDeadlineMs: 100 * T };
    const IDLE_CHECK = "xstate.after.streamIdleCheck.request.receiving";

    /** Advances in 1 ms steps until the stream stalls; the time since the last chunk when it did. */
    const msUntilStall = (h: RequestEdge, limit = 3 * T): number => {
      for (let ms = 1; ms <= limit; ms++) {
        h.increment(1);
        if (h.snapshot().value !== "receiving") return ms;
      }
      throw new Error("no stall detected");
    };

    test("silence right after the first chunk ends the stream mid-stream at 1.5 × T, with a gateway_timeout cancel", async () => {
      const h = await start({ providers: ["p1"], ...LONG_DEADLINE });
      h.chunk(0, 1, "a");
      expect(msUntilStall(h)).toBe(3 * WINDOW);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.of("cancel")).toEqual([{ kind: "cancel", attemptN: 0, providerId: "p1", reason: "gateway_timeout", deliveredOutputBytes: 1 }]);
      expect(h.of("failMidStream")).toHaveLength(1);
      expect(h.released()).toEqual([0]);
    });

    // The last chunk anywhere in a window: at the window's start, middle, last millisecond, and in a
    // later window (after the first chunk's).
    test.each([0, 1, WINDOW / 2, WINDOW - 1, WINDOW + 1, 3 * WINDOW - 1])(
      "a stall after a chunk at %i ms into the stream is detected in (T, 1.5 × T]",
      async (lastChunkAt) => {
        const h = await start({ providers: ["p1"], ...LONG_DEADLINE });
        h.chunk(0, 1, "a");
        h.advance(lastChunkAt);
        h.chunk(1, 1, "b");
        expect(h.snapshot().value).toBe("receiving");
        const waited = msUntilStall(h);
        expect(waited).toBeGreaterThan(T);
        expect(waited).toBeLessThanOrEqual(1.5 * T);
        expect(h.snapshot().value).toBe("failedMidStream");
        expect(h.of("cancel")).toEqual([{ kind: "cancel", attemptN: 0, providerId: "p1", reason: "gateway_timeout", deliveredOutputBytes: 2 }]);
        expect(h.of("failMidStream").map((f) => f.failure.code)).toEqual(["provider_disconnected"]);
      },
    );

    test("steady chunks keep a long stream alive; progress reaches the machine at most once per window", async () => {
      const h = await start({ providers: ["p1"], ...LONG_DEADLINE });
      const every = 250;
      const total = 20 * T;
      h.chunk(0, 0, "a");
      // 250 ms steps land exactly on every window boundary (see `advance` for why that matters).
      for (let seq = 1; seq * every <= total; seq++) {
        h.increment(every);
        h.chunk(seq, 0, "b");
      }
      expect(h.snapshot().value).toBe("receiving");
      expect(h.of("relay")).toHaveLength(total / every + 1);
      // One report per window after the first (whose progress was the first chunk itself), never more.
      const windows = Math.floor(total / WINDOW);
      const progress = h.events.filter((e) => e.type === "stream.progress");
      expect(progress.length).toBeLessThanOrEqual(windows);
      expect(progress.length).toBeGreaterThanOrEqual(windows - 1);
      const perWindow = new Map<number, number>();
      for (const p of progress) perWindow.set(Math.floor(p.at / WINDOW), (perWindow.get(Math.floor(p.at / WINDOW)) ?? 0) + 1);
      expect(Math.max(...perWindow.values())).toBe(1);
      // Each window closed (and re-opened reporting) once; the stream still ends normally.
      expect(h.events.filter((e) => e.type === IDLE_CHECK)).toHaveLength(windows);
      h.end();
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.cancels()).toEqual([]);
    });

    test("one late chunk resets the watchdog: a full stall period is needed again", async () => {
      const h = await start({ providers: ["p1"], ...LONG_DEADLINE });
      h.chunk(0, 1, "a");
      // Just before the stall would be declared (at 3 windows), one chunk arrives.
      h.advance(3 * WINDOW - 1);
      h.chunk(1, 1, "b");
      expect(streamEvents(h)).toEqual(["stream.progress"]);
      const waited = msUntilStall(h);
      expect(waited).toBeGreaterThan(T);
      expect(waited).toBeLessThanOrEqual(1.5 * T);
      expect(h.snapshot().value).toBe("failedMidStream");
    });

    test("a window without a chunk between two with chunks is not a stall", async () => {
      const h = await start({ providers: ["p1"], ...LONG_DEADLINE });
      h.chunk(0, 1, "a");
      // Chunks at the start of every other window: at most one silent window in a row.
      for (let seq = 1; seq <= 10; seq++) {
        h.advance(2 * WINDOW);
        h.chunk(seq, 1, "b");
      }
      expect(h.snapshot().value).toBe("receiving");
    });

    test("the watchdog is not running before the first chunk (the first-byte timeout is)", async () => {
      const h = await start({ providers: ["p1"], ...LONG_DEADLINE, firstByteTimeoutMs: 10 * T });
      h.increment(5 * T);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.events.filter((e) => e.type === IDLE_CHECK)).toHaveLength(0);
    });

    test("non-streaming: silence after partial output fails over to another provider", async () => {
      const h = await start({ providers: ["p1", "p2"], streaming: false, ...LONG_DEADLINE });
      h.chunk(0, 1, "a");
      h.chunk(1, 2, "bc");
      h.advance(3 * WINDOW);
      expect(h.snapshot().value).toBe("awaitingFirstByte");
      expect(h.jobs().at(-1)).toEqual([1, "p2"]);
      expect(h.snapshot().context.excludedProviders).toEqual(["p1"]);
      expect(h.of("discard")).toHaveLength(1);
      // Nothing of a discarded non-streaming attempt counts as delivered.
      expect(h.of("cancel")).toEqual([{ kind: "cancel", attemptN: 0, providerId: "p1", reason: "gateway_timeout", deliveredOutputBytes: 0 }]);
      // The new attempt counts from zero.
      expect(h.meter(1).deliveredTokens).toBe(0);
      h.chunk(0, 1, "x");
      expect(h.snapshot().value).toBe("receiving");
    });
  });

  describe("later chunks judged at the edge", () => {
    test("streaming: a bad seq after output → failedMidStream with a gateway_timeout cancel, chunk not relayed", async () => {
      const h = await start({ providers: ["p1", "p2"] });
      h.chunk(0, 1, "a");
      h.chunk(1, 1, "b");
      h.chunk(3, 1, "skipped 2");
      expect(streamEvents(h)).toEqual(["stream.seqError"]);
      expect(h.snapshot().value).toBe("failedMidStream");
      expect(h.relayed()).toEqual([
        [0, 0],
        [0, 1],
      ]);
      expect(h.cancels()).toEqual([[0, "gateway_timeout"]]);
      expect(h.of("failMidStream").map((f) => f.failure.code)).toEqual(["provider_disconnected"]);
      expect(h.jobs()).toHaveLength(1);
    });

    test("the length cap ends the request successfully with only the relayed tokens counted", async () => {
      const h = await start({ providers: ["p1"], maxTokens: 4 });
      h.chunk(0, 1, "a");
      h.chunk(1, 2, "bc");
      h.chunk(2, 2, "de");
      expect(h.snapshot().value).toBe("succeeded");
      expect(h.snapshot().context.lengthLimited).toBe(true);
      expect(h.meter(0).deliveredTokens).toBe(3);
      expect(h.kinds().filter((k) => k !== "relay" && k !== "job" && k !== "open")).toEqual(["cancel", "cancelSent", "released", "succeed"]);
    });
  });

  test("a dispatch that throws (a job too deeply nested to encode) ends the request as an internal error, not a crash", async () => {
    let nested: unknown = "x";
    for (let i = 0; i < 100_000; i++) nested = [nested];
    const h = await start({ providers: ["p1"], messages: [{ role: "user", content: nested }] });
    expect(h.snapshot().value).toBe("failed");
    expect(h.snapshot().context.failure?.code).toBe("internal_error");
    expect(h.of("fail").map((f) => f.failure.code)).toEqual(["internal_error"]);
    // The job never left and no slot was taken.
    expect(h.jobs()).toEqual([]);
    expect(h.registry.attempts.size).toBe(0);
  });
});

// Checks of the actor alone: no edge is needed.
test("the idle check window is half the stall limit, rounded up", () => {
  expect(streamIdleCheckMs(10_000)).toBe(5_000);
  expect(streamIdleCheckMs(801)).toBe(401);
  expect(streamIdleCheckMs(1)).toBe(1);
});

describe.each(VARIANTS)("%s alone", (_, logic) => {
  // The edge sends stream events only for an attempt whose first chunk the actor took; the actor must
  // still ignore them anywhere else.
  test("stream events outside `receiving` change nothing", () => {
    const ran: string[] = [];
    const names: (keyof RequestActions)[] = ["dispatchAttempt", "abandonDispatch", "relayChunk", "openProgressWindow", "discardPartialOutput", "keepAnswer", "finishSuccess", "finishFailure", "finishMidStreamError", "cancelAttempt", "releaseAttempt"];
    const actions = Object.fromEntries(names.map((name) => [name, () => void ran.push(name)])) as unknown as RequestActions;
    const delays: RequestDelays = { firstByteTimeout: FIRST_BYTE_MS, streamIdleCheck: streamIdleCheckMs(120_000), requestDeadline: DEADLINE_MS };
    const actor = createActor(logic(actions, delays), { input: { requestId: "req_1", streaming: true, maxTokens: 100, maxAttempts: 3 } }).start();
    actor.send({ type: "route.dispatched", attempt: { attemptN: 0, sessionId: "s", providerId: "p1" } } satisfies RequestEvent);
    const before = actor.getSnapshot();
    ran.length = 0;
    for (const type of ["stream.progress", "stream.seqError", "stream.lengthLimited"] as const) actor.send({ type });
    expect(actor.getSnapshot().value).toBe("awaitingFirstByte");
    expect(actor.getSnapshot().context).toEqual(before.context);
    expect(ran).toEqual([]);
    actor.stop();
  });
});
