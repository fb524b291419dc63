// Reads what loop-delay-preload.ts wrote: the event-loop delay samples of one server process inside a
// window of wall-clock time (epoch ms), as percentiles.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { percentiles, type Percentiles } from "./driver.ts";

export const LOOP_PRELOAD = join(import.meta.dir, "loop-delay-preload.ts");

/** Delay samples (ms) of process `pid` between `from` and `to` (epoch ms); null when it wrote none. */
export function loopDelay(dir: string, pid: number, from: number, to: number): Percentiles | null {
  const samples = loopDelaySamples(dir, pid, from, to).map((s) => s.delay);
  return samples.length === 0 ? null : percentiles(samples);
}

/** The samples themselves, each with when it was taken (epoch ms); empty when the process wrote none. */
export function loopDelaySamples(dir: string, pid: number, from: number, to: number): { at: number; delay: number }[] {
  let text = "";
  try {
    text = readFileSync(join(dir, `loop-${pid}.jsonl`), "utf8");
  } catch {
    return [];
  }
  const samples: { at: number; delay: number }[] = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    const { t, s } = JSON.parse(line) as { t: number; s: number[] };
    for (let i = 0; i < s.length; i += 2) {
      const at = t + s[i]!;
      if (at >= from && at <= to) samples.push({ at, delay: s[i + 1]! });
    }
  }
  return samples;
}
