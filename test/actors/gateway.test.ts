// The gateway supervisor in isolation: running → draining → stopped, by live request count or drain grace.
import { expect, test } from "bun:test";
import { createActor, SimulatedClock } from "xstate";
import { gatewayMachine, type GatewayEvent } from "../../actors/gateway.ts";

const GRACE_MS = 5_000;

function startGateway() {
  const clock = new SimulatedClock();
  const calls: ("drainProviders" | "stopServing")[] = [];
  const actor = createActor(
    gatewayMachine.provide({
      actions: {
        drainProviders: () => void calls.push("drainProviders"),
        stopServing: () => void calls.push("stopServing"),
      },
      delays: { drainGrace: GRACE_MS },
    }),
    { clock },
  ).start();
  const send = (...events: GatewayEvent["type"][]) => {
    for (const type of events) actor.send({ type });
  };
  return { actor, clock, calls, send, snapshot: () => actor.getSnapshot() };
}

test("starts running and counts requests and sessions", () => {
  const g = startGateway();
  expect(g.snapshot().value).toBe("running");
  g.send("request.opened", "request.opened", "request.closed", "session.admitted", "session.admitted", "session.closed");
  expect(g.snapshot().context).toEqual({ liveRequests: 1, liveSessions: 1 });
  expect(g.calls).toEqual([]);
});

test("counts never go below zero", () => {
  const g = startGateway();
  g.send("request.closed", "session.closed");
  expect(g.snapshot().context).toEqual({ liveRequests: 0, liveSessions: 0 });
});

test("drain with no live requests stops at once", () => {
  const g = startGateway();
  g.send("gateway.drain");
  expect(g.snapshot().value).toBe("stopped");
  expect(g.snapshot().status).toBe("done");
  expect(g.calls).toEqual(["drainProviders", "stopServing"]);
});

test("gateway.drain → draining (drainProviders) → stopped when the last request closes", () => {
  const g = startGateway();
  g.send("request.opened", "request.opened");
  g.send("gateway.drain");
  expect(g.snapshot().value).toBe("draining");
  expect(g.calls).toEqual(["drainProviders"]);

  g.send("request.closed");
  expect(g.snapshot().value).toBe("draining");
  g.send("request.closed");
  expect(g.snapshot().value).toBe("stopped");
  expect(g.calls).toEqual(["drainProviders", "stopServing"]);
});

test("a second drain while draining does not drain providers again", () => {
  const g = startGateway();
  g.send("request.opened", "gateway.drain", "gateway.drain");
  expect(g.calls).toEqual(["drainProviders"]);
});

test("drainGrace stops the gateway with requests still open", () => {
  const g = startGateway();
  g.send("request.opened", "gateway.drain");
  g.clock.increment(GRACE_MS - 1);
  expect(g.snapshot().value).toBe("draining");
  g.clock.increment(1);
  expect(g.snapshot().value).toBe("stopped");
  expect(g.snapshot().context.liveRequests).toBe(1);
  expect(g.calls).toEqual(["drainProviders", "stopServing"]);
});

test("closing the last request before the grace ends stops once, and the grace timer is gone", () => {
  const g = startGateway();
  g.send("request.opened", "gateway.drain");
  g.clock.increment(GRACE_MS / 2);
  g.send("request.closed");
  g.clock.increment(GRACE_MS);
  expect(g.calls).toEqual(["drainProviders", "stopServing"]);
});

// The HTTP route checks `accepting` (running) and only then awaits the body; a drain can land in between,
// so a request may start — and must be counted — after draining began.
test("a request that starts while draining is counted, so the gateway waits for it too", () => {
  const g = startGateway();
  g.send("request.opened", "gateway.drain");
  g.send("request.opened");
  expect(g.snapshot().context.liveRequests).toBe(2);
  g.send("request.closed");
  expect(g.snapshot().value).toBe("draining");
  g.send("request.closed");
  expect(g.snapshot().value).toBe("stopped");
});

// The server reports opens and closes only once the supervisor left `running`: the drain brings the count.
test("gateway.drain with a live count waits for that many closes", () => {
  const g = startGateway();
  g.actor.send({ type: "gateway.drain", liveRequests: 2 });
  expect(g.snapshot().value).toBe("draining");
  g.send("request.opened", "request.closed", "request.closed");
  expect(g.snapshot().value).toBe("draining");
  g.send("request.closed");
  expect(g.snapshot().value).toBe("stopped");
});

test("gateway.drain with a live count of 0 stops at once", () => {
  const g = startGateway();
  g.actor.send({ type: "gateway.drain", liveRequests: 0 });
  expect(g.snapshot().value).toBe("stopped");
  expect(g.calls).toEqual(["drainProviders", "stopServing"]);
});
