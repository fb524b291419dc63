// chooseProvider: which admitted session gets the next attempt (pure, table-driven).
import { expect, test } from "bun:test";
import { chooseProvider, type ProviderView, type RouteChoice } from "../../src/gateway/routing.ts";

const view = (providerId: string, over: Partial<ProviderView> = {}): ProviderView => ({
  sessionId: `sess-${providerId}`,
  providerId,
  tier: "provisional",
  state: "ready",
  warmModels: ["m1"],
  freeSlots: 1,
  inFlight: 0,
  ...over,
});

const chose = (providerId: string) => ({ ok: true, providerId });
const refused = (code: "model_not_available" | "coordinator_unavailable") => ({ ok: false, code });
const summary = (c: RouteChoice) => (c.ok ? { ok: true, providerId: c.provider.providerId } : { ok: false, code: c.code });

test.each<[string, ProviderView[], string, string[], ReturnType<typeof chose> | ReturnType<typeof refused>]>([
  ["the only ready provider", [view("a")], "m1", [], chose("a")],
  ["pinned before provisional", [view("prov"), view("pin", { tier: "pinned" })], "m1", [], chose("pin")],
  [
    "pinned before provisional even when the provisional one is busier",
    [view("prov", { inFlight: 5, freeSlots: 1 }), view("pin", { tier: "pinned", freeSlots: 8 })],
    "m1",
    [],
    chose("pin"),
  ],
  [
    "provisional when every pinned one is full",
    [view("pin", { tier: "pinned", freeSlots: 0, inFlight: 2 }), view("prov")],
    "m1",
    [],
    chose("prov"),
  ],
  [
    "busiest with a free slot preferred",
    [view("idle", { inFlight: 0, freeSlots: 4 }), view("busiest", { inFlight: 3, freeSlots: 1 }), view("mid", { inFlight: 1, freeSlots: 3 })],
    "m1",
    [],
    chose("busiest"),
  ],
  [
    "equal load: fewer free slots preferred",
    [view("roomy", { inFlight: 1, freeSlots: 7 }), view("tight", { inFlight: 1, freeSlots: 1 })],
    "m1",
    [],
    chose("tight"),
  ],
  ["full tie: lowest provider id, whatever the order", [view("b"), view("a"), view("c")], "m1", [], chose("a")],
  ["excluded providers skipped", [view("a", { inFlight: 2 }), view("b")], "m1", ["a"], chose("b")],
  ["excluded pinned provider falls back to provisional", [view("pin", { tier: "pinned" }), view("prov")], "m1", ["pin"], chose("prov")],
  ["only providers warm for the model", [view("a", { warmModels: ["m2"] }), view("b", { warmModels: ["m1", "m2"] })], "m1", [], chose("b")],
  ["asleep never chosen", [view("a", { state: "asleep", inFlight: 9 }), view("b")], "m1", [], chose("b")],
  ["draining never chosen", [view("a", { state: "draining", inFlight: 9 }), view("b")], "m1", [], chose("b")],
  ["busy never chosen", [view("a", { state: "busy", inFlight: 9 }), view("b")], "m1", [], chose("b")],
  ["a ready view with no free slot is not chosen", [view("a", { freeSlots: 0, inFlight: 9 }), view("b")], "m1", [], chose("b")],
  ["no providers at all → model_not_available", [], "m1", [], refused("model_not_available")],
  ["unknown model → model_not_available", [view("a"), view("b", { warmModels: ["m2"] })], "nope", [], refused("model_not_available")],
  ["known model, only asleep → coordinator_unavailable", [view("a", { state: "asleep" })], "m1", [], refused("coordinator_unavailable")],
  ["known model, only draining → coordinator_unavailable", [view("a", { state: "draining" })], "m1", [], refused("coordinator_unavailable")],
  [
    "known model, no free slot → coordinator_unavailable",
    [view("a", { state: "busy", freeSlots: 0 }), view("b", { freeSlots: 0 })],
    "m1",
    [],
    refused("coordinator_unavailable"),
  ],
  ["known model, every provider excluded → coordinator_unavailable", [view("a"), view("b")], "m1", ["a", "b"], refused("coordinator_unavailable")],
])("%s", (_, providers, model, excluded, expected) => {
  expect(summary(chooseProvider(providers, model, excluded))).toEqual(expected);
});

test("accepts any iterable and returns the chosen view itself", () => {
  const b = view("b", { inFlight: 1 });
  function* views() {
    yield view("a");
    yield b;
  }
  const choice = chooseProvider(views(), "m1", []);
  expect(choice.ok && choice.provider).toBe(b);
});

test("excluding one provider id skips all of its sessions", () => {
  const choice = chooseProvider([view("a", { sessionId: "s1" }), view("a", { sessionId: "s2" }), view("b")], "m1", ["a"]);
  expect(summary(choice)).toEqual(chose("b"));
});
