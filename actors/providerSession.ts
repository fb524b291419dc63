// actors/providerSession.ts — one provider WebSocket:
//   handshaking{awaitingHello → awaitingAuth → admitting} → admitted{ready, busy, asleep, draining} → closed
// The session's own view of the provider (warm models, slots, reported state) lives here; job frames
// bypass the machine and go straight to the request they belong to.
import { assign, fromPromise, setup } from "xstate";
import type { HelloFrame, ModelEntry, ProviderLoad, ProviderState } from "../src/wire/frames.ts";

export type ProviderTier = "pinned" | "provisional";

export type AdmissionVerdict =
  | { admitted: true; tier: ProviderTier }
  | { admitted: false; closeCode: number; reason: string };

export interface AdmissionInput {
  sessionId: string;
  nonce: Uint8Array;
  hello: HelloFrame;
  signature: Uint8Array;
}

export interface ProviderSessionInput {
  sessionId: string;
  nonce: Uint8Array;
  heartbeatIntervalMs: number;
}

export interface ProviderSessionContext extends ProviderSessionInput {
  hello: HelloFrame | null;
  signature: Uint8Array | null;
  tier: ProviderTier | null;
  models: ModelEntry[];
  reportedState: ProviderState;
  reportedCapacity: number;
  /** The last heartbeat's load report; null when the provider does not send one. */
  reportedLoad: ProviderLoad | null;
  inFlight: number;
  drainRequested: boolean;
  closeCode: number | null;
  closeReason: string | null;
}

export type ProviderSessionEvent =
  | { type: "provider.hello"; frame: HelloFrame }
  | { type: "provider.auth"; signature: Uint8Array }
  /** `inFlight`: the gateway's attempts on this session when the report arrived (the registry's live count). */
  | { type: "provider.heartbeat"; state: ProviderState; slotsFree: number; models: ModelEntry[]; inFlight: number; load?: ProviderLoad }
  | { type: "provider.outOfTurn"; frameType: string }
  /** The session's attempts in flight, sent by the registry at the end of a turn when they move it between ready and busy. */
  | { type: "attempts.counted"; inFlight: number }
  | { type: "gateway.drain" }
  | { type: "gateway.replaced" }
  | { type: "socket.closed"; code: number };

/**
 * Free slots by the gateway's own in-flight count (authoritative), with capacity capped by
 * max_concurrency and by what the provider last reported (slots_free plus what we had in flight then),
 * so a provider can shrink its capacity without a stale report blocking finished slots.
 */
export const freeSlots = (c: ProviderSessionContext, inFlight = c.inFlight): number =>
  Math.max(0, Math.min(c.hello?.max_concurrency ?? 0, c.reportedCapacity) - inFlight);

