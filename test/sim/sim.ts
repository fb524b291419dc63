// `bun run sim` — the deterministic whole-system simulation (docs/reliability.md).
//   bun run sim --seed S        one seed; prints its event trace and any violation (exit 1 on one)
//   bun run sim --seeds N       seeds 1..N (or --from F: F..F+N-1); prints figures, and the failing seeds
//   --fault-rate R              share of provider jobs with a fault (default 0.3)
import { runSeed, type SimResult } from "./world.ts";
import { FaultCounter } from "./trace.ts";

function flag(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

export interface BatchFigures {
  seeds: number;
  failed: SimResult[];
  faults: FaultCounter;
  outcomes: FaultCounter;
  checks: number;
  requests: number;
  settlements: number;
  events: number;
  seconds: number;
}

/** Runs seeds from..from+count-1 one after another; `onResult` sees each. */
export async function runSeeds(from: number, count: number, faultRate?: number, onResult?: (r: SimResult) => void): Promise<BatchFigures> {
  const started = performance.now();
  const figures: BatchFigures = { seeds: 0, failed: [], faults: new FaultCounter(), outcomes: new FaultCounter(), checks: 0, requests: 0, settlements: 0, events: 0, seconds: 0 };
  for (let seed = from; seed < from + count; seed++) {
    const result = await runSeed({ seed, faultRate });
    figures.seeds++;
    figures.faults.merge(result.faults);
    figures.outcomes.merge(result.outcomes);
    figures.checks += result.checks;
    figures.requests += result.requests;
    figures.settlements += result.settlements;
    figures.events += result.events;
    if (result.violations.length > 0) figures.failed.push(result);
    onResult?.(result);
  }
  figures.seconds = (performance.now() - started) / 1000;
  return figures;
}

if (import.meta.main) {
  const faultRate = flag("fault-rate") === undefined ? undefined : Number(flag("fault-rate"));
  const single = flag("seed");
  if (single !== undefined) {
    const result = await runSeed({ seed: Number(single), faultRate });
    for (const line of result.trace) console.log(line);
    console.log(`seed ${result.seed}: ${result.requests} requests, ${result.settlements} settlements, ${result.events} events, ${result.checks} checks`);
    console.log(`faults: ${JSON.stringify(Object.fromEntries(result.faults))}`);
    console.log(`outcomes: ${JSON.stringify(Object.fromEntries(result.outcomes))}`);
    for (const v of result.violations) console.log(`VIOLATION ${v}`);
    process.exit(result.violations.length > 0 ? 1 : 0);
  }
  const count = Number(flag("seeds") ?? "100");
  const from = Number(flag("from") ?? "1");
  const figures = await runSeeds(from, count, faultRate, (r) => {
    if (r.violations.length > 0) console.log(`seed ${r.seed} FAILED: ${r.violations.join("; ")}`);
    if (r.seed % 1000 === 0) console.log(`… seed ${r.seed}, rss ${Math.round(process.memoryUsage().rss / 1e6)} MB`);
  });
  console.log(
    JSON.stringify({
      from,
      seeds: figures.seeds,
      seconds: Math.round(figures.seconds * 10) / 10,
      seeds_per_s: Math.round((figures.seeds / figures.seconds) * 10) / 10,
      requests: figures.requests,
      settlements: figures.settlements,
      events: figures.events,
      checks: figures.checks,
      faults: Object.fromEntries([...figures.faults.counts].sort()),
      outcomes: Object.fromEntries([...figures.outcomes.counts].sort()),
      failed_seeds: figures.failed.map((r) => r.seed),
    }),
  );
  process.exit(figures.failed.length > 0 ? 1 : 0);
}
