// Prints the fleet simulation's figures for docs/routing.md: median and p99 TTFT per routing policy on
// 20 providers of mixed speeds, and hedging off/on on fleets with slow providers; mean over three seeds.
// Usage: bun test/bench/fleet.ts
import { fleetWithHiccups, fleetWithSlowTenth, mixedFleet, simulateFleet, type FleetOptions } from "../support/fleet.ts";

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
const hedgeModes = [{ kind: "off" }, { kind: "fixed", afterMs: 1_000 }, { kind: "adaptive" }] as const;
const hedgeLabel = (h: (typeof hedgeModes)[number]) => (h.kind === "fixed" ? "after 1,000 ms" : h.kind === "adaptive" ? "at p95" : "off");
for (const [title, fleet, rates] of [
  ["10 % slow providers (2 of 20 take ten times as long to a first token on 15 % of their jobs)", fleetWithSlowTenth, [4, 6]],
  ["every provider slow on 3 % of its jobs (ten times as long to a first token)", fleetWithHiccups, [4]],
] as const) {
  console.log(`\nHedging, ${title}, 3,000 requests a run, hedge share cap 5 %\n`);
  row(["arrivals/s", "policy", "hedging", "TTFT p50 ms", "TTFT p99 ms", "hedged", "unserved"]);
  row(["---", "---", "---", "---", "---", "---", "---"]);
  for (const rate of rates) {
    for (const policy of ["consolidate", "shortest_wait"] as const) {
      for (const hedge of hedgeModes) {
        const r = runAll({ providers: fleet(), policy, arrivalsPerS: rate, requests: 3_000, hedge });
        row([rate, policy, hedgeLabel(hedge), r.p50, r.p99, r.hedges, r.unserved]);
      }
    }
  }
}
