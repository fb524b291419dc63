// The registry's routing views and the session actor's in-flight count: views read the live count at
// once; the actor hears it at the end of a turn in which it changed, when it moves it between ready
// and busy.
import { describe, expect, test } from "bun:test";
import type { ProviderSessionEvent } from "../../actors/providerSession.ts";
import { Registry, type AttemptHandle, type SessionHandle } from "../../src/gateway/registry.ts";

/** A session actor stand-in: an admitted session with max_concurrency 2 that records its events. */
function fakeSession(sub: "ready" | "busy" = "ready") {
  const events: ProviderSessionEvent[] = [];
  const snapshot = {
    status: "active",
    value: { admitted: sub },
    context: {
      hello: { provider_id: "p1", max_concurrency: 2 },
      tier: "pinned",
      models: [{ model_id: "m" }],
      reportedCapacity: 2,
      inFlight: 0,
    },
  };
  const actor = {
    getSnapshot: () => snapshot,
    send: (event: ProviderSessionEvent) => {
      events.push(event);
      if (event.type === "attempts.counted") {
        snapshot.context.inFlight = event.inFlight;
        snapshot.value = { admitted: event.inFlight >= 2 ? "busy" : "ready" };
      }
    },
  };
  const session: SessionHandle = {
    sessionId: "s1",
    actor: actor as unknown as SessionHandle["actor"],
    send: () => {},
    close: () => {},
    attempts: new Set(),
    refusedModels: new Set(),
  };
  return { session, events };
}

function setup(sub: "ready" | "busy" = "ready") {
  const turnEnds: (() => void)[] = [];
  const registry = new Registry((run) => turnEnds.push(run));
  const { session, events } = fakeSession(sub);
  registry.sessions.set(session.sessionId, session);
  registry.admittedByProvider.set("p1", session);
  const attempt = (key: string) => ({ key, session }) as unknown as AttemptHandle;
  const endTurn = () => {
    for (const run of turnEnds.splice(0)) run();
  };
  const view = () => [...registry.providerViews()][0]!;
  return { registry, events, attempt, endTurn, view };
}

describe("registry in-flight count", () => {
  test("views count attempts at once; the actor hears one count at the end of the turn", () => {
    const { registry, events, attempt, endTurn, view } = setup();
    registry.addAttempt(attempt("a"));
    expect(view()).toMatchObject({ inFlight: 1, freeSlots: 1, state: "ready" });
    registry.addAttempt(attempt("b"));
    expect(view()).toMatchObject({ inFlight: 2, freeSlots: 0, state: "busy" });
    expect(events).toEqual([]);
    endTurn();
    expect(events).toEqual([{ type: "attempts.counted", inFlight: 2 }]);
  });

  test("a slot freed in this turn is routable in this turn, before the actor leaves busy", () => {
    const { registry, events, attempt, endTurn, view } = setup();
    registry.addAttempt(attempt("a"));
    registry.addAttempt(attempt("b"));
    endTurn();
    expect(view().state).toBe("busy");
    registry.releaseAttempt("a");
    expect(view()).toMatchObject({ inFlight: 1, freeSlots: 1, state: "ready" });
    registry.releaseAttempt("a"); // already released: no change
    endTurn();
    expect(events.at(-1)).toEqual({ type: "attempts.counted", inFlight: 1 });
    expect(events).toHaveLength(2);
  });

  test("a count that leaves the actor in its sub-state is not sent: ready stays ready", () => {
    const { registry, events, attempt, endTurn, view } = setup();
    registry.addAttempt(attempt("a"));
    endTurn(); // one of two slots taken: still ready
    registry.releaseAttempt("a");
    registry.addAttempt(attempt("b"));
    registry.releaseAttempt("b");
    endTurn();
    expect(events).toEqual([]);
    expect(view()).toMatchObject({ inFlight: 0, freeSlots: 2, state: "ready" });
  });

  test("busy and back within one turn: nothing to tell", () => {
    const { registry, events, attempt, endTurn } = setup();
    registry.addAttempt(attempt("a"));
    registry.addAttempt(attempt("b"));
    registry.releaseAttempt("b");
    endTurn();
    expect(events).toEqual([]);
  });
});
