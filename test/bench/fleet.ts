// Prints the fleet simulation's figures for docs/routing.md: median and p99 TTFT per routing policy on
// 20 providers of mixed speeds, and hedging off/on with 10 % slow providers; mean over three seeds.
// Usage: bun test/bench/fleet.ts
import { fleetWithSlowTenth, mixedFleet, simulateFleet, type FleetOptions } from "../support/fleet.ts";

const seeds = [1, 2, 3];
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const row = (cells: (string | number)[]) => console.log(`| ${cells.join(" | ")} |`);

function runAll(options: Omit<FleetOptions, "seed">) {
  const runs = seeds.map((seed) => simulateFleet({ ...options, seed }));
  return {
    p50: Math.round(mean(runs.map((r) => r.p50))),
    p99: Math.round(mean(runs.map((r) => r.p99))),
    idle: (100 * mean(runs.map((r) => r.idleShare))).toFixed(0) + " %",
    hedges: (100 * mean(runs.map((r) => r.hedges / options.requests))).toFixed(1) + " %",
    unserved: runs.reduce((n, r) => n + r.unserved, 0),
  };
}

console.log("Policies, 20 providers of mixed speeds, 3,000 requests a run\n");
row(["arrivals/s", "policy", "TTFT p50 ms", "TTFT p99 ms", "provider idle share", "unserved"]);
row(["---", "---", "---", "---", "---", "---"]);
for (const rate of [3, 6]) {
  for (const policy of ["consolidate", "shortest_wait"] as const) {
    const r = runAll({ providers: mixedFleet(), policy, arrivalsPerS: rate, requests: 3_000 });
    row([rate, policy, r.p50, r.p99, r.idle, r.unserved]);
  }
}
console.log("\nHedging, 20 providers of which 10 % have slow episodes, 3,000 requests a run, hedge share cap 5 %\n");
row(["arrivals/s", "policy", "hedging", "TTFT p50 ms", "TTFT p99 ms", "hedged", "unserved"]);
row(["---", "---", "---", "---", "---", "---", "---"]);
for (const rate of [3, 5]) {
  for (const policy of ["consolidate", "shortest_wait"] as const) {
    for (const hedge of [{ kind: "off" }, { kind: "fixed", afterMs: 1_000 }, { kind: "adaptive" }] as const) {
      const r = runAll({ providers: fleetWithSlowTenth(), policy, arrivalsPerS: rate, requests: 3_000, hedge });
      row([rate, policy, hedge.kind === "fixed" ? "after 1,000 ms" : hedge.kind === "adaptive" ? "at p95" : "off", r.p50, r.p99, r.hedges, r.unserved]);
    }
  }
}
