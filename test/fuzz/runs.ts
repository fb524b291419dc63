// How many cases each property runs. CI runs the default (a bounded count that keeps the whole file
// under a few seconds); `FUZZ_RUNS=N` raises every property to N cases (`bun run fuzz` runs ≥ 100,000
// in all). A failure prints fast-check's seed and path: `FUZZ_SEED=S` replays it.
import fc from "fast-check";

const raised = Number(process.env.FUZZ_RUNS ?? "");

/** fast-check parameters for a property whose CI count is `ciRuns`. */
export function runs(ciRuns: number): fc.Parameters<unknown> {
  const seed = process.env.FUZZ_SEED === undefined ? undefined : Number(process.env.FUZZ_SEED);
  return { numRuns: Number.isFinite(raised) && raised > 0 ? raised : ciRuns, ...(seed === undefined ? {} : { seed }) };
}
