// chooseProvider: which admitted session gets the next attempt (pure, table-driven), and its signals.
import { expect, test } from "bun:test";
import { Cooldowns, DEFAULT_COOLDOWN_RULES } from "../../src/gateway/cooldowns.ts";
import { RouteMemory } from "../../src/gateway/routeMemory.ts";
import { chooseProvider, expectedWaitMs, reliability, type ProviderView, type RouteChoice, type RouteOptions, type RouteSignals } from "../../src/gateway/routing.ts";

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
    "equal load: the bigger machine preferred (fewest free slots handed all traffic to small ones)",
    [view("roomy", { inFlight: 1, freeSlots: 7 }), view("tight", { inFlight: 1, freeSlots: 1 })],
    "m1",
    [],
    chose("roomy"),
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

// ---- cooldowns, sticky, spread, policies (docs/routing.md) ----

const sig = (over: Partial<RouteSignals> = {}): RouteSignals => ({
  health: "healthy",
  ttftMs: null,
  recentShare: 0,
  verified: 0,
  quarantined: 0,
  recentFailures: 0,
  ...over,
});
const withSignals = (entries: Record<string, Partial<RouteSignals>>, more: RouteOptions = {}): RouteOptions => ({
  ...more,
  signals: new Map(Object.entries(entries).map(([id, s]) => [id, sig(s)])),
});

test("a provider in cooldown is chosen only when no other can take the request", () => {
  const providers = [view("cool", { inFlight: 3 }), view("ok")];
  const choice = chooseProvider(providers, "m1", [], withSignals({ cool: { health: "cooling" } }));
  expect(choice.ok && [choice.provider.providerId, choice.lastResort]).toEqual(["ok", false]);
  const alone = chooseProvider([view("cool")], "m1", [], withSignals({ cool: { health: "cooling" } }));
  expect(alone.ok && [alone.provider.providerId, alone.lastResort]).toEqual(["cool", true]);
  const trialRunning = chooseProvider(providers, "m1", [], withSignals({ cool: { health: "trial" } }));
  expect(trialRunning.ok && trialRunning.provider.providerId).toBe("ok");
});

test("a half-open pair is routable and its attempt is marked as the trial", () => {
  const choice = chooseProvider([view("h", { inFlight: 2 }), view("ok")], "m1", [], withSignals({ h: { health: "half_open" } }));
  expect(choice.ok && [choice.provider.providerId, choice.trial]).toEqual(["h", true]);
});

test("the sticky provider wins when it can take the request, and never fails one", () => {
  const providers = [view("busy", { inFlight: 3 }), view("pinned")];
  const hit = chooseProvider(providers, "m1", [], { stickyProviderId: "pinned" });
  expect(hit.ok && [hit.provider.providerId, hit.sticky]).toEqual(["pinned", true]);
  const full = chooseProvider([view("busy", { inFlight: 3 }), view("pinned", { freeSlots: 0 })], "m1", [], { stickyProviderId: "pinned" });
  expect(full.ok && [full.provider.providerId, full.sticky]).toEqual(["busy", false]);
  const cold = chooseProvider([view("busy"), view("pinned", { warmModels: ["m2"] })], "m1", [], { stickyProviderId: "pinned" });
  expect(cold.ok && cold.provider.providerId).toBe("busy");
  const cooling = chooseProvider(providers, "m1", [], withSignals({ pinned: { health: "cooling" } }, { stickyProviderId: "pinned" }));
  expect(cooling.ok && cooling.provider.providerId).toBe("busy");
  const gone = chooseProvider([view("busy")], "m1", [], { stickyProviderId: "pinned" });
  expect(gone.ok && gone.provider.providerId).toBe("busy");
});

test("the outside probe: an 8-slot provider no longer wins 60 of 60 requests over two idle 32-slot ones", () => {
  const memory = new RouteMemory(new Cooldowns(DEFAULT_COOLDOWN_RULES, () => 0));
  const fleet = [
    view("small", { freeSlots: 8, maxConcurrency: 8 }),
    view("big-1", { freeSlots: 32, maxConcurrency: 32 }),
    view("big-2", { freeSlots: 32, maxConcurrency: 32 }),
  ];
  const wins = new Map<string, number>();
  for (let i = 0; i < 60; i++) {
    const choice = chooseProvider(fleet, "m1", [], { signals: memory.signals("m1", fleet.map((p) => p.providerId)) });
    if (!choice.ok) throw new Error("no choice");
    memory.dispatched(choice.provider.providerId, "m1");
    wins.set(choice.provider.providerId, (wins.get(choice.provider.providerId) ?? 0) + 1);
  }
  // Spread bound 2 × capacity share: small ≤ 2 × 8/72 of recent dispatches.
  expect(wins.get("small") ?? 0).toBeLessThanOrEqual(Math.ceil(60 * (2 * 8) / 72));
  expect((wins.get("big-1") ?? 0) + (wins.get("big-2") ?? 0)).toBeGreaterThanOrEqual(45);
});

