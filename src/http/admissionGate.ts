// Live streams first (docs/architecture.md, "Admission and live streams"): a new inference request's
// admission work (auth, body, reservation, routing, actor start, job) runs at most `perTurn` at a time
// per event-loop turn; the rest wait in arrival order and go in the next turns. Between two turns the
// loop reads its sockets, so the frames of streams already admitted are relayed between slices of a
// burst instead of behind all of it: a burst raises the new requests' time to first token, not the
// gaps of the live ones. Under overload the turns lengthen and admissions per second fall with them.
// With `maxWaitMs`, no request waits longer than that for its turn: one that did is refused at its
// turn, and a new one at once while the oldest waiting one has waited longer (503
// coordinator_unavailable, retryable): the queue, and the buyers' wait, stay bounded.

export interface AdmissionGateOptions {
  /** Admissions that may start in one turn; 0 = no limit (the gate is off). */
  perTurn: number;
  /** Refuse new requests while the oldest waiting one has waited longer than this (ms); 0 = never. */
  maxWaitMs: number;
  now: () => number;
  /** Runs `turn` in the next event-loop turn, after pending I/O (setImmediate; tests step it by hand). */
  nextTurn: (turn: () => void) => void;
}

export interface AdmissionGate {
  /** `true`: start now. Otherwise a promise: `true` when this request's turn came, `false` when it is shed. */
  enter(): true | false | Promise<boolean>;
  /** Requests waiting for a turn. */
  readonly waiting: number;
  /** Since start: requests that waited for a later turn, and requests shed. */
  readonly counts: { waited: number; shed: number };
}

interface Waiter {
  since: number;
  resolve: (go: boolean) => void;
}

/** The gate; with `perTurn` 0 every `enter` is `true`. */
export function admissionGate(o: AdmissionGateOptions): AdmissionGate {
  return o.perTurn > 0 ? new TurnGate(o) : OPEN;
}

const OPEN: AdmissionGate = { enter: () => true, waiting: 0, counts: { waited: 0, shed: 0 } };

/** One per gateway; a class so that the turn callback is made once, not per turn. */
class TurnGate implements AdmissionGate {
  /** Admissions started in the current turn. */
  private used = 0;
  private scheduled = false;
  private queue: Waiter[] = [];
  private head = 0;
  private readonly turn = () => this.nextTurn();
  readonly counts = { waited: 0, shed: 0 };

  constructor(private readonly o: AdmissionGateOptions) {}

  get waiting(): number {
    return this.queue.length - this.head;
  }

  enter(): true | false | Promise<boolean> {
    this.schedule();
    if (this.waiting === 0 && this.used < this.o.perTurn) {
      this.used++;
      return true;
    }
    const now = this.o.now();
    if (this.o.maxWaitMs > 0 && this.waiting > 0 && now - this.queue[this.head]!.since > this.o.maxWaitMs) {
      this.counts.shed++;
      return false;
    }
    this.counts.waited++;
    return new Promise<boolean>((resolve) => this.queue.push({ since: now, resolve }));
  }

  /** A new turn: waiters past `maxWaitMs` are shed, then the budget goes to the oldest ones left. */
  private nextTurn(): void {
    this.scheduled = false;
    this.used = 0;
    const oldest = this.o.maxWaitMs > 0 ? this.o.now() - this.o.maxWaitMs : -Infinity;
    while (this.head < this.queue.length && (this.used < this.o.perTurn || this.queue[this.head]!.since < oldest)) {
      const w = this.queue[this.head]!;
      this.queue[this.head++] = undefined as unknown as Waiter;
      if (w.since < oldest) {
        this.counts.shed++;
        w.resolve(false);
        continue;
      }
      this.used++;
      w.resolve(true);
    }
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    } else if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    // The budget is per turn: the count starts over next turn even when nobody waits now.
    if (this.used > 0) this.schedule();
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    this.o.nextTurn(this.turn);
  }
}
