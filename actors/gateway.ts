// actors/gateway.ts — the process supervisor: running → draining → stopped.
// It counts live sessions, and live requests from the drain on (the registry of the actors themselves
// lives at the edge, in src/gateway/registry.ts), and decides when a draining gateway may stop.
// A running gateway is not told of each request (two events per request cost measurable CPU,
// docs/benchmarks.md): `gateway.drain` carries the live count, and the edge reports opens and closes only from then on.
import { assign, setup } from "xstate";

export interface GatewayContext {
  /** Exact once draining (the count `gateway.drain` brought, then each open and close); 0 while running. */
  liveRequests: number;
  liveSessions: number;
}

export type GatewayEvent =
  | { type: "request.opened" }
  | { type: "request.closed" }
  | { type: "session.admitted" }
  | { type: "session.closed" }
  /** `liveRequests`: the requests open at the edge now (omitted: the supervisor's own count). */
  | { type: "gateway.drain"; liveRequests?: number };

export const gatewayMachine = setup({
  types: { context: {} as GatewayContext, events: {} as GatewayEvent },
  guards: {
    idle: ({ context }) => context.liveRequests === 0,
  },
  actions: {
    // Effects, provided at the edge.
    drainProviders: () => {},
    stopServing: () => {},
    countRequestOpened: assign({ liveRequests: ({ context }) => context.liveRequests + 1 }),
    countRequestClosed: assign({ liveRequests: ({ context }) => Math.max(0, context.liveRequests - 1) }),
    countSessionAdmitted: assign({ liveSessions: ({ context }) => context.liveSessions + 1 }),
    countSessionClosed: assign({ liveSessions: ({ context }) => Math.max(0, context.liveSessions - 1) }),
    recordLiveRequests: assign({
      liveRequests: ({ context, event }) => (event.type === "gateway.drain" ? (event.liveRequests ?? context.liveRequests) : context.liveRequests),
    }),
  },
  delays: { drainGrace: 30_000 },
}).createMachine({
  id: "gateway",
  context: { liveRequests: 0, liveSessions: 0 },
  initial: "running",
  on: {
    // Counted in every state: the HTTP route checks `running` before awaiting the body, so a request
    // can start after a drain began, and its close must not stop the gateway under another live one.
    // (The server sends these only once the supervisor left `running`.)
    "request.opened": { actions: "countRequestOpened" },
    "request.closed": { actions: "countRequestClosed" },
    "session.admitted": { actions: "countSessionAdmitted" },
    "session.closed": { actions: "countSessionClosed" },
  },
  states: {
    running: {
      on: {
        "gateway.drain": { target: "draining", actions: "recordLiveRequests" },
      },
    },
    draining: {
      entry: "drainProviders",
      after: { drainGrace: "stopped" },
      always: { guard: "idle", target: "stopped" },
    },
    stopped: { type: "final", entry: "stopServing" },
  },
});

export type GatewayMachine = typeof gatewayMachine;
