// Reads the gateway's own overhead histogram (gateway_overhead_seconds, src/metrics.ts) from /metrics:
// bucket counts per `stream` label, differences between two scrapes, and quantiles interpolated
// within a bucket the way Prometheus' histogram_quantile does.

export type Buckets = Map<number, number>; // upper bound (s) → cumulative count

export async function scrapeOverhead(baseUrl: string): Promise<Record<string, Buckets>> {
  const text = await (await fetch(`${baseUrl}/metrics`)).text();
  const out: Record<string, Buckets> = {};
  const re = /^gateway_overhead_seconds_bucket\{([^}]*)\}\s+(\S+)$/gm;
  for (const m of text.matchAll(re)) {
    const labels = Object.fromEntries([...m[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1]!, x[2]!]));
    const le = labels.le === "+Inf" ? Infinity : Number(labels.le);
    (out[labels.stream ?? ""] ??= new Map()).set(le, Number(m[2]));
  }
  return out;
}

export function diffBuckets(after: Buckets | undefined, before: Buckets | undefined): Buckets {
  const out: Buckets = new Map();
  for (const [le, n] of after ?? []) out.set(le, n - (before?.get(le) ?? 0));
  return out;
}

/** The q-quantile (0..1) in seconds, linear within its bucket; NaN without observations. */
export function histogramQuantile(buckets: Buckets, q: number): number {
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  const total = buckets.get(Infinity) ?? 0;
  if (total === 0) return NaN;
  const rank = q * total;
  let prevBound = 0;
  let prevCount = 0;
  for (const le of bounds) {
    const count = buckets.get(le)!;
    if (count >= rank) {
      if (le === Infinity) return prevBound;
      return prevBound + ((le - prevBound) * (rank - prevCount)) / Math.max(1, count - prevCount);
    }
    prevBound = le;
    prevCount = count;
  }
  return prevBound;
}

export const observations = (b: Buckets): number => b.get(Infinity) ?? 0;
