// Hedging's pure parts: the trigger and the budget (src/gateway/hedging.ts).
import { expect, test } from "bun:test";
import fc from "fast-check";
import { ADAPTIVE_MIN_SAMPLES, HedgeBudget, hedgeDelayMs, TtftWindow } from "../../src/gateway/hedging.ts";

test("off never hedges; fixed hedges after N ms; adaptive waits for samples, then hedges at the model's p95", () => {
  const w = new TtftWindow();
  expect(hedgeDelayMs({ kind: "off" }, w, "m")).toBeNull();
  expect(hedgeDelayMs({ kind: "fixed", afterMs: 750 }, w, "m")).toBe(750);
  for (let i = 1; i < ADAPTIVE_MIN_SAMPLES; i++) w.add("m", i * 10);
  expect(hedgeDelayMs({ kind: "adaptive" }, w, "m")).toBeNull();
  w.add("m", 200);
  expect(hedgeDelayMs({ kind: "adaptive" }, w, "m")).toBe(190); // nearest rank: ceil(0.95 × 20) = 19th
  expect(hedgeDelayMs({ kind: "adaptive" }, w, "other")).toBeNull();
});

test("the window keeps the last 256 samples", () => {
  const w = new TtftWindow();
  for (let i = 0; i < 256; i++) w.add("m", 10_000);
  for (let i = 0; i < 256; i++) w.add("m", 5);
  expect(w.quantile("m", 1)).toBe(5);
});

test("hedges never exceed share × requests + the first hedge", () => {
  fc.assert(
    fc.property(fc.double({ min: 0, max: 0.5, noNaN: true }), fc.array(fc.boolean(), { maxLength: 500 }), (share, script) => {
      const budget = new HedgeBudget(share);
      for (const wantsHedge of script) {
        budget.requestStarted();
        if (wantsHedge) budget.take();
        expect(budget.hedges).toBeLessThanOrEqual(1 + share * budget.requests + 1e-9);
      }
    }),
  );
});

test("at 5 %, a long run of slow requests hedges about one in twenty", () => {
  const budget = new HedgeBudget(0.05);
  for (let i = 0; i < 10_000; i++) {
    budget.requestStarted();
    budget.take();
  }
  expect(budget.hedges).toBeGreaterThanOrEqual(499);
  expect(budget.hedges).toBeLessThanOrEqual(501);
});
