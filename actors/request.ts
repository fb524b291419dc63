// actors/request.ts — one buyer request:
//   routing → awaitingFirstByte(attempt n) → receiving → succeeded | failed | failedMidStream | cancelled
// Failover (back to routing, failed provider excluded) is possible until the first buyer-visible byte;
// a streaming request commits at its first relayed delta, a non-streaming one only when its body is written.
//
// Only an attempt's first chunk is an event here (it changes state: awaitingFirstByte → receiving, and a
// stream commits). Later chunks stay at the edge (src/gateway/chunkMeter.ts checks their seq and the
// max_tokens cap, counts them and relays them), which tells this machine only what changes its state:
// `stream.seqError`, `stream.lengthLimited`, and `stream.progress` at most once per idle-check window.
// A per-chunk event with a re-armed stall timer was 65 % of the gateway's CPU at 384 live streams.
import { assign, setup } from "xstate";
import type { ChunkFrame, DeclineCode, EndFrame } from "../src/wire/frames.ts";

export type FailureCode =
  | "internal_error"
  | "model_not_available"
  | "coordinator_unavailable"
  | "context_length_exceeded"
  | "unsupported_parameter";

export interface AttemptRef {
  attemptN: number;
  sessionId: string;
  providerId: string;
}

export interface RequestInput {
  requestId: string;
  streaming: boolean;
  maxTokens: number;
  maxAttempts: number;
}

export interface RequestContext extends RequestInput {
  nextAttemptN: number;
  current: AttemptRef | null;
  excludedProviders: string[];
  committed: boolean;
  /** Whether the current idle-check window saw a chunk (the first chunk, or a `stream.progress`). */
  progressInWindow: boolean;
  /** Idle-check windows in a row that ended without a chunk. */
  idleWindows: number;
  lengthLimited: boolean;
  failure: { code: FailureCode; message: string } | null;
  lastAttemptFailure: string | null;
}

export type RequestEvent =
  | { type: "route.dispatched"; attempt: AttemptRef }
  | { type: "route.unavailable"; code: FailureCode; message: string }
  /** Dispatching hit an internal error (a bug): this request fails, nothing else. */
  | { type: "route.failed" }
  /** The gateway refused the attempt's `accepted` measurement (hash ≠ the catalog's): fail over. */
  | { type: "provider.rejected" }
  | { type: "provider.declined"; code: DeclineCode }
  /** An attempt's first chunk (later ones stay at the edge). */
  | { type: "provider.chunk"; frame: ChunkFrame }
  /** A later chunk arrived in this idle-check window (sent at most once per window). */
  | { type: "stream.progress" }
  /** A later chunk carried the wrong seq: a provider failure. */
  | { type: "stream.seqError" }
  /** A later chunk would take the delivered tokens past max_tokens: it is not relayed. */
  | { type: "stream.lengthLimited" }
  | { type: "provider.ended"; frame: EndFrame }
  | { type: "provider.lost" }
  | { type: "buyer.aborted" };

export interface DispatchInput {
  requestId: string;
  attemptN: number;
  excludedProviders: string[];
}

/**
 * The `streamIdleCheck` delay for a stall limit T: half of it (rounded up), so that failing after two
 * consecutive check windows without a chunk detects a stall after more than T and at most 1.5 × T.
 */
export const streamIdleCheckMs = (streamIdleTimeoutMs: number): number => Math.max(1, Math.ceil(streamIdleTimeoutMs / 2));

/** Consecutive idle-check windows without a chunk after which a running attempt has stalled. */
const STALL_WINDOWS = 2;

