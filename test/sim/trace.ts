// A run's event trace (what `bun run sim --seed S` prints) and its counts of injected faults.
import type { SimClock } from "./clock.ts";

export class Trace {
  readonly lines: string[] = [];
  constructor(private readonly clock: SimClock) {}
  add(line: string): void {
    this.lines.push(`${String(this.clock.monotonic()).padStart(7)} ${line}`);
  }
}

export class FaultCounter {
  readonly counts = new Map<string, number>();
  count(kind: string): void {
    this.counts.set(kind, (this.counts.get(kind) ?? 0) + 1);
  }
  /** Adds another run's counts into these. */
  merge(other: FaultCounter | Map<string, number>): void {
    for (const [k, v] of other instanceof FaultCounter ? other.counts : other) this.counts.set(k, (this.counts.get(k) ?? 0) + v);
  }
}
