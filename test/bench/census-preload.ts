// Preloaded (`bun --preload`) into the gateway and provider runtimes by `test/bench/census.ts`; not
// part of the product. On SIGUSR2 it writes the JSC heap's object counts by type and its capacity to
// `$BENCH_CENSUS_DIR/census-PID-N.json`. The processes run with the collector off
// (BUN_JSC_disableGC), so two of these bracket everything allocated in between, garbage included.
import { heapStats } from "bun:jsc";
import { writeFileSync } from "node:fs";

let taken = 0;
process.on("SIGUSR2", () => {
  const h = heapStats();
  const file = `${process.env.BENCH_CENSUS_DIR}/census-${process.pid}-${taken++}.json`;
  writeFileSync(file, JSON.stringify({ capacity: h.heapCapacity, types: h.objectTypeCounts }));
});
