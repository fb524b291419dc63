// Ids the gateway makes: sessions (random) and requests (time-ordered, random-suffixed).
/** prefix + 24 random hex digits (session ids). */
export const hexId = (prefix: string, random: (n: number) => Uint8Array) => () => prefix + Buffer.from(random(12)).toString("hex");

/**
 * Request ids: 6 bytes of milliseconds, then 6 random bytes (24 hex digits, as before). Ids made close
 * in time sort together, so the store's request-keyed indexes grow at their right edge and one group
 * commit's rows share B-tree pages; random keys put each request on its own leaf of every index
 * (docs/benchmarks.md). Uniqueness rests on the random half (48 bits per millisecond); order is only a hint.
 */
export const timeOrderedId = (prefix: string, now: () => number, random: (n: number) => Uint8Array) => () => {
  const ms = Math.max(0, Math.floor(now())) % 2 ** 48;
  return prefix + ms.toString(16).padStart(12, "0") + Buffer.from(random(6)).toString("hex");
};
