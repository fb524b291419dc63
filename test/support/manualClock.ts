// A clock for code that takes injected timers (setTimeout/setInterval and a `now`): time moves only
// when the test calls advance(), which runs every timer that falls due, in order, at its own time.
export interface ManualClock {
  now(): number;
  timers: {
    setTimeout(fn: () => void, ms: number): unknown;
    clearTimeout(handle: unknown): void;
    setInterval(fn: () => void, ms: number): unknown;
    clearInterval(handle: unknown): void;
  };
  /** Moves time forward by `ms`, firing due timers (an interval fires once per period passed). */
  advance(ms: number): void;
  /** Timers armed and not yet fired (intervals count until cleared). */
  readonly armed: number;
}

export function manualClock(startMs = 1_000_000): ManualClock {
  let nowMs = startMs;
  let nextId = 1;
  const due = new Map<number, { at: number; fn: () => void; everyMs: number | null }>();
  const arm = (fn: () => void, ms: number, every: boolean): number => {
    const id = nextId++;
    due.set(id, { at: nowMs + Math.max(0, ms), fn, everyMs: every ? Math.max(1, ms) : null });
    return id;
  };
  const clear = (handle: unknown) => void due.delete(handle as number);
  return {
    now: () => nowMs,
    timers: {
      setTimeout: (fn, ms) => arm(fn, ms, false),
      clearTimeout: clear,
      setInterval: (fn, ms) => arm(fn, ms, true),
      clearInterval: clear,
    },
    advance(ms) {
      const until = nowMs + ms;
      for (;;) {
        let nextIdDue: number | null = null;
        for (const [id, t] of due) if (t.at <= until && (nextIdDue === null || t.at < due.get(nextIdDue)!.at)) nextIdDue = id;
        if (nextIdDue === null) break;
        const timer = due.get(nextIdDue)!;
        nowMs = timer.at;
        if (timer.everyMs === null) due.delete(nextIdDue);
        else timer.at += timer.everyMs;
        timer.fn();
      }
      nowMs = until;
    },
    get armed() {
      return due.size;
    },
  };
}
