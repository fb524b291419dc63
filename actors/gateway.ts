// actors/gateway.ts — the process supervisor: running → draining → stopped.
// It counts live requests and sessions (the registry of the actors themselves lives at the edge,
// in src/gateway/registry.ts) and decides when a draining gateway may stop.
import { assign, setup } from "xstate";

export interface GatewayContext {
  liveRequests: number;
  liveSessions: number;
}

export type GatewayEvent =
  | { type: "request.opened" }
  | { type: "request.closed" }
  | { type: "session.admitted" }
  | { type: "session.closed" }
  | { type: "gateway.drain" };

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
  },
  delays: { drainGrace: 30_000 },
}).createMachine({
  id: "gateway",
  context: { liveRequests: 0, liveSessions: 0 },
  initial: "running",
  on: {
    // Counted in every state: the HTTP route checks `running` before awaiting the body, so a request
    // can start after a drain began, and its close must not stop the gateway under another live one.
    "request.opened": { actions: "countRequestOpened" },
    "request.closed": { actions: "countRequestClosed" },
    "session.admitted": { actions: "countSessionAdmitted" },
    "session.closed": { actions: "countSessionClosed" },
  },
  states: {
    running: {
      on: {
        "gateway.drain": "draining",
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