export const providerSessionMachine = setup({
  types: {
    context: {} as ProviderSessionContext,
    events: {} as ProviderSessionEvent,
    input: {} as ProviderSessionInput,
  },
  actors: {
    // Verifies the handshake signature, bans, key binding and provisional limits, in that order.
    admitProvider: fromPromise<AdmissionVerdict, AdmissionInput>(async () => {
      throw new Error("provide admitProvider");
    }),
  },
  guards: {
    wasAdmitted: ({ event }) => (event as unknown as { output: AdmissionVerdict }).output.admitted,
    draining: ({ context }) => context.drainRequested || context.reportedState === "draining",
    asleep: ({ context }) => context.reportedState === "asleep",
    noFreeSlot: ({ context }) => freeSlots(context) === 0,
    // Provided at the edge: whether this process stood still within the heartbeat window just ended.
    gatewayStoodStill: () => false,
  },
  actions: {
    // Effects, provided at the edge.
    sendChallenge: () => {},
    sendWelcome: () => {},
    sendDrain: () => {},
    closeSocket: (_, _params: { code: number; reason: string }) => {},
    registerAdmitted: () => {},
    unregister: () => {},

    recordHello: assign(({ event }) => {
      if (event.type !== "provider.hello") return {};
      const hello = event.frame;
      return { hello, models: hello.models, reportedCapacity: hello.max_concurrency };
    }),
    recordAuth: assign(({ event }) => (event.type === "provider.auth" ? { signature: event.signature } : {})),
    recordVerdict: assign(({ event }) => {
      const verdict = (event as unknown as { output: AdmissionVerdict }).output;
      return verdict.admitted ? { tier: verdict.tier } : { closeCode: verdict.closeCode, closeReason: verdict.reason };
    }),
    recordHeartbeat: assign(({ event }) =>
      event.type === "provider.heartbeat"
        ? {
            reportedState: event.state,
            reportedCapacity: event.slotsFree + event.inFlight,
            inFlight: event.inFlight,
            models: event.models,
            reportedLoad: event.load ?? null,
          }
        : {},
    ),
    recordCount: assign({ inFlight: ({ context, event }) => (event.type === "attempts.counted" ? event.inFlight : context.inFlight) }),
    markDrainRequested: assign({ drainRequested: true }),
    recordClose: assign((_, params: { code: number; reason: string }) => ({ closeCode: params.code, closeReason: params.reason })),
  },
  delays: {
    handshakeTimeout: 10_000,
    // Eviction after 3 missed heartbeat intervals.
    heartbeatTimeout: ({ context }) => 3 * context.heartbeatIntervalMs,
  },
}).createMachine({
  id: "providerSession",
  context: ({ input }) => ({
    ...input,
    hello: null,
    signature: null,
    tier: null,
    models: [],
    reportedState: "ready",
    reportedCapacity: 0,
    reportedLoad: null,
    inFlight: 0,
    drainRequested: false,
    closeCode: null,
    closeReason: null,
  }),
  initial: "handshaking",
  on: {
    "socket.closed": ".closed",
  },
  states: {
    handshaking: {
      initial: "awaitingHello",
      after: {
        handshakeTimeout: {
          target: "closing",
          actions: { type: "recordClose", params: { code: 4002, reason: "handshake_timeout" } },
        },
      },
      on: {
        "provider.outOfTurn": { target: "closing", actions: { type: "recordClose", params: { code: 1008, reason: "out_of_turn" } } },
      },
      states: {
        awaitingHello: {
          on: { "provider.hello": { target: "awaitingAuth", actions: ["recordHello", "sendChallenge"] } },
        },
        awaitingAuth: {
          on: { "provider.auth": { target: "admitting", actions: "recordAuth" } },
        },
        admitting: {
          invoke: {
            src: "admitProvider",
            input: ({ context }) => ({
              sessionId: context.sessionId,
              nonce: context.nonce,
              hello: context.hello!,
              signature: context.signature!,
            }),
            onDone: [
              { guard: "wasAdmitted", target: "#providerSession.admitted", actions: ["recordVerdict", "registerAdmitted", "sendWelcome"] },
              { target: "#providerSession.closing", actions: "recordVerdict" },
            ],
            onError: {
              target: "#providerSession.closing",
              actions: { type: "recordClose", params: { code: 1011, reason: "internal_error" } },
            },
          },
        },
      },
    },
    admitted: {
      initial: "sorting",
      after: {
        heartbeatTimeout: [
          // The silence was this process's own (heartbeats sent meanwhile wait unread in the socket):
          // the provider gets a whole window from now, whichever of this timer and the socket runs first.
          { guard: "gatewayStoodStill", target: "admitted", reenter: true },
          { target: "closing", actions: { type: "recordClose", params: { code: 4012, reason: "heartbeat_timeout" } } },
        ],
      },
      on: {
        // Re-entering restarts the heartbeat timer.
        "provider.heartbeat": { target: "admitted", reenter: true, actions: "recordHeartbeat" },
        "provider.outOfTurn": { target: "closing", actions: { type: "recordClose", params: { code: 1008, reason: "out_of_turn" } } },
        // Only when the count moves the session between ready and busy, at the end of a turn
        // (src/gateway/registry.ts): routing reads the live count; an event per attempt, or per
        // turn, was a measurable share of the gateway's main thread (docs/benchmarks.md).
        "attempts.counted": { target: ".sorting", actions: "recordCount" },
        "gateway.drain": { target: ".sorting", actions: ["markDrainRequested", "sendDrain"] },
        "gateway.replaced": { target: "closing", actions: { type: "recordClose", params: { code: 4011, reason: "replaced" } } },
      },
      states: {
        // Transient: picks the sub-state that matches the latest facts.
        sorting: {
          always: [
            { guard: "draining", target: "draining" },
            { guard: "asleep", target: "asleep" },
            { guard: "noFreeSlot", target: "busy" },
            { target: "ready" },
          ],
        },
        ready: {},
        busy: {},
        asleep: {},
        draining: {},
      },
    },
    closing: {
      entry: { type: "closeSocket", params: ({ context }) => ({ code: context.closeCode ?? 1000, reason: context.closeReason ?? "" }) },
      always: "closed",
    },
    closed: { type: "final", entry: "unregister" },
  },
});

export type ProviderSessionMachine = typeof providerSessionMachine;