export const requestMachine = setup({
  types: {
    context: {} as RequestContext,
    events: {} as RequestEvent,
    input: {} as RequestInput,
  },
  guards: {
    mayRetry: ({ context }) => context.nextAttemptN < context.maxAttempts,
    endedNormally: ({ event }) => event.type === "provider.ended" && event.frame.terminal_state === "normal_done",
    committed: ({ context }) => context.committed,
    // The first chunk of an attempt: seq 0, and nothing delivered yet (the edge's ChunkMeter applies the
    // same two rules, in the same order, to every later chunk).
    seqOutOfOrder: ({ event }) => event.type === "provider.chunk" && event.frame.seq !== 0,
    exceedsMaxTokens: ({ context, event }) => event.type === "provider.chunk" && event.frame.tokens > context.maxTokens,
    // Checked when a window closes: this one saw no chunk, and the ones before it make STALL_WINDOWS.
    stalled: ({ context }) => !context.progressInWindow && context.idleWindows + 1 >= STALL_WINDOWS,
  },
  actions: {
    // Effects, provided at the edge: write to the buyer, talk to the provider session.
    // Picks a provider and sends it the job; the edge answers with route.dispatched, route.unavailable
    // or route.failed. An entry action, not an invoked actor: a child actor per attempt cost more than
    // the dispatch itself.
    dispatchAttempt: (_, _params: DispatchInput) => {},
    // Leaving `routing` before the edge answered (buyer gone, deadline): the job must not leave.
    abandonDispatch: () => {},
    // Relays the attempt's first chunk (and starts the edge's count of the attempt).
    relayChunk: (_, _params: { frame: ChunkFrame }) => {},
    // Lets the edge report the next chunk as progress: a new idle-check window starts.
    openProgressWindow: () => {},
    discardPartialOutput: () => {},
    finishSuccess: () => {},
    finishFailure: () => {},
    finishMidStreamError: () => {},
    cancelAttempt: (_, _params: { reason: "buyer_cancel" | "gateway_timeout" }) => {},
    releaseAttempt: () => {},

    recordDispatch: assign(({ context, event }) => {
      if (event.type !== "route.dispatched") return {};
      return { current: event.attempt, nextAttemptN: context.nextAttemptN + 1 };
    }),
    recordUnavailable: assign(({ event }) =>
      event.type === "route.unavailable" ? { failure: { code: event.code, message: event.message } } : {},
    ),
    // The first chunk is relayed: a stream commits, and the first idle-check window has seen a chunk.
    recordFirstChunk: assign(({ context }) => ({ committed: context.streaming, progressInWindow: true, idleWindows: 0 })),
    recordProgress: assign({ progressInWindow: true }),
    closeIdleWindow: assign(({ context }) => ({
      idleWindows: context.progressInWindow ? 0 : context.idleWindows + 1,
      progressInWindow: false,
    })),
    markLengthLimited: assign({ lengthLimited: true }),
    recordDispatchError: assign({
      failure: { code: "internal_error" as const, message: "The gateway hit an internal error. Retry the request." },
    }),
    excludeCurrentProvider: assign(({ context, event }) => ({
      excludedProviders: context.current ? [...context.excludedProviders, context.current.providerId] : context.excludedProviders,
      lastAttemptFailure: event.type.startsWith("provider.") || event.type.startsWith("stream.") ? event.type : "first_byte_timeout",
      current: null,
    })),
    recordAttemptsExhausted: assign(({ context }) => ({
      failure: context.failure ?? {
        code: "coordinator_unavailable" as const,
        message: "No provider could serve this request right now. Retry shortly.",
      },
    })),
  },
  delays: {
    firstByteTimeout: 30_000,
    // The idle watchdog's window once output has started: streamIdleCheckMs(streamIdleTimeoutMs), the
    // default for a 60 s stall limit. A stall is two windows in a row without a chunk.
    streamIdleCheck: 30_000,
    requestDeadline: 300_000,
  },
}).createMachine({
  id: "request",
  context: ({ input }) => ({
    ...input,
    nextAttemptN: 0,
    current: null,
    excludedProviders: [],
    committed: false,
    progressInWindow: false,
    idleWindows: 0,
    lengthLimited: false,
    failure: null,
    lastAttemptFailure: null,
  }),
  initial: "routing",
  after: {
    requestDeadline: [
      {
        guard: "committed",
        target: ".failedMidStream",
        actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
      },
      {
        target: ".failed",
        actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "recordAttemptsExhausted"],
      },
    ],
  },
  on: {
    "buyer.aborted": {
      target: ".cancelled",
      actions: [{ type: "cancelAttempt", params: { reason: "buyer_cancel" } }],
    },
  },
  states: {
    routing: {
      entry: {
        type: "dispatchAttempt",
        params: ({ context }) => ({
          requestId: context.requestId,
          attemptN: context.nextAttemptN,
          excludedProviders: context.excludedProviders,
        }),
      },
      exit: "abandonDispatch",
      on: {
        "route.failed": { target: "failed", actions: "recordDispatchError" },
        "route.dispatched": { target: "awaitingFirstByte", actions: "recordDispatch" },
        "route.unavailable": { target: "failed", actions: "recordUnavailable" },
      },
    },
    awaitingFirstByte: {
      after: {
        firstByteTimeout: {
          target: "attemptFailed",
          actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
        },
      },
      on: {
        "provider.declined": "attemptFailed",
        "provider.rejected": {
          target: "attemptFailed",
          actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
        },
        "provider.lost": "attemptFailed",
        "provider.chunk": [
          { guard: "seqOutOfOrder", target: "attemptFailed", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }] },
          { guard: "exceedsMaxTokens", target: "succeeded", actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "markLengthLimited"] },
          {
            target: "receiving",
            actions: ["recordFirstChunk", { type: "relayChunk", params: ({ event }) => ({ frame: (event as { frame: ChunkFrame }).frame }) }],
          },
        ],
        "provider.ended": [{ guard: "endedNormally", target: "succeeded" }, { target: "attemptFailed" }],
      },
    },
    receiving: {
      // The idle watchdog: one timer per window, not one re-armed per chunk. A chunk in a window counts
      // for that window, so the last chunk is followed by two full silent windows before the stall is
      // declared: more than 2 × streamIdleCheck, at most 3 × it after the last chunk.
      after: {
        streamIdleCheck: [
          {
            guard: "stalled",
            target: "providerFailedAfterOutput",
            actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
          },
          { target: "receiving", reenter: true, actions: ["closeIdleWindow", "openProgressWindow"] },
        ],
      },
      on: {
        "stream.progress": { actions: "recordProgress" },
        "stream.seqError": {
          target: "providerFailedAfterOutput",
          actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
        },
        "stream.lengthLimited": {
          target: "succeeded",
          actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "markLengthLimited"],
        },
        "provider.ended": [{ guard: "endedNormally", target: "succeeded" }, { target: "providerFailedAfterOutput" }],
        "provider.lost": "providerFailedAfterOutput",
      },
    },
    providerFailedAfterOutput: {
      always: [{ guard: "committed", target: "failedMidStream" }, { target: "attemptFailed", actions: "discardPartialOutput" }],
    },
    attemptFailed: {
      entry: ["releaseAttempt", "excludeCurrentProvider"],
      always: [{ guard: "mayRetry", target: "routing" }, { target: "failed", actions: "recordAttemptsExhausted" }],
    },
    succeeded: { type: "final", entry: ["releaseAttempt", "finishSuccess"] },
    failed: { type: "final", entry: ["releaseAttempt", "finishFailure"] },
    failedMidStream: { type: "final", entry: ["releaseAttempt", "finishMidStreamError"] },
    cancelled: { type: "final", entry: ["releaseAttempt"] },
  },
});

export type RequestMachine = typeof requestMachine;
