// The simulation's time: one queue of events ordered by (due time, insertion order), a monotonic clock
// that jumps to each event's due time (no real waiting), and a wall clock that may be set off from it
// (the clock-jump fault). Every gateway incarnation gets its own timer scope, so a crash drops exactly
// the timers of the process that died.
import type { GatewayTimers } from "../../src/compositionRoot.ts";

interface Event {
  at: number;
  seq: number;
  run: () => void;
  live: boolean;
  scope: TimerScope | null;
  /** An interval that lives as long as its process (the catalog poll): it does not keep a run going. */
  background: boolean;
}

/** A binary heap of events by (at, seq). */
class EventQueue {
  private readonly heap: Event[] = [];
  get size(): number {
    return this.heap.length;
  }
  push(e: Event): void {
    const h = this.heap;
    h.push(e);
    for (let i = h.length - 1; i > 0; ) {
      const p = (i - 1) >> 1;
      if (!before(h[i]!, h[p]!)) break;
      [h[p], h[i]] = [h[i]!, h[p]!];
      i = p;
    }
  }
  pop(): Event | undefined {
    const h = this.heap;
    const top = h[0];
    const last = h.pop();
    if (h.length > 0 && last) {
      h[0] = last;
      for (let i = 0; ; ) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l]!, h[m]!)) m = l;
        if (r < h.length && before(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[m], h[i]] = [h[i]!, h[m]!];
        i = m;
      }
    }
    return top;
  }
  /** Live events (those not cancelled). */
  live(): Event[] {
    return this.heap.filter((e) => e.live);
  }
}

const before = (a: Event, b: Event) => a.at < b.at || (a.at === b.at && a.seq < b.seq);

/** 2026-11-27T00:00:00Z: every run starts its wall clock here. */
export const SIM_EPOCH_MS = Date.UTC(2026, 10, 27);

export class SimClock {
  /** Monotonic simulated time (ms since the run began). */
  private t = 0;
  /** Wall clock minus monotonic time, moved by clock jumps. */
  private skew = SIM_EPOCH_MS;
  private seq = 0;
  private readonly queue = new EventQueue();

  /** Monotonic ms since the run began (what timers run on). */
  monotonic = (): number => this.t;
  /** The wall clock (Date.now's stand-in). */
  wall = (): number => this.t + this.skew;

  /** Moves the wall clock (not the timers) by `ms`, as an NTP step or a VM resume does. */
  jumpWall(ms: number): void {
    this.skew += ms;
  }

  /** Schedules `run` after `ms` (≥ 0) in `scope` (null: the world's own events). */
  at(ms: number, run: () => void, scope: TimerScope | null = null, background = false): Event {
    // Whole milliseconds, as Date.now gives.
    const e: Event = { at: this.t + Math.max(0, Number.isFinite(ms) ? Math.ceil(ms) : 0), seq: this.seq++, run, live: true, scope, background };
    this.queue.push(e);
    return e;
  }

  /** Runs the next live event, moving time to its due time; false when none is left. */
  step(): boolean {
    for (;;) {
      const e = this.queue.pop();
      if (!e) return false;
      if (!e.live) continue;
      e.live = false;
      e.scope?.armed.delete(e);
      if (e.at > this.t) this.t = e.at;
      e.run();
      return true;
    }
  }

  /** Due time of the next live event, or null. */
  nextAt(): number | null {
    let best: number | null = null;
    for (const e of this.queue.live()) if (best === null || e.at < best) best = e.at;
    return best;
  }

  /** True when nothing but background intervals is left: the run is quiet. */
  onlyBackgroundLeft(): boolean {
    return this.queue.live().every((e) => e.background);
  }

  /** Live events armed by gateway scopes (timers, end-of-turn work) — what I5 checks once quiet. */
  liveScopedEvents(): number {
    return this.queue.live().filter((e) => e.scope !== null).length;
  }

  scope(name: string): TimerScope {
    return new TimerScope(this, name);
  }
}

/** The timers of one gateway process: a GatewayTimers port over the simulated clock. */
export class TimerScope implements GatewayTimers {
  readonly armed = new Set<Event>();
  private dead = false;

  constructor(private readonly clock: SimClock, readonly name: string) {}

  setTimeout = (run: () => void, ms: number): unknown => this.arm(run, ms, false);

  private arm(run: () => void, ms: number, background: boolean): Event | null {
    if (this.dead) return null;
    const e = this.clock.at(ms, run, this, background);
    this.armed.add(e);
    return e;
  }

  clearTimeout = (handle: unknown): void => {
    const e = handle as Event | null;
    if (!e) return;
    e.live = false;
    this.armed.delete(e);
  };

  setInterval = (run: () => void, ms: number): unknown => {
    const handle: { current: unknown } = { current: null };
    const tick = () => {
      handle.current = this.arm(tick, ms, true);
      run();
    };
    handle.current = this.arm(tick, ms, true);
    return handle;
  };

  clearInterval = (handle: unknown): void => {
    this.clearTimeout((handle as { current: unknown }).current);
  };

  setImmediate = (run: () => void): void => {
    this.setTimeout(run, 0);
  };

  /** The process died: its timers never fire and it arms no new ones. */
  kill(): void {
    this.dead = true;
    for (const e of this.armed) e.live = false;
    this.armed.clear();
  }

  /** Timers armed now, other than the intervals that live as long as the process (I5). */
  pending(): number {
    let n = 0;
    for (const e of this.armed) if (!e.background) n++;
    return n;
  }
}