test("a provider hoarding a model's recent dispatches sits out while another can serve", () => {
  const providers = [view("hog", { inFlight: 5, freeSlots: 3, maxConcurrency: 8 }), view("other", { freeSlots: 8, maxConcurrency: 8 })];
  const choice = chooseProvider(providers, "m1", [], withSignals({ hog: { recentShare: 1.01 } }, { spreadFactor: 1 }));
  expect(choice.ok && choice.provider.providerId).toBe("other");
  // Within the bound (share 0.9 ≤ 2 × 0.5): consolidation keeps the busiest.
  const within = chooseProvider(providers, "m1", [], withSignals({ hog: { recentShare: 0.9 } }));
  expect(within.ok && within.provider.providerId).toBe("hog");
});

test("consolidation puts a provider with quarantined settlements or recent failures behind trusted ones", () => {
  const providers = [view("shady", { inFlight: 3 }), view("clean")];
  const q = chooseProvider(providers, "m1", [], withSignals({ shady: { verified: 2, quarantined: 3 }, clean: { verified: 5 } }));
  expect(q.ok && q.provider.providerId).toBe("clean");
  const f = chooseProvider(providers, "m1", [], withSignals({ shady: { recentFailures: 1 } }));
  expect(f.ok && f.provider.providerId).toBe("clean");
  expect(reliability(sig())).toBe(1);
  expect(reliability(sig({ verified: 9, quarantined: 1 }))).toBeCloseTo(13 / 14);
});

test("shortest expected wait: the documented formula, and the policy picks its minimum", () => {
  const fast = view("fast", { maxConcurrency: 4, inFlight: 2, freeSlots: 2, load: { queuedJobs: 0, decodeTokensPerS: 100, outstandingOutputTokens: 400 } });
  // Nothing queued: 200 × (1 + 2/4) = 300 ms
  expect(expectedWaitMs(fast, 200)).toBe(300);
  const queued = view("queued", { maxConcurrency: 8, inFlight: 4, freeSlots: 4, load: { queuedJobs: 3, decodeTokensPerS: 50, outstandingOutputTokens: 100 } });
  // 100 × (1 + 4/8) + (3 + 1) × 1000 × 100 / (50 × 8) = 150 + 1000
  expect(expectedWaitMs(queued, 100)).toBe(1150);
  // No load report: the in-flight share alone.
  expect(expectedWaitMs(view("silent", { maxConcurrency: 4, inFlight: 2, freeSlots: 2 }), 100)).toBe(150);
  const options = withSignals({ fast: { ttftMs: 200 }, queued: { ttftMs: 100 } }, { policy: "shortest_wait" });
  const choice = chooseProvider([fast, queued], "m1", [], options);
  expect(choice.ok && choice.provider.providerId).toBe("fast");
  // Consolidation on the same fleet: "queued" is busier but saturated (jobs wait for a first token by
  // its report), so the fast one; without the report, the busier one.
  const consolidated = chooseProvider([fast, queued], "m1", [], { ...options, policy: "consolidate" });
  expect(consolidated.ok && consolidated.provider.providerId).toBe("fast");
  const unqueued = { ...queued, load: null };
  const busiest = chooseProvider([fast, unqueued], "m1", [], { ...options, policy: "consolidate" });
  expect(busiest.ok && busiest.provider.providerId).toBe("queued");
});

test("consolidation treats a machine with a job still waiting for its first token as saturated, by report or by the gateway's count", () => {
  const busy = view("busy", { inFlight: 3, freeSlots: 5, maxConcurrency: 8 });
  const idle = view("idle", { freeSlots: 8, maxConcurrency: 8 });
  const pick = (b: ProviderView) => {
    const c = chooseProvider([b, idle], "m1", []);
    return c.ok && c.provider.providerId;
  };
  expect(pick(busy)).toBe("busy");
  expect(pick({ ...busy, awaitingFirstByte: 1 })).toBe("idle");
  expect(pick({ ...busy, load: { queuedJobs: 1, decodeTokensPerS: 10, outstandingOutputTokens: 10 } })).toBe("idle");
  // Saturated ones still serve when nothing else can.
  const alone = chooseProvider([{ ...busy, awaitingFirstByte: 3 }], "m1", []);
  expect(alone.ok && alone.provider.providerId).toBe("busy");
  // Observed TTFT over 3 × the pool's median: saturated too.
  const slow = chooseProvider([busy, idle, view("other")], "m1", [], withSignals({ busy: { ttftMs: 1_000 }, idle: { ttftMs: 200 }, other: { ttftMs: 300 } }));
  expect(slow.ok && slow.provider.providerId).toBe("idle");
});

test("shortest expected wait divides by reliability: an unreliable fast provider loses to a steady one", () => {
  const a = view("flaky");
  const b = view("steady");
  const choice = chooseProvider([a, b], "m1", [], withSignals({ flaky: { ttftMs: 100, recentFailures: 2 }, steady: { ttftMs: 300 } }, { policy: "shortest_wait" }));
  expect(choice.ok && choice.provider.providerId).toBe("steady");
});
