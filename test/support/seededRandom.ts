// A seeded generator for generated test cases, so a failure names its seed and reproduces: the
// runtime's own mulberry32 (src/provider/synthetic.ts) with integer and pick helpers.
import { prng } from "../../src/provider/synthetic.ts";

export function rng(seed: number) {
  const next = prng(seed);
  const int = (n: number) => Math.floor(next() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
  return { next, int, pick };
}
export type Rng = ReturnType<typeof rng>;
