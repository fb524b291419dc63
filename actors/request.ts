// actors/request.ts — one buyer request:
//   routing → awaitingFirstByte(attempt n) → receiving → succeeded | failed | failedMidStream | cancelled
// Failover (back to routing, failed provider excluded) is possible until the first buyer-visible byte;
// a streaming request commits at its first relayed delta, a non-streaming one only when its body is written.
import { assign, fromCallback, setup } from "xstate";
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
  expectedSeq: number;
  deliveredTokens: number;
  deliveredBytes: number;
  lengthLimited: boolean;
  failure: { code: FailureCode; message: string } | null;
  lastAttemptFailure: string | null;
}

export type RequestEvent =
  | { type: "route.dispatched"; attempt: AttemptRef }
  | { type: "route.unavailable"; code: FailureCode; message: string }
  | { type: "provider.accepted"; modelHash: string }
  /** The gateway refused the attempt's `accepted` measurement (hash ≠ the catalog's): fail over. */
  | { type: "provider.rejected" }
  | { type: "provider.declined"; code: DeclineCode }
  | { type: "provider.chunk"; frame: ChunkFrame }
  | { type: "provider.ended"; frame: EndFrame }
  | { type: "provider.lost" }
  | { type: "buyer.aborted" };

export interface DispatchInput {
  requestId: string;
  attemptN: number;
  excludedProviders: string[];
}

const utf8Length = (text: string): number => Buffer.byteLength(text, "utf8");

export const requestMachine = setup({
  types: {
    context: {} as RequestContext,
    events: {} as RequestEvent,
    input: {} as RequestInput,
  },
  actors: {
    // Picks a provider and sends it the job; answers with route.dispatched or route.unavailable.
    dispatchAttempt: fromCallback<RequestEvent, DispatchInput>(() => {
      throw new Error("provide dispatchAttempt");
    }),
  },
  guards: {
    mayRetry: ({ context }) => context.nextAttemptN < context.maxAttempts,
    endedNormally: ({ event }) => event.type === "provider.ended" && event.frame.terminal_state === "normal_done",
    committed: ({ context }) => context.committed,
    seqOutOfOrder: ({ context, event }) => event.type === "provider.chunk" && event.frame.seq !== context.expectedSeq,
    exceedsMaxTokens: ({ context, event }) =>
      event.type === "provider.chunk" && context.deliveredTokens + event.frame.tokens > context.maxTokens,
  },
  actions: {
    // Effects, provided at the edge: write to the buyer, talk to the provider session.
    relayChunk: (_, _params: { frame: ChunkFrame }) => {},
    discardPartialOutput: () => {},
    finishSuccess: () => {},
    finishFailure: () => {},
    finishMidStreamError: () => {},
    cancelAttempt: (_, _params: { reason: "buyer_cancel" | "gateway_timeout" }) => {},
    releaseAttempt: () => {},

    recordDispatch: assign(({ context, event }) => {
      if (event.type !== "route.dispatched") return {};
      return { current: event.attempt, nextAttemptN: context.nextAttemptN + 1, expectedSeq: 0 };
    }),
    recordUnavailable: assign(({ event }) =>
      event.type === "route.unavailable" ? { failure: { code: event.code, message: event.message } } : {},
    ),
    countDelivered: assign(({ context, event }) => {
      if (event.type !== "provider.chunk") return {};
      const { frame } = event;
      return {
        expectedSeq: context.expectedSeq + 1,
        deliveredTokens: context.deliveredTokens + frame.tokens,
        deliveredBytes: context.deliveredBytes + (frame.content ? utf8Length(frame.content) : 0),
        committed: context.streaming,
      };
    }),
    markLengthLimited: assign({ lengthLimited: true }),
    recordDispatchError: assign({
      failure: { code: "internal_error" as const, message: "The gateway hit an internal error. Retry the request." },
    }),
    excludeCurrentProvider: assign(({ context, event }) => ({
      excludedProviders: context.current ? [...context.excludedProviders, context.current.providerId] : context.excludedProviders,
      lastAttemptFailure: event.type.startsWith("provider.") ? event.type : "first_byte_timeout",
      current: null,
      deliveredTokens: 0,
      deliveredBytes: 0,
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
    // Longest silence between chunks once output has started.
    streamIdleTimeout: 60_000,
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
    expectedSeq: 0,
    deliveredTokens: 0,
    deliveredBytes: 0,
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
      invoke: {
        src: "dispatchAttempt",
        input: ({ context }) => ({
          requestId: context.requestId,
          attemptN: context.nextAttemptN,
          excludedProviders: context.excludedProviders,
        }),
        onError: { target: "failed", actions: "recordDispatchError" },
      },
      on: {
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
            actions: ["countDelivered", { type: "relayChunk", params: ({ event }) => ({ frame: (event as { frame: ChunkFrame }).frame }) }],
          },
        ],
        "provider.ended": [{ guard: "endedNormally", target: "succeeded" }, { target: "attemptFailed" }],
      },
    },
    receiving: {
      after: {
        streamIdleTimeout: {
          target: "providerFailedAfterOutput",
          actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
        },
      },
      on: {
        "provider.chunk": [
          {
            guard: "seqOutOfOrder",
            target: "providerFailedAfterOutput",
            actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }],
          },
          {
            guard: "exceedsMaxTokens",
            target: "succeeded",
            actions: [{ type: "cancelAttempt", params: { reason: "gateway_timeout" } }, "markLengthLimited"],
          },
          {
            // Re-entering restarts the stall timer.
            target: "receiving",
            reenter: true,
            actions: ["countDelivered", { type: "relayChunk", params: ({ event }) => ({ frame: (event as { frame: ChunkFrame }).frame }) }],
          },
        ],
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
