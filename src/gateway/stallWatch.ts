// Whether this process stood still: its event loop ran no timer for a while (SIGSTOP, a paused VM, a
// long synchronous turn). A watchdog that fires on waking must not take its own stall for its peer's
// silence: what the peer sent meanwhile still waits unread in the socket (docs/protocol.md, "Gateway
// side"). One interval timer for the whole process; asking costs one clock read.

export interface StallWatch {
  /**
   * Whether the loop went `thresholdMs` or more without a tick at some point of the last `withinMs`, or
   * does now (asked on waking, before the watch's own tick ran): true either way round.
   */
  stoodStillWithin(withinMs: number): boolean;
  stop(): void;
}

export interface StallWatchOptions {
  /** A gap between two ticks this long or longer is a stall. */
  thresholdMs: number;
  /** Monotonic ms. */
  monotonic: () => number;
  /** The tick's timer (the simulation's, test/sim/); default the real one. */
  timers?: { setInterval(run: () => void, ms: number): unknown; clearInterval(handle: unknown): void };
  /** A stall just ended (told once, at the first tick after it). */
  stalled?(ms: number): void;
}

/** Ticks four times a threshold: a gap of a whole threshold is then three ticks missed, not timer jitter. */
export function watchStalls(options: StallWatchOptions): StallWatch {
  const { thresholdMs, monotonic } = options;
  const timers = options.timers ?? { setInterval: (run, ms) => setInterval(run, ms), clearInterval: (h) => clearInterval(h as ReturnType<typeof setInterval>) };
  let lastTick = monotonic();
  let lastStallEnd = -Infinity;
  const handle = timers.setInterval(() => {
    const now = monotonic();
    if (now - lastTick >= thresholdMs) {
      lastStallEnd = now;
      options.stalled?.(Math.round(now - lastTick));
    }
    lastTick = now;
  }, Math.max(10, Math.floor(thresholdMs / 4)));
  (handle as { unref?: () => void }).unref?.();
  return {
    stoodStillWithin(withinMs) {
      const now = monotonic();
      return now - lastTick >= thresholdMs || now - lastStallEnd < withinMs;
    },
    stop: () => timers.clearInterval(handle),
  };
}
