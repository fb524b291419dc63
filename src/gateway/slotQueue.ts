// The bounded admission queue: a request that finds no free slot for its model waits here, up to
// `maxWaitMs`, instead of an immediate 503. Per model, accounts take turns (round robin in the order
// they first queued) and each account's requests go in arrival order; a full queue or a wait that runs
// out answers coordinator_unavailable (docs/routing.md, Admission queue).

export interface QueueTimers {
  setTimeout(run: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

/** What one waiter's dispatch attempt found: sent, still no slot, or the request is gone. */
export type TryResult = "dispatched" | "no_slot" | "gone";

export interface QueueEntry {
  model: string;
  accountId: string;
  /** Tries to route and send the request now. */
  tryDispatch: () => TryResult;
  /** The wait ran out: answer 503. */
  expire: () => void;
}

interface Waiter extends QueueEntry {
  timer: unknown;
  done: boolean;
}

/** One model's waiters: each account's FIFO, and the accounts' turn order. */
interface ModelLine {
  byAccount: Map<string, Waiter[]>;
  turns: string[];
}

export interface SlotQueueOptions {
  maxWaitMs: number;
  maxDepth: number;
  timers: QueueTimers;
  /** Runs the pump later in this turn's end (so slots freed inside an actor's step are routed after it). */
  defer?: (run: () => void) => void;
}

export class SlotQueue {
  private readonly lines = new Map<string, ModelLine>();
  private waiting = 0;
  private pumpScheduled = false;
  /** Requests that waited and were then dispatched, and those whose wait ran out. */
  served = 0;
  expired = 0;

  constructor(private readonly options: SlotQueueOptions) {}

  get depth(): number {
    return this.waiting;
  }

  depthOf(model: string): number {
    let n = 0;
    for (const q of this.lines.get(model)?.byAccount.values() ?? []) n += q.length;
    return n;
  }

  /** Queues a request; false when the queue is full or waiting is off (the caller answers 503 now). */
  enqueue(entry: QueueEntry): boolean {
    if (this.options.maxWaitMs <= 0 || this.waiting >= this.options.maxDepth) return false;
    let line = this.lines.get(entry.model);
    if (!line) this.lines.set(entry.model, (line = { byAccount: new Map(), turns: [] }));
    let mine = line.byAccount.get(entry.accountId);
    if (!mine) {
      line.byAccount.set(entry.accountId, (mine = []));
      line.turns.push(entry.accountId);
    }
    const waiter: Waiter = { ...entry, done: false, timer: null };
    waiter.timer = this.options.timers.setTimeout(() => {
      if (waiter.done) return;
      this.remove(waiter);
      this.expired++;
      waiter.expire();
    }, this.options.maxWaitMs);
    mine.push(waiter);
    this.waiting++;
    return true;
  }

  /** A slot may have freed (an attempt released, a provider admitted or reporting): route waiters soon. */
  wake(): void {
    if (this.waiting === 0 || this.pumpScheduled) return;
    this.pumpScheduled = true;
    const run = () => {
      this.pumpScheduled = false;
      this.pump();
    };
    if (this.options.defer) this.options.defer(run);
    else queueMicrotask(run);
  }

  /** Dispatches waiters, fairly, until every model's line is empty or finds no slot. */
  pump(): void {
    for (const [model, line] of this.lines) {
      // A full round of turns that dispatched nothing ends this model's pump.
      let idle = 0;
      while (line.turns.length > 0 && idle < line.turns.length) {
        const account = line.turns[0]!;
        const mine = line.byAccount.get(account)!;
        const waiter = mine[0]!;
        const result = waiter.tryDispatch();
        if (result === "no_slot") {
          // Another account's head may fit (e.g. this one excludes the only free provider).
          line.turns.push(line.turns.shift()!);
          idle++;
          continue;
        }
        this.remove(waiter);
        if (result === "dispatched") {
          this.served++;
          idle = 0;
        }
      }
      if (line.turns.length === 0) this.lines.delete(model);
    }
  }

  private remove(waiter: Waiter): void {
    if (waiter.done) return;
    waiter.done = true;
    this.options.timers.clearTimeout(waiter.timer);
    this.waiting--;
    const line = this.lines.get(waiter.model);
    const mine = line?.byAccount.get(waiter.accountId);
    if (!line || !mine) return;
    const at = mine.indexOf(waiter);
    if (at >= 0) mine.splice(at, 1);
    const turn = line.turns.indexOf(waiter.accountId);
    if (mine.length === 0) {
      line.byAccount.delete(waiter.accountId);
      if (turn >= 0) line.turns.splice(turn, 1);
    } else if (turn === 0 && at === 0) {
      // This account was served: its next request waits for the other accounts' turns.
      line.turns.push(line.turns.shift()!);
    }
    if (line.turns.length === 0) this.lines.delete(waiter.model);
  }
}
