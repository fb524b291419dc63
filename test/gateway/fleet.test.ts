// The fleet simulation (test/support/fleet.ts) on SimulatedClock: the routing policies on 20 providers of
// mixed speeds, and hedging on fleets with slow providers. Figures over three seeds: docs/routing.md
// (`bun test/bench/fleet.ts` prints them).
import { expect, test } from "bun:test";
import { fleetWithHiccups, fleetWithSlowTenth, mixedFleet, simulateFleet } from "../support/fleet.ts";

const REQUESTS = 2_000;

test("shortest expected wait cuts the TTFT tail; consolidation leaves more machines idle; nobody takes all the traffic", () => {
  const consolidate = simulateFleet({ seed: 1, providers: mixedFleet(), policy: "consolidate", arrivalsPerS: 6, requests: REQUESTS });
  const shortest = simulateFleet({ seed: 1, providers: mixedFleet(), policy: "shortest_wait", arrivalsPerS: 6, requests: REQUESTS });
  for (const r of [consolidate, shortest]) {
    expect(r.served + r.unserved).toBe(REQUESTS);
    expect(r.unserved).toBe(0);
    expect(Math.max(...r.byProvider.values())).toBeLessThan(0.25 * REQUESTS);
  }
  expect(shortest.p99).toBeLessThan(consolidate.p99);
  expect(shortest.p99).toBeLessThan(1_000);
  expect(consolidate.idleShare).toBeGreaterThan(shortest.idleShare + 0.1);
  // The slow machines (2 slots, 1.2 s to first token) get little under shortest wait.
  const slow = [...shortest.byProvider].filter(([id]) => id.startsWith("slow-")).reduce((n, [, v]) => n + v, 0);
  expect(slow).toBeLessThan(0.02 * REQUESTS);
});

test("the same seed gives the same run", () => {
  const a = simulateFleet({ seed: 7, providers: mixedFleet(), policy: "shortest_wait", arrivalsPerS: 5, requests: 500 });
  const b = simulateFleet({ seed: 7, providers: mixedFleet(), policy: "shortest_wait", arrivalsPerS: 5, requests: 500 });
  expect(a.ttftMs).toEqual(b.ttftMs);
});

test("hedging after 1 s cuts the p99 TTFT where slowness cannot be routed around, within its 5 % share", () => {
  const run = (hedge: { kind: "off" } | { kind: "fixed"; afterMs: number }) =>
    simulateFleet({ seed: 1, providers: fleetWithHiccups(), policy: "consolidate", arrivalsPerS: 4, requests: REQUESTS, hedge, hedgeShare: 0.05 });
  const off = run({ kind: "off" });
  const on = run({ kind: "fixed", afterMs: 1_000 });
  expect(off.hedges).toBe(0);
  expect(on.hedges).toBeGreaterThan(0);
  expect(on.hedges).toBeLessThanOrEqual(1 + 0.05 * REQUESTS);
  expect(on.hedgeWins).toBeLessThanOrEqual(on.hedges);
  expect(on.p99).toBeLessThan(off.p99 / 2);
  expect(on.p50).toBeLessThan(off.p50 * 1.05);
});

test("with 10 % slow providers, routing learns to avoid them; hedging stays within its share and costs no median", () => {
  for (const policy of ["consolidate", "shortest_wait"] as const) {
    const run = (hedge: { kind: "off" } | { kind: "adaptive" }) =>
      simulateFleet({ seed: 1, providers: fleetWithSlowTenth(), policy, arrivalsPerS: 4, requests: REQUESTS, hedge, hedgeShare: 0.05 });
    const off = run({ kind: "off" });
    const on = run({ kind: "adaptive" });
    const slowServed = [...off.byProvider].filter(([id]) => id.startsWith("slow-")).reduce((n, [, v]) => n + v, 0);
    expect(slowServed).toBeLessThan(0.05 * REQUESTS);
    expect(off.p99).toBeLessThan(1_000);
    expect(on.hedges).toBeLessThanOrEqual(1 + 0.05 * REQUESTS);
    expect(on.p50).toBeLessThan(off.p50 * 1.05);
    expect(on.p99).toBeLessThan(1_000);
  }
});
